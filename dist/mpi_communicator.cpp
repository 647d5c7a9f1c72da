// The MPI communicator (dist/communicator.h): MPI_COMM_WORLD driven from one communication thread.
// Every MPI call of the process runs on that thread, so the library needs only MPI_THREAD_SERIALIZED,
// and the training thread never blocks inside MPI: it queues a collective and carries on with backward
// (dist/reducer.h). The thread drives each nonblocking collective with MPI_Test and a short sleep
// between polls, which leaves the cores to the computation (a blocking MPI call spins on a core).
// Compiled only when CMake finds MPI (ACTLAB_MPI); tested through mpirun by tests/test_dist.cpp and
// tests/cli/dist_fault.sh.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "actlab/dist/communicator.h"

namespace actlab {
namespace {

using Clock = std::chrono::steady_clock;

// CPU time of the calling thread, seconds.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// What the process does with MPI when it exits (atexit): finalize after a clean run. After a failure
// nothing: a finalize would wait for peers that are gone or stuck in a collective, and MPI_Abort makes
// Open MPI's launcher kill the job before it has forwarded this rank's last output (the error line).
// Exiting non-zero is enough: the launcher ends the job on it, and a rank still waiting for this one
// sees it gone (or times out).
bool g_failed = false;
void mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_failed) return;
  MPI_Finalize();
}

void init_mpi_once() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
#ifdef OPEN_MPI
  // Open MPI's nonblocking all-reduce (libnbc) takes a binomial tree for fewer than 4 ranks or an in-place
  // buffer, both ours: rank 0 receives every other rank's gradients and does all the sums while they wait.
  // Its ring gives each rank an equal share. Measured on 2 ranks of a 2-core VM (bench/RESULTS.md §6,
  // "Open MPI's ring for the all-reduce"): the communication thread's CPU time over 20 ResNet-18 steps fell
  // from 0.55-0.71 s to 0.27-0.53 s. A value the user set (mpirun -x, --mca) is kept.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
#endif
  int provided = 0;
  ACTLAB_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS,
               "MPI_Init_thread failed");
  ACTLAB_CHECK(provided >= MPI_THREAD_SERIALIZED, "this MPI library offers thread level ", provided,
               ", actlab needs MPI_THREAD_SERIALIZED (its collectives run on a communication thread)");
  std::atexit(mpi_at_exit);
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, text, &n);
  return std::string(text, static_cast<size_t>(n));
}

// One collective's completion, shared by the communication thread and the waiter.
struct Completion {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // empty: success
  double seconds = 0, cpu_seconds = 0;
  void finish(std::string err, double s, double cpu_s) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      error = std::move(err);
      seconds = s;
      cpu_seconds = cpu_s;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done; });
    if (!error.empty()) throw DistError(error);
  }
};

class MpiWork : public CollectiveWork {
 public:
  explicit MpiWork(std::shared_ptr<Completion> c) : c_(std::move(c)) {}
  void wait() override { c_->wait(); }
  double seconds() const override { return c_->seconds; }
  double cpu_seconds() const override { return c_->cpu_seconds; }
 private:
  std::shared_ptr<Completion> c_;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s);
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string backend() const override { return "mpi"; }
  std::unique_ptr<CollectiveWork> allreduce_sum_async(Tensor t) override;
  void allreduce(std::vector<double>& values, ReduceOp op) override;
  void broadcast(void* bytes, size_t n, int root) override;
  void fail_job_at_exit() override { g_failed = true; }

 private:
  // A job runs on the communication thread and returns its error text (empty: success).
  using Job = std::function<std::string()>;
  std::shared_ptr<Completion> post(Job job);
  void thread_main();
  // Drives a started request to completion; the error text on failure (a dead peer, an MPI error,
  // the timeout), empty on success.
  std::string complete(MPI_Request& request, const std::string& what);
  // "rank 1 (pid 4242 on node-a)" for every peer on this machine whose process is gone.
  std::string dead_peers() const;
  std::string who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(size_); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  double timeout_s_;
  std::string host_;
  std::vector<std::string> hosts_;
  std::vector<int> pids_;

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::pair<Job, std::shared_ptr<Completion>>> jobs_;
  bool stop_ = false;
  std::string failure_;  // thread only: once a collective failed, every later one fails the same way
  std::thread thread_;
};

MpiCommunicator::MpiCommunicator(double timeout_s) : timeout_s_(timeout_s) {
  init_mpi_once();
  // Until the thread starts, this (the only) thread may call MPI.
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_free(&local);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  host_ = host;
  std::vector<char> all_hosts(256 * static_cast<size_t>(size_));
  MPI_Allgather(host, 256, MPI_CHAR, all_hosts.data(), 256, MPI_CHAR, comm_);
  int pid = static_cast<int>(getpid());
  pids_.resize(static_cast<size_t>(size_));
  MPI_Allgather(&pid, 1, MPI_INT, pids_.data(), 1, MPI_INT, comm_);
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(&all_hosts[256 * static_cast<size_t>(r)]);
  thread_ = std::thread(&MpiCommunicator::thread_main, this);
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  queued_.notify_all();
  thread_.join();
  // A failed job leaves MPI in no state to free anything; the process aborts the job at exit.
  if (failure_.empty()) MPI_Comm_free(&comm_);
  else g_failed = true;
}

