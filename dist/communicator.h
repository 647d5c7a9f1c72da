// Communicator: the collectives data-parallel training needs, behind one narrow interface, so the
// gradient reducer (dist/reducer.h) and the trainer do not care whether MPI (CPU tensors, a
// communication thread) or NCCL (GPU tensors, a CUDA stream; bootstrapped over MPI) moves the bytes.
// Implementations: LocalCommunicator (one rank, below), dist/mpi_communicator.cpp, dist/nccl_communicator.cpp.
// Tested in tests/test_dist.cpp (the MPI one through mpirun).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "actlab/core/error.h"
#include "actlab/core/tensor.h"

namespace actlab {

// A collective that failed or stalled: a rank died, the network broke, or nothing arrived within the
// timeout. The message is one line naming the rank(s) concerned when they are known.
class DistError : public Error {
 public:
  explicit DistError(const std::string& what) : Error(what) {}
};

// One collective in flight, started by Communicator::allreduce_sum_async.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  // Blocks until the collective has completed on this rank (its tensor then holds the sum). Throws
  // DistError on a failure or after the communicator's timeout. Call once.
  virtual void wait() = 0;
  // After wait(): seconds the collective itself ran (from its start on the communication thread or
  // stream to its end), the figure the overlap report adds up.
  virtual double seconds() const = 0;
  // After wait(): CPU seconds the collective cost this process's host threads (the MPI communication
  // thread's copies, sums and polls); 0 where the host only queues it (NCCL's stream, one rank).
  // On ranks that share cores with the computation this, not seconds(), is what communication takes
  // from training.
  virtual double cpu_seconds() const { return 0; }
};

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Rank among the ranks on this machine (picks the GPU of a rank).
  virtual int local_rank() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl"

  // Starts summing `t` in place across ranks and returns at once. t: contiguous f32 on the device this
  // communicator serves (host for MPI), the same shape on every rank; it must stay alive and untouched
  // until the work's wait() returns. Every rank starts the same collectives in the same order.
  virtual std::unique_ptr<CollectiveWork> allreduce_sum_async(Tensor t) = 0;
  // Blocking, on host values, element by element across ranks: flags, counters, timings. Ordered with
  // the asynchronous all-reduces started before it.
  virtual void allreduce(std::vector<double>& values, ReduceOp op) = 0;
  // Blocking: rank `root`'s n bytes into every rank's `bytes`.
  virtual void broadcast(void* bytes, size_t n, int root) = 0;
  // This rank is ending with an error: exit without the finalize that would wait for the other
  // ranks; the launcher ends the job on the non-zero exit, and the ranks waiting in a collective for
  // this one see it gone.
  virtual void fail_job_at_exit() {}
};

// One process, no peers: every collective is the identity. Lets the reducer, its tests and the
// benchmark's one-rank baseline run the same code as a distributed job.
class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string backend() const override { return "local"; }
  std::unique_ptr<CollectiveWork> allreduce_sum_async(Tensor t) override;
  void allreduce(std::vector<double>&, ReduceOp) override {}
  void broadcast(void*, size_t, int) override {}
};

// Whether this build has MPI (CMake ACTLAB_MPI; dist/mpi_communicator.cpp or dist/mpi_absent.cpp).
bool mpi_built();
// MPI_COMM_WORLD as a Communicator: initialises MPI once per process (thread level SERIALIZED: every
// MPI call of the process then runs on the communicator's own thread), learns each rank's host and
// process id (so a dead peer on the same machine is named at once), and gives up on a collective after
// timeout_s seconds with a DistError. Throws Error in a build without MPI, saying how to get one.
std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s);

// Whether this build has NCCL (a CUDA build: dist/nccl_communicator.cpp or dist/nccl_absent.cpp).
bool nccl_built();
// NCCL on cuda:`device` for the tensors, `control` (an MPI communicator, or a LocalCommunicator for one
// rank) for the bootstrap (rank 0's ncclUniqueId broadcast to all) and for the host-side control collectives.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> control, int device,
                                                     double timeout_s);

}  // namespace actlab
