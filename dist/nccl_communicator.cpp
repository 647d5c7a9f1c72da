// The NCCL communicator (dist/communicator.h): gradient all-reduces on GPU tensors with NCCL, on a
// stream of its own that waits for the compute stream (an event), so the transfer of one bucket runs
// while the compute stream goes on with backward; wait() makes the compute stream wait for the
// transfer. The communicator is bootstrapped by broadcasting rank 0's ncclUniqueId over MPI, and the
// host-side control collectives (flags, counters) go over MPI too (or, for one rank, over a
// LocalCommunicator: how tests/test_cuda_dist.cpp runs it on a GPU host without MPI). Compiled in CUDA
// builds that have MPI, and in the GPU-check build; it links libnccl.so.2 (the CUDA toolkit's, or the one
// PyTorch's pip packages bring). NOTE: no NCCL communicator has run on a GPU yet (the one-rank case is
// written for the next GPU run); the CPU tests exercise the same GradReducer through MPI.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/context.h"
#include "actlab/dist/communicator.h"

namespace actlab {
namespace {

using Clock = std::chrono::steady_clock;

void check_nccl(ncclResult_t status, const char* call) {
  ACTLAB_CHECK(status == ncclSuccess, "NCCL error ", ncclGetErrorString(status), " in `", call, "`");
}
#define ACTLAB_NCCL_CHECK(call) check_nccl((call), #call)

struct EventDeleter {
  void operator()(std::remove_pointer_t<cudaEvent_t>* e) const { cudaEventDestroy(e); }
};
using Event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
Event make_event(unsigned flags) {
  cudaEvent_t e = nullptr;
  ACTLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
  return Event(e);
}

class NcclCommunicator;

class NcclWork : public CollectiveWork {
 public:
  NcclWork(NcclCommunicator& comm, Event start, Event done) : comm_(comm), start_(std::move(start)), done_(std::move(done)) {}
  void wait() override;
  double seconds() const override { return seconds_; }
 private:
  NcclCommunicator& comm_;
  Event start_, done_;
  double seconds_ = 0;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> control, int device, double timeout_s)
      : control_(std::move(control)), device_(device), timeout_s_(timeout_s) {
    cuda::DeviceGuard guard(device_);
    ncclUniqueId id{};
    if (control_->rank() == 0) ACTLAB_NCCL_CHECK(ncclGetUniqueId(&id));
    control_->broadcast(&id, sizeof id, 0);
    ACTLAB_NCCL_CHECK(ncclCommInitRank(&comm_, control_->world_size(), id, control_->rank()));
    // A throwing constructor runs no destructor: the communicator made above is released here.
    const cudaError_t created = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (created != cudaSuccess) ncclCommDestroy(comm_);
    ACTLAB_CUDA_CHECK(created);
  }
  ~NcclCommunicator() override {
    cuda::DeviceGuard guard(device_);
    if (failed_) {
      ncclCommAbort(comm_);
    } else {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return control_->rank(); }
  int world_size() const override { return control_->world_size(); }
  int local_rank() const override { return control_->local_rank(); }
  std::string backend() const override { return "nccl"; }
  void allreduce(std::vector<double>& values, ReduceOp op) override { control_->allreduce(values, op); }
  void broadcast(void* bytes, size_t n, int root) override { control_->broadcast(bytes, n, root); }
  void fail_job_at_exit() override { control_->fail_job_at_exit(); }

  std::unique_ptr<CollectiveWork> allreduce_sum_async(Tensor t) override {
    ACTLAB_CHECK(t.device().is_cuda() && t.device().index == device_ && t.dtype() == DType::F32 && t.is_contiguous(),
                 "NCCL all-reduce needs a contiguous f32 tensor on cuda:", device_, ", got ", t.str(), " on ",
                 t.device().str());
    cuda::DeviceGuard guard(device_);
    // The bucket was filled on the compute stream: the transfer starts after that work.
    Event filled = make_event(cudaEventDisableTiming);
    ACTLAB_CUDA_CHECK(cudaEventRecord(filled.get(), cuda::current_stream(device_)));
    ACTLAB_CUDA_CHECK(cudaStreamWaitEvent(stream_, filled.get(), 0));
    Event start = make_event(cudaEventDefault), done = make_event(cudaEventDefault);
    ACTLAB_CUDA_CHECK(cudaEventRecord(start.get(), stream_));
    ACTLAB_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), ncclFloat, ncclSum,
                                    comm_, stream_));
    ACTLAB_CUDA_CHECK(cudaEventRecord(done.get(), stream_));
    return std::make_unique<NcclWork>(*this, std::move(start), std::move(done));
  }

  // Polls the transfer's event, and NCCL's asynchronous error state (a peer that died), until it is
  // done or the timeout passes; a failure aborts the communicator and throws.
  void wait_event(cudaEvent_t done) {
    const auto begin = Clock::now();
    for (;;) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ACTLAB_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm_, &async);
      if (queried != ncclSuccess) async = queried;  // the query itself failed: the communicator is unusable
      const std::string who = "rank " + std::to_string(rank()) + " of " + std::to_string(world_size());
      if (async != ncclSuccess && async != ncclInProgress) {
        failed_ = true;
        throw DistError(who + ": NCCL all-reduce failed: " + ncclGetErrorString(async) + " (a rank died?)");
      }
      if (std::chrono::duration<double>(Clock::now() - begin).count() > timeout_s_) {
        failed_ = true;
        throw DistError(who + ": NCCL all-reduce did not complete within " +
                        std::to_string(static_cast<long long>(timeout_s_)) + " s (--dist-timeout)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::unique_ptr<Communicator> control_;
  int device_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool failed_ = false;
};

void NcclWork::wait() {
  comm_.wait_event(done_.get());
  float ms = 0;
  ACTLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start_.get(), done_.get()));
  seconds_ = ms / 1000.0;
}

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> control, int device,
                                                     double timeout_s) {
  // One rank needs no peer to learn the id from: a LocalCommunicator serves (tests/test_cuda_dist.cpp).
  ACTLAB_CHECK(control != nullptr && (control->backend() == "mpi" || control->world_size() == 1),
               "NCCL is bootstrapped over an MPI communicator (or, for one rank, a local one)");
  return std::make_unique<NcclCommunicator>(std::move(control), device, timeout_s);
}

}  // namespace actlab