std::shared_ptr<Completion> MpiCommunicator::post(Job job) {
  auto c = std::make_shared<Completion>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.emplace_back(std::move(job), c);
  }
  queued_.notify_one();
  return c;
}

void MpiCommunicator::thread_main() {
  for (;;) {
    std::pair<Job, std::shared_ptr<Completion>> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const auto start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    std::string error = failure_.empty() ? job.first() : failure_;
    if (!error.empty() && failure_.empty()) {
      failure_ = error;
      g_failed = true;
    }
    job.second->finish(error, std::chrono::duration<double>(Clock::now() - start).count(),
                       thread_cpu_seconds() - cpu_start);
  }
}

std::string MpiCommunicator::dead_peers() const {
  std::string dead;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || hosts_[r] != host_) continue;
    const int pid = pids_[r];
    bool gone = kill(pid, 0) != 0 && errno == ESRCH;
    if (!gone) {  // killed but not yet reaped by the launcher: a zombie
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string field;
      for (int i = 0; i < 3 && stat >> field; ++i) {
      }
      gone = field == "Z" || field == "X";
    }
    if (gone)
      dead += (dead.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " (pid " + std::to_string(pid) + " on " +
                                            hosts_[r] + ")");
  }
  return dead;
}

std::string MpiCommunicator::complete(MPI_Request& request, const std::string& what) {
  const auto start = Clock::now();
  auto next_check = start;
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    const auto now = Clock::now();
    if (rc != MPI_SUCCESS || now >= next_check) {
      const std::string dead = dead_peers();
      if (!dead.empty()) return who() + ": " + dead + " died during " + what + "; the job cannot continue";
      if (rc != MPI_SUCCESS) return who() + ": " + what + " failed: " + mpi_error_text(rc);
      next_check = now + std::chrono::milliseconds(50);
    }
    if (done) return "";
    if (std::chrono::duration<double>(now - start).count() > timeout_s_)
      return who() + ": " + what + " did not complete within " + std::to_string(static_cast<long long>(timeout_s_)) +
             " s (--dist-timeout): another rank hung (it is alive but not taking part), or died on another "
                 "machine (one that died on this machine would be named)";
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The most one MPI_Iallreduce sums at once. Open MPI's nonblocking in-place all-reduce takes a temporary
// buffer the size of the message for every call; at 32 MiB and more glibc maps it fresh from the kernel
// each time, so every all-reduce pays first-touch page faults on all of it. Measured on a 2-core VM with
// Open MPI 4.1 (docs/distributed.md, "Buckets over 16 MiB"): one 42.6 MiB all-reduce of 2 ranks took
// 150 ms of CPU, the same bytes in 16 MiB pieces 14 ms. Smaller temporaries come back from the heap.
constexpr int64_t kMaxAllreduceBytes = int64_t{16} << 20;

std::unique_ptr<CollectiveWork> MpiCommunicator::allreduce_sum_async(Tensor t) {
  ACTLAB_CHECK(t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous(),
               "MPI all-reduce needs a contiguous f32 host tensor, got ", t.str(), " on ", t.device().str());
  auto c = post([this, t] {
    constexpr int64_t piece = kMaxAllreduceBytes / static_cast<int64_t>(sizeof(float));
    float* data = t.data<float>();
    for (int64_t first = 0; first < t.numel(); first += piece) {
      const int count = static_cast<int>(std::min(piece, t.numel() - first));
      MPI_Request request = MPI_REQUEST_NULL;
      const int rc = MPI_Iallreduce(MPI_IN_PLACE, data + first, count, MPI_FLOAT, MPI_SUM, comm_, &request);
      if (rc != MPI_SUCCESS) return who() + ": MPI_Iallreduce failed: " + mpi_error_text(rc);
      std::string error = complete(request, "an all-reduce of " + std::to_string(t.nbytes()) + " gradient bytes");
      if (!error.empty()) return error;
    }
    return std::string();
  });
  return std::make_unique<MpiWork>(std::move(c));
}

void MpiCommunicator::allreduce(std::vector<double>& values, ReduceOp op) {
  ACTLAB_CHECK(values.size() <= INT32_MAX, "all-reduce of ", values.size(), " values");
  post([this, &values, op] {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                                  op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_, &request);
    if (rc != MPI_SUCCESS) return who() + ": MPI_Iallreduce failed: " + mpi_error_text(rc);
    return complete(request, "a control all-reduce");
  })->wait();
}

void MpiCommunicator::broadcast(void* bytes, size_t n, int root) {
  ACTLAB_CHECK(n <= INT32_MAX && root >= 0 && root < size_, "broadcast of ", n, " bytes from rank ", root);
  post([this, bytes, n, root] {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibcast(bytes, static_cast<int>(n), MPI_BYTE, root, comm_, &request);
    if (rc != MPI_SUCCESS) return who() + ": MPI_Ibcast failed: " + mpi_error_text(rc);
    return complete(request, "a broadcast from rank " + std::to_string(root));
  })->wait();
}

}  // namespace

bool mpi_built() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s) {
  ACTLAB_CHECK(timeout_s > 0, "the collective timeout must be > 0 s, got ", timeout_s);
  return std::make_unique<MpiCommunicator>(timeout_s);
}

}  // namespace actlab
