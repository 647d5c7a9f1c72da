# Finds oneDNN from Debian's libdnnl-dev (headers in /usr/include/oneapi/dnnl, libdnnl.so).
# Defines DNNL::DNNL.
#
# The package's own config file (dnnl-config.cmake) is deliberately not used: Debian builds oneDNN
# with the OpenCL GPU runtime, so that config calls find_package(OpenCL REQUIRED) and fails on a
# machine without ocl-icd-opencl-dev (which libdnnl-dev only recommends). actlab uses the CPU engine
# alone and none of oneDNN's OpenCL headers (dnnl.hpp includes no CL header), so the header and the
# library are all it needs; libdnnl.so's own runtime dependency on libOpenCL.so.1 is a hard
# dependency of the Debian library package and is installed with it.
# DNNL_ROOT or CMAKE_PREFIX_PATH point at another installation.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp HINTS ${DNNL_ROOT} ENV DNNL_ROOT PATH_SUFFIXES include)
find_library(DNNL_LIBRARY dnnl HINTS ${DNNL_ROOT} ENV DNNL_ROOT PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DNNL REQUIRED_VARS DNNL_LIBRARY DNNL_INCLUDE_DIR
  FAIL_MESSAGE "oneDNN not found: apt-get install libdnnl-dev (or run scripts/setup.sh)")
if(DNNL_FOUND AND NOT TARGET DNNL::DNNL)
  add_library(DNNL::DNNL UNKNOWN IMPORTED)
  set_target_properties(DNNL::DNNL PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})
endif()
mark_as_advanced(DNNL_INCLUDE_DIR DNNL_LIBRARY)
