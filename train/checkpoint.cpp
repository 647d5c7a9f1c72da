// Training checkpoints: the mapping of a model + optimizer + loop position onto a safetensors
// file's tensors and metadata (the file format itself is io/safetensors.h).
#include "actlab/train/checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "actlab/core/error.h"
#include "actlab/io/json.h"

namespace actlab {
namespace {

constexpr int kFormatVersion = 1;
const char* const kOptimPrefix = "optim.";  // + slot + "." + parameter name
// The file's name of one optimizer buffer: written by save, looked up by restore.
std::string optim_tensor_name(const char* slot, const std::string& param) {
  return kOptimPrefix + std::string(slot) + "." + param;
}

int64_t meta_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& s = f.metadata_value(key);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  ACTLAB_CHECK(!s.empty() && errno == 0 && *end == '\0', "checkpoint metadata '", key, "' is not an integer: '", s, "'");
  return v;
}

double meta_double(const SafetensorsFile& f, const std::string& key) {
  const std::string& s = f.metadata_value(key);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  ACTLAB_CHECK(!s.empty() && *end == '\0', "checkpoint metadata '", key, "' is not a number: '", s, "'");
  return v;
}

}  // namespace

void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const TrainState& st) {
  NamedTensors tensors;
  const auto params = model.named_parameters();
  for (const auto& p : params) tensors.emplace_back(p.first, p.second.data());
  for (const auto& b : model.named_buffers()) tensors.emplace_back(b.first, b.second);
  ACTLAB_CHECK(opt.size() == params.size(), "optimizer holds ", opt.size(), " parameters, the model ",
               params.size());
  for (const OptimStateSlot& slot : opt.state_slots())
    for (size_t i = 0; i < params.size(); ++i)
      if ((*slot.buffers)[i].defined())
        tensors.emplace_back(optim_tensor_name(slot.name, params[i].first), (*slot.buffers)[i]);
  const Metadata meta = {
      {"format", "actlab-checkpoint"},
      {"format_version", std::to_string(kFormatVersion)},
      {"model", st.model},
      {"epoch", std::to_string(st.epoch)},
      {"step_in_epoch", std::to_string(st.step_in_epoch)},
      {"global_step", std::to_string(st.global_step)},
      {"pack_step", std::to_string(st.pack_step)},
      {"seed", std::to_string(st.seed)},
      {"optimizer", opt.kind()},
      {"optimizer_steps", std::to_string(opt.steps())},
      {"optimizer_counters", opt.counters()},
      {"epoch_loss_sum", round_trip_double(st.loss_sum)},
      {"epoch_correct", std::to_string(st.correct)},
      {"epoch_seen", std::to_string(st.seen)},
      {"best_test_acc", round_trip_double(st.best_acc)},
      {"lr_schedule", st.lr_schedule},
      {"config", st.config_json},
      {"world_size", std::to_string(st.world_size)},
      {"loss_scale", round_trip_double(st.loss_scale)},
      {"loss_scale_good_steps", std::to_string(st.loss_scale_good_steps)},
      {"data", st.data_identity},
      {"epoch_wall_s", round_trip_double(st.epoch_wall_s)},
      {"log_bytes", std::to_string(st.log.bytes)},
      {"log_checksum", st.log.checksum},
  };
  write_safetensors(path, tensors, meta);
}

