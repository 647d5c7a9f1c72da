# Finds oneDNN from Debian's libdnnl-dev (headers in /usr/include/oneapi/dnnl, libdnnl.so).
# Defines DNNL::DNNL. Prefers the package's own config file when it ships one.
find_package(dnnl CONFIG QUIET)
if(TARGET DNNL::dnnl)
  if(NOT TARGET DNNL::DNNL)
    add_library(DNNL::DNNL INTERFACE IMPORTED)
    target_link_libraries(DNNL::DNNL INTERFACE DNNL::dnnl)
  endif()
  set(DNNL_FOUND TRUE)
  return()
endif()
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY dnnl)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DNNL REQUIRED_VARS DNNL_LIBRARY DNNL_INCLUDE_DIR
  FAIL_MESSAGE "oneDNN not found: apt-get install libdnnl-dev (or run scripts/setup.sh)")
if(DNNL_FOUND AND NOT TARGET DNNL::DNNL)
  add_library(DNNL::DNNL UNKNOWN IMPORTED)
  set_target_properties(DNNL::DNNL PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})
endif()
