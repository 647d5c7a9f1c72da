// The stb_image implementation, compiled into the ACTLAB_FUZZ build only: the executable's
// instrumented definitions take precedence over Debian's libstb.so, so the fuzzer gets coverage
// (and ASan/UBSan checks) inside the decoders that the image-folder loader trusts with user files.
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
