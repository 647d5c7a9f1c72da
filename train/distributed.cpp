// DistRun (train/distributed.h).
#include "actlab/train/distributed.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "actlab/core/cuda/runtime.h"
#include "actlab/dist/sync_batch_norm.h"
#include "actlab/train/config_file.h"


namespace actlab {

DistRun::DistRun(const TrainConfig& c, Device device) : device_(device) {
  std::unique_ptr<Communicator> mpi = make_mpi_communicator(c.dist_timeout);
  if (device.is_cuda() && c.device == "cuda") {  // no index given: one GPU per rank on each machine
    cuda_init();
    device_ = Device::cuda(mpi->local_rank() % std::max(1, cuda_device_count()));
  }
  comm_ = device_.is_cuda() ? make_nccl_communicator(std::move(mpi), device_.index, c.dist_timeout) : std::move(mpi);
  rank_ = comm_->rank();
  world_ = comm_->world_size();
}

std::string DistRun::who() const {
  return on() ? "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " : "";
}

void DistRun::check_same_config(const TrainConfig& config) const {
  if (!on() || world_ == 1) return;
  // Rank 0's configuration, as its JSON (a length, then the bytes), with what the table does not hold: whether
  // the run resumes or only prints its layers (each takes other collectives). --eval-only is in the table.
  const auto mode = [](const TrainConfig& c) {
    return std::string(c.resume.empty() ? "" : "resume ") + (c.summary_only ? "summary " : "");
  };
  const std::string lead = broadcast_text(mode(config) + "\n" + config_to_json(config));
  const size_t newline = lead.find('\n');
  std::string difference = config_differences(config, config_from_json(lead.substr(newline + 1)));
  if (mode(config) != lead.substr(0, newline))
    difference += std::string(difference.empty() ? "" : ", ") + "--resume/--summary '" + mode(config) +
                  "' (was '" + lead.substr(0, newline) + "')";
  const std::vector<int> differ = ranks_with(!difference.empty());
  if (differ.empty()) return;
  std::string list;
  for (const int r : differ) list += (list.empty() ? "" : ", ") + std::to_string(r);
  const char* rule = "every rank of a --distributed job must be launched with the same options (all but where it "
                     "runs and what rank 0 writes: --device, --threads, --data-workers, --data-dir, --log, ...)";
  if (difference.empty())
    ACTLAB_FAIL(differ.size() > 1 ? "ranks " : "rank ", list, differ.size() > 1 ? " were" : " was",
                " launched with other options than rank 0 (each names its differences); ", rule);
  ACTLAB_FAIL("launched with other options than rank 0: ", difference, " (rank 0's in '(was ...)'); ", rule);
}

std::string DistRun::broadcast_text(std::string text) const {
  uint64_t length = text.size();
  comm_->broadcast(&length, sizeof length, 0);
  text.resize(static_cast<size_t>(length));
  comm_->broadcast(text.data(), text.size(), 0);
  return text;
}

void DistRun::check_same_data(const std::string& identity) const {
  if (!on() || world_ == 1) return;
  const std::string lead = broadcast_text(identity);
  const std::vector<int> differ = ranks_with(identity != lead);
  if (differ.empty()) return;
  std::string list;
  for (const int r : differ) list += (list.empty() ? "" : ", ") + std::to_string(r);
  const char* rule = "every rank must read the same data set (--data-dir may differ between them, its contents may not)";
  ACTLAB_CHECK(identity == lead, "its data set has ", identity, ", rank 0's ", lead, "; ", rule);
  ACTLAB_FAIL(differ.size() > 1 ? "ranks " : "rank ", list, " read another data set than rank 0 (", lead, "); ", rule);
}

std::vector<int> DistRun::ranks_with(bool flag) const {
  const std::vector<double> flags = gather(flag ? 1.0 : 0.0);
  std::vector<int> ranks;
  for (size_t r = 0; r < flags.size(); ++r)
    if (flags[r] != 0) ranks.push_back(static_cast<int>(r));
  return ranks;
}

std::vector<double> DistRun::gather(double value) const {
  if (!on()) return {value};
  std::vector<double> slots(static_cast<size_t>(world_), 0.0);
  slots[static_cast<size_t>(rank_)] = value;  // a sum of one non-zero slot per rank is a gather
  comm_->allreduce(slots, ReduceOp::Sum);
  return slots;
}

void DistRun::sum(std::vector<double>& values) const {
  if (on()) comm_->allreduce(values, ReduceOp::Sum);
}

void DistRun::broadcast(Tensor t) const {
  Tensor host = t.to(Device::cpu()).contiguous();
  comm_->broadcast(host.raw_data(), host.nbytes(), 0);
  t.copy_(host);
}

void DistRun::broadcast_model(Module& model) const {
  if (!on() || world_ == 1) return;
  for (const auto& p : model.named_parameters()) broadcast(p.second.data());
  broadcast_buffers(model);
}

void DistRun::broadcast_buffers(Module& model) const {
  if (!on() || world_ == 1) return;
  for (const auto& b : model.named_buffers()) broadcast(b.second);
}

BatchNormTrainFn DistRun::sync_bn() const {
  Communicator* comm = comm_.get();
  ACTLAB_CHECK(comm != nullptr, "--sync-bn needs --distributed");
  return [comm](const Variable& x, const Variable& gamma, const Variable& beta, Tensor& running_mean,
                Tensor& running_var, float momentum, float eps) {
    return sync_batch_norm(x, gamma, beta, running_mean, running_var, momentum, eps, *comm);
  };
}

void DistRun::fail_job() const {
  if (on() && world_ > 1) comm_->fail_job_at_exit();
}

std::string per_rank_bytes(const std::vector<double>& bytes) {
  std::string s;
  double total = 0;
  char buf[64];
  for (size_t r = 0; r < bytes.size(); ++r) {
    std::snprintf(buf, sizeof buf, "%srank %zu %.2f MiB", r ? ", " : "", r, bytes[r] / (1024.0 * 1024.0));
    s += buf;
    total += bytes[r];
  }
  std::snprintf(buf, sizeof buf, "; total %.2f MiB", total / (1024.0 * 1024.0));
  return s + buf;
}

}  // namespace actlab