TrainState checkpoint_state(const SafetensorsFile& f) {
  const std::string* fmt = f.find_metadata("format");
  ACTLAB_CHECK(fmt != nullptr && *fmt == "actlab-checkpoint", "not an actlab training checkpoint (metadata 'format' ",
               fmt ? "'" + *fmt + "'" : std::string("missing"), ")");
  const int64_t version = meta_int(f, "format_version");
  ACTLAB_CHECK(version == kFormatVersion, "checkpoint format version ", version, " is not supported (this build reads ",
               kFormatVersion, ")");
  ACTLAB_CHECK(f.find_metadata("checksum") != nullptr, "checkpoint has no checksum");
  TrainState st;
  st.model = f.metadata_value("model");
  st.epoch = meta_int(f, "epoch");
  st.step_in_epoch = meta_int(f, "step_in_epoch");
  st.global_step = meta_int(f, "global_step");
  st.pack_step = static_cast<uint64_t>(meta_int(f, "pack_step"));
  st.seed = static_cast<uint64_t>(meta_int(f, "seed"));
  st.optimizer_steps = meta_int(f, "optimizer_steps");
  st.loss_sum = meta_double(f, "epoch_loss_sum");
  st.correct = meta_int(f, "epoch_correct");
  st.seen = meta_int(f, "epoch_seen");
  st.best_acc = meta_double(f, "best_test_acc");
  st.lr_schedule = f.metadata_value("lr_schedule");
  st.world_size = f.find_metadata("world_size") != nullptr ? meta_int(f, "world_size") : 1;
  st.config_json = f.metadata_value("config");
  if (f.find_metadata("loss_scale") != nullptr) {
    st.loss_scale = meta_double(f, "loss_scale");
    st.loss_scale_good_steps = meta_int(f, "loss_scale_good_steps");
  }
  if (const std::string* data = f.find_metadata("data")) st.data_identity = *data;
  if (f.find_metadata("epoch_wall_s") != nullptr) st.epoch_wall_s = meta_double(f, "epoch_wall_s");
  if (f.find_metadata("log_bytes") != nullptr) {
    st.log.bytes = meta_int(f, "log_bytes");
    st.log.checksum = f.metadata_value("log_checksum");
  }
  ACTLAB_CHECK(st.epoch >= 0 && st.step_in_epoch >= 0 && st.global_step >= 0 && st.seen >= 0 && st.epoch_wall_s >= 0,
               "checkpoint loop position is negative");
  return st;
}

void restore_checkpoint(const SafetensorsFile& f, Module& model, Optimizer* opt) {
  std::map<std::string, const Tensor*> unused;
  for (const auto& t : f.tensors) unused[t.first] = &t.second;
  // Check everything before copying anything, so a refused file leaves model and optimizer as they were.
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (destination, source)
  auto check = [](const std::string& name, const Tensor& src, const Tensor& dst) {
    ACTLAB_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape(), "checkpoint tensor '", name, "' is ",
                 dtype_name(src.dtype()), " ", shape_str(src.shape()), " but the model's is ", dtype_name(dst.dtype()),
                 " ", shape_str(dst.shape()), " (a checkpoint of another model or configuration?)");
  };
  auto need = [&](const std::string& name, const Tensor& dst) {
    const auto it = unused.find(name);
    ACTLAB_CHECK(it != unused.end(), "checkpoint has no tensor '", name, "' (a checkpoint of another model?)");
    check(name, *it->second, dst);
    copies.emplace_back(dst, it->second);
    unused.erase(it);
  };
  const auto params = model.named_parameters();
  for (const auto& p : params) need(p.first, p.second.data());
  for (const auto& b : model.named_buffers()) need(b.first, b.second);
  // The optimizer's state: (slot's buffers, parameter index, source), for opt's slots only.
  struct StateCopy {
    std::vector<Tensor>* buffers;
    size_t index;
    const Tensor* src;
  };
  std::vector<StateCopy> state;
  std::string counters;
  if (opt != nullptr) {
    const std::string* kind = f.find_metadata("optimizer");
    const std::string saved_kind = kind != nullptr ? *kind : kSgdName;  // checkpoints from before AdamW
    ACTLAB_CHECK(saved_kind == opt->kind(), "checkpoint was trained with optimizer '", saved_kind,
                 "' and this run uses '", opt->kind(), "' (--optimizer): their states do not carry over");
    ACTLAB_CHECK(opt->size() == params.size(), "optimizer holds ", opt->size(), " parameters, the model ",
                 params.size());
    for (const OptimStateSlot& slot : opt->state_slots())
      for (size_t i = 0; i < params.size(); ++i) {
        const auto it = unused.find(optim_tensor_name(slot.name, params[i].first));
        if (it == unused.end()) continue;  // that parameter had no update yet
        check(it->first, *it->second, params[i].second.data());
        state.push_back({slot.buffers, i, it->second});
        unused.erase(it);
      }
    const std::string* c = f.find_metadata("optimizer_counters");
    if (c != nullptr) counters = *c;
  } else {  // evaluation: the optimizer's part is not needed
    for (auto it = unused.begin(); it != unused.end();)
      it = it->first.rfind(kOptimPrefix, 0) == 0 ? unused.erase(it) : std::next(it);
  }
  for (const auto& u : unused) {
    ACTLAB_CHECK(u.first.rfind(kOptimPrefix, 0) != 0, "checkpoint has optimizer state '", u.first, "' that this run's ",
                 opt->kind(), " does not keep (a checkpoint of another configuration?)");
    ACTLAB_FAIL("checkpoint has tensor '", u.first, "' that the model does not (a checkpoint of another model?)");
  }
  const int64_t optimizer_steps = opt != nullptr ? meta_int(f, "optimizer_steps") : 0;
  if (opt != nullptr) opt->set_counters(counters);  // the last check: it changes nothing when it throws

  for (auto& c : copies) c.first.copy_(*c.second);
  if (opt == nullptr) return;
  for (const StateCopy& s : state) {
    const Tensor& p = params[s.index].second.data();
    Tensor& buf = (*s.buffers)[s.index];
    buf = Tensor::empty_tagged(p.shape(), MemTag::OptimState, DType::F32, p.device());
    buf.copy_(*s.src);
  }
  opt->set_steps(optimizer_steps);
}

