// A build without NCCL (no CUDA backend, or no MPI to bootstrap it): --distributed on a GPU is
// refused with one line; CPU ranks use MPI.
#include "actlab/dist/communicator.h"

namespace actlab {

bool nccl_built() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator>, int, double) {
  ACTLAB_FAIL("--distributed with --device cuda needs a build with the CUDA backend and MPI (NCCL comes with the "
              "CUDA toolkit); this build has ", mpi_built() ? "MPI but no CUDA backend" : "no MPI");
}

}  // namespace actlab
