# The CUDA backend's part of the build (owned here so the top-level CMakeLists.txt stays short).
# actlab_cuda_sources(VAR): appends every CUDA translation unit of the library to VAR.
# actlab_cuda_link(TARGET): links cudart and (when found) cuDNN, names the cuBLAS file core/cuda/cublas.cpp
# opens at run time, and sets the feature macros.
# What the backend contains and how it is tested: docs/cuda.md.

function(actlab_cuda_sources out_var)
  file(GLOB cuda_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/core/cuda/*.cu ${PROJECT_SOURCE_DIR}/core/cuda/*.cpp)
  set(${out_var} ${${out_var}} ${cuda_sources} PARENT_SCOPE)
endfunction()

function(actlab_cuda_link target)
  target_compile_definitions(${target} PUBLIC ACTLAB_WITH_CUDA=1)
  # cuBLAS is not linked: linked, its static initialisers cost every process 0.5-1 s at start-up, GPU or
  # not (core/cuda/cublas.h). It is opened when the first CUDA context is made; this is the file to try
  # when its soname is not on the loader's path.
  target_link_libraries(${target} PUBLIC CUDA::cudart ${CMAKE_DL_LIBS})
  target_compile_definitions(${target} PRIVATE ACTLAB_CUBLAS_LIBRARY="$<TARGET_FILE:CUDA::cublas>")
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
  # A GPU host with only PyTorch's pip cuDNN passes both paths (scripts/gpu-check.sh): the library is then
  # libcudnn.so.9 (pip ships no unversioned link) and must be on LD_LIBRARY_PATH at run time.
  if(CUDNN_LIBRARY AND CUDNN_INCLUDE_DIR)
    target_include_directories(${target} PUBLIC ${CUDNN_INCLUDE_DIR})
    target_link_libraries(${target} PUBLIC ${CUDNN_LIBRARY})
    target_compile_definitions(${target} PUBLIC ACTLAB_WITH_CUDNN=1)
    message(STATUS "actlab: cuDNN ${CUDNN_LIBRARY}")
  else()
    message(WARNING "actlab: cuDNN not found (set CUDNN_LIBRARY and CUDNN_INCLUDE_DIR): conv2d on a GPU will throw")
  endif()
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endfunction()