namespace {
const char* const kBatchesTracked = "num_batches_tracked";

// "<path>." of every module that has running statistics (its buffers end in ".running_mean").
std::vector<std::string> batch_norm_prefixes(const Module& model) {
  std::vector<std::string> out;
  const std::string tail = "running_mean";
  for (const auto& b : model.named_buffers())
    if (b.first.size() >= tail.size() && b.first.compare(b.first.size() - tail.size(), tail.size(), tail) == 0)
      out.push_back(b.first.substr(0, b.first.size() - tail.size()));
  return out;
}

std::string first_few(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 4; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 4) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}
}  // namespace

void export_state_dict(const std::string& path, const Module& model, int64_t batches_tracked) {
  NamedTensors tensors;
  for (const auto& p : model.named_parameters()) tensors.emplace_back(p.first, p.second.data());
  for (const auto& b : model.named_buffers()) tensors.emplace_back(b.first, b.second);
  for (const auto& prefix : batch_norm_prefixes(model)) {
    Tensor count = Tensor::empty({}, DType::I64);
    count.data<int64_t>()[0] = batches_tracked;
    tensors.emplace_back(prefix + kBatchesTracked, count);
  }
  write_safetensors(path, tensors, {{"format", "pt"}});
}

bool is_exported_state_dict(const std::string& path) {
  // PyTorch's format tag with the entries only write_safetensors adds: a checkpoint says "actlab-checkpoint",
  // and another program's weights lack the writer's checksums.
  try {
    bool pt = false;
    int writer_keys = 0;
    for (const auto& [key, value] : read_safetensors_metadata(path)) {
      pt = pt || (key == "format" && value == "pt");
      writer_keys += is_writer_metadata_key(key);
    }
    return pt && writer_keys == 3;
  } catch (const Error&) {  // not a safetensors file at all
    return false;
  }
}

void import_state_dict(const SafetensorsFile& f, Module& model, const std::string& what) {
  std::map<std::string, const Tensor*> in_file;
  for (const auto& t : f.tensors) in_file[t.first] = &t.second;
  std::vector<std::string> missing, mismatched;
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (destination, source), all checked first
  auto need = [&](const std::string& name, const Tensor& dst) {
    const auto it = in_file.find(name);
    if (it == in_file.end()) {
      missing.push_back(name);
      return;
    }
    const Tensor& src = *it->second;
    if (src.dtype() != dst.dtype() || src.shape() != dst.shape())
      mismatched.push_back(name + ": " + dtype_name(src.dtype()) + " " + shape_str(src.shape()) + " in the file, " +
                           dtype_name(dst.dtype()) + " " + shape_str(dst.shape()) + " in the model");
    else
      copies.emplace_back(dst, &src);
    in_file.erase(it);
  };
  for (const auto& p : model.named_parameters()) need(p.first, p.second.data());
  for (const auto& b : model.named_buffers()) need(b.first, b.second);
  for (const auto& prefix : batch_norm_prefixes(model)) in_file.erase(prefix + kBatchesTracked);
  std::vector<std::string> unexpected;
  for (const auto& u : in_file) unexpected.push_back(u.first);
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string why;
    if (!missing.empty()) why += "missing " + first_few(missing);
    if (!unexpected.empty()) why += std::string(why.empty() ? "" : "; ") + "unexpected " + first_few(unexpected);
    if (!mismatched.empty()) why += std::string(why.empty() ? "" : "; ") + "wrong shape or dtype " + first_few(mismatched);
    ACTLAB_FAIL(what, " does not fit the model: ", why);
  }
  for (auto& c : copies) c.first.copy_(*c.second);
}

}  // namespace actlab
