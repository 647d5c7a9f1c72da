// The cuBLAS table of core/cuda/cublas.h: dlopen on first use, dlsym per function.
#include "actlab/core/cuda/cublas.h"

#include <dlfcn.h>

#include <string>

#include "actlab/core/error.h"

// The exported name of a cuBLAS function: the argument is macro-expanded first (cublasCreate →
// cublasCreate_v2), then stringified.
#define ACTLAB_CUBLAS_SYMBOL(fn) ACTLAB_CUBLAS_STRINGIFY(fn)
#define ACTLAB_CUBLAS_STRINGIFY(fn) #fn

// The one pointer type written by hand (cublas.h) must be the exported function's: this cast compiles
// only if some declaration of cublasGemmStridedBatchedEx has exactly that type.
static_assert(sizeof(static_cast<decltype(actlab::cuda::Cublas::gemm_strided_batched_ex)>(&cublasGemmStridedBatchedEx)) > 0);

namespace actlab::cuda {
namespace {

void* open_library() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  if (void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string why = ::dlerror();
#if defined(ACTLAB_CUBLAS_LIBRARY)
  if (void* h = ::dlopen(ACTLAB_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL)) return h;
  ACTLAB_FAIL("cannot open cuBLAS: ", why, "; nor the build's ", ACTLAB_CUBLAS_LIBRARY, ": ", ::dlerror(),
              " (put the CUDA toolkit's library folder on LD_LIBRARY_PATH)");
#else
  ACTLAB_FAIL("cannot open cuBLAS: ", why, " (put the CUDA toolkit's library folder on LD_LIBRARY_PATH)");
#endif
}

template <typename Fn>
void resolve(void* library, Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(::dlsym(library, name));
  ACTLAB_CHECK(fn != nullptr, "cuBLAS has no function ", name, " (a library older than the headers actlab was built with?)");
}

Cublas open_cublas() {
  void* library = open_library();
  Cublas api{};
#define ACTLAB_CUBLAS_RESOLVE(field, fn) resolve(library, api.field, ACTLAB_CUBLAS_SYMBOL(fn))
  ACTLAB_CUBLAS_RESOLVE(create, cublasCreate);
  ACTLAB_CUBLAS_RESOLVE(destroy, cublasDestroy);
  ACTLAB_CUBLAS_RESOLVE(set_stream, cublasSetStream);
  ACTLAB_CUBLAS_RESOLVE(get_stream, cublasGetStream);
  ACTLAB_CUBLAS_RESOLVE(set_workspace, cublasSetWorkspace);
  ACTLAB_CUBLAS_RESOLVE(set_math_mode, cublasSetMathMode);
  ACTLAB_CUBLAS_RESOLVE(sgemm, cublasSgemm);
  ACTLAB_CUBLAS_RESOLVE(sgemm_strided_batched, cublasSgemmStridedBatched);
  ACTLAB_CUBLAS_RESOLVE(gemm_strided_batched_ex, cublasGemmStridedBatchedEx);
  ACTLAB_CUBLAS_RESOLVE(status_name, cublasGetStatusName);
  ACTLAB_CUBLAS_RESOLVE(status_string, cublasGetStatusString);
#undef ACTLAB_CUBLAS_RESOLVE
  return api;  // the library is never closed: handles and kernels may live until the process ends
}

}  // namespace

const Cublas& cublas() {
  static const Cublas api = open_cublas();  // a throw leaves it unset: the next call tries again
  return api;
}

std::string cublas_status_text(cublasStatus_t status) {
  try {
    return std::string(cublas().status_name(status)) + " (" + cublas().status_string(status) + ")";
  } catch (const Error&) {
    return "status " + std::to_string(static_cast<int>(status));
  }
}

}  // namespace actlab::cuda
