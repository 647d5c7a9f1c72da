// cuBLAS, opened on first use. actlab used to link libcublas.so, and then every process that loaded
// actlab ran cuBLAS's and cuBLASLt's static initialisers at start-up, whether or not it touched a GPU:
// 0.5-1 s per process on the 2-core development machine, for `actlab-train --help` as for a CPU run
// (an empty program linked with -lcublas took 0.99-1.04 s there, without it 0.01 s). The library is
// now opened (dlopen) when the first CUDA context is made, and actlab calls it through this table: the
// functions it uses, each resolved by its exported name (cublasCreate is cublasCreate_v2, as the
// header's macros say). Tested in tests/test_cuda.cpp and, for start-up, tests/cli/startup_libraries.sh.
#pragma once
#include <cublas_v2.h>

#include <string>

namespace actlab::cuda {

struct Cublas {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasGetStream) get_stream;
  decltype(&cublasSetWorkspace) set_workspace;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm) sgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  // The exported form, with a cublasComputeType_t (the header adds a C++ overload taking a cudaDataType).
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long, const void*,
                                            cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// The table; the first call opens the library (thread-safe): its soname (libcublas.so.<major> of the
// headers built against, found through LD_LIBRARY_PATH, the binary's run path and the loader's cache),
// else the file CMake found at build time. Throws Error naming both and the loader's reason when
// neither opens or a function is missing.
const Cublas& cublas();

// "CUBLAS_STATUS_ALLOC_FAILED (resource allocation failed)" for an error message; "status 3" when the
// library cannot be opened to name it.
std::string cublas_status_text(cublasStatus_t status);

}  // namespace actlab::cuda
