// A build without MPI (CMake found none, or ACTLAB_MPI=OFF): distributed training is refused with one
// line saying how to get it; everything else works as before.
#include "actlab/dist/communicator.h"

namespace actlab {

bool mpi_built() { return false; }

std::unique_ptr<Communicator> make_mpi_communicator(double) {
  ACTLAB_FAIL("--distributed needs a build with MPI: install libopenmpi-dev openmpi-bin (scripts/setup.sh does) and "
              "configure again (ACTLAB_MPI=AUTO finds it)");
}

}  // namespace actlab
