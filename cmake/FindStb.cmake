# Finds the stb single-file headers from Debian's libstb-dev (stb_image.h, stb_image_write.h).
# Defines Stb::Stb (headers plus libstb.so, which carries the implementations).
find_path(STB_INCLUDE_DIR stb_image.h PATH_SUFFIXES stb)
find_library(STB_LIBRARY stb)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Stb REQUIRED_VARS STB_INCLUDE_DIR
  FAIL_MESSAGE "stb not found: apt-get install libstb-dev (or run scripts/setup.sh)")
if(Stb_FOUND AND NOT TARGET Stb::Stb)
  add_library(Stb::Stb INTERFACE IMPORTED)
  set_target_properties(Stb::Stb PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${STB_INCLUDE_DIR})
  if(STB_LIBRARY)
    target_link_libraries(Stb::Stb INTERFACE ${STB_LIBRARY})
  endif()
endif()
