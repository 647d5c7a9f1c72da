// The training loop: setup, steps with memory measurement, evaluation, logging, checkpoints, summary.
#include "actlab/train/trainer.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <exception>
#include <limits>
#include <filesystem>
#include <fstream>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/autograd/tape.h"
#include "actlab/compress/acgc.h"
#include "actlab/core/cuda/runtime.h"
#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/conv.h"
#endif
#include "actlab/core/precision.h"
#include "actlab/data/dataloader.h"
#include "actlab/layers/checkpoint.h"
#include "actlab/layers/layers.h"
#include "actlab/layers/optim/adamw.h"
#include "actlab/layers/optim/loss_scale.h"
#include "actlab/layers/optim/schedule.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "actlab/models/summary.h"
#include "actlab/io/checksum.h"
#include "actlab/io/files.h"
#include "actlab/dist/reducer.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/config_file.h"
#include "actlab/train/cli.h"
#include "actlab/train/distributed.h"
#include "actlab/train/guards.h"
#include "actlab/train/logging.h"
#include "actlab/train/step.h"

namespace actlab {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();  // no timed step: rate_text prints n/a
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct EvalResult {
  double loss = 0, acc = 0;
};

// The loader assembles batches in host memory; a GPU run copies each one over (through the CUDA
// allocator's pinned staging buffers), still tagged as data so it stays out of the activation measure.
Batch on_device(const Batch& host, Device device) {
  if (device.is_cpu()) return host;
  MemTagScope tag(MemTag::Data);
  Batch b;
  b.images = host.images.to(device);
  b.labels = host.labels.to(device);
  b.index = host.index;
  return b;
}

// With --distributed every rank evaluates its shard of the test split and the sums are added up, so
// every rank gets the whole split's figures and none waits for another.
// Test hook (TrainConfig::inject_nan_*): one NaN in `t`, written through a host copy so it works on
// any device.
void poison(Tensor t) {
  Tensor host = t.to(Device::cpu());
  host.data<float>()[0] = std::nanf("");
  t.copy_(host);
}

// poison_first: the test hook's NaN in the first test batch (TrainConfig::inject_nan_into "eval").
EvalResult evaluate(Module& model, DataLoader& loader, const std::string& dataset, Device device, const DistRun& dist,
                    bool poison_first = false) {
  NoGradGuard no_grad;
  model.eval();
  loader.start_epoch(0);
  Batch host_batch;
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  for (bool first = true; loader.next(host_batch); first = false) {
    if (first && poison_first) poison(host_batch.images);
    const Batch batch = on_device(host_batch, device);
    MemTagScope tag(MemTag::Activation);
    const Variable logits = model(Variable(batch.images));
    const Variable loss = cross_entropy(logits, batch.labels);
    const int64_t n = batch.labels.size(0);
    loss_sum += static_cast<double>(loss.data().item()) * static_cast<double>(n);
    correct += count_correct(logits.data(), batch.labels);
    seen += n;
  }
  model.train();
  std::vector<double> sums = {loss_sum, static_cast<double>(correct), static_cast<double>(seen)};
  dist.sum(sums);
  loss_sum = sums[0];
  correct = static_cast<int64_t>(sums[1]);
  seen = static_cast<int64_t>(sums[2]);
  ACTLAB_CHECK(seen > 0, "the ", dataset, " test split produced no batches");
  const EvalResult r{loss_sum / static_cast<double>(seen), 100.0 * static_cast<double>(correct) / static_cast<double>(seen)};
  // The --on-nonfinite guard watches training; weights whose training loss stays finite can still give
  // the test images non-finite logits (batch statistics of a tiny run), and the accuracy then means little.
  if (!std::isfinite(r.loss) && dist.lead())
    std::fprintf(stderr, "actlab-train: warning: the test loss on %s is %s: the model gives non-finite outputs on "
                 "test images, so its test accuracy (%.2f%%) means little\n", dataset.c_str(),
                 std::isnan(r.loss) ? "NaN" : "infinite", r.acc);
  return r;
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// --loss-scale with "auto" resolved: dynamic scaling is what fp16 needs, and nothing else does.
static LossScaleOptions loss_scale_options(const TrainConfig& c) {
  if (c.loss_scale != "auto") return parse_loss_scale(c.loss_scale);
  return parse_loss_scale(parse_precision(c.precision) == Precision::F16 ? "dynamic" : "none");
}

// The run's optimizer (--optimizer) over the model's parameters, at the initial learning rate (the schedule
// sets it every step), with --no-decay-norm-bias's exclusions from the weight decay.
static std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& c, const Module& model) {
  const float lr = static_cast<float>(c.lr), wd = static_cast<float>(c.weight_decay);
  std::unique_ptr<Optimizer> opt;
  if (c.optimizer == kAdamwName)
    opt = std::make_unique<AdamW>(model.parameters(),
                                  AdamwOptions{lr, static_cast<float>(c.adam_beta1), static_cast<float>(c.adam_beta2),
                                               static_cast<float>(c.adam_eps), wd});
  else
    opt = std::make_unique<Sgd>(model.parameters(), SgdOptions{lr, static_cast<float>(c.momentum), 0.f, wd, c.nesterov});
  if (c.no_decay_norm_bias) opt->set_decays(decays_but_norms_biases_embeddings(model.named_parameters()));
  return opt;
}

// The optimizer's own settings for the run's first line: "momentum 0.9" or "betas 0.9, 0.999, eps 1e-08".
static std::string optimizer_text(const TrainConfig& c) {
  char buf[96];
  if (c.optimizer == kAdamwName)
    std::snprintf(buf, sizeof buf, "betas %g, %g, eps %g", c.adam_beta1, c.adam_beta2, c.adam_eps);
  else
    std::snprintf(buf, sizeof buf, "momentum %g%s", c.momentum, c.nesterov ? " (Nesterov)" : "");
  return std::string(buf) + (c.no_decay_norm_bias ? ", no decay on biases, norms and embeddings" : "");
}

namespace {
// No two outputs on one file, and no output on a file the run reads: each would be destroyed without a
// word (a log appended to the checkpoint being resumed, an export written over best.safetensors). Paths
// are compared resolved, so "runs/a/../a/x" and a symbolic link to x are x. Resuming from the save
// directory's own last.safetensors is the usual case and is allowed: the run replaces it atomically.
void check_distinct_files(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> outputs = {{c.log_file, "--log"},
                                                              {c.memory_report, "--memory-report"},
                                                              {c.summary_json, "--summary-json"},
                                                              {c.export_weights, "--export-weights"}};
  if (!c.log_file.empty()) outputs.push_back({c.log_file + ".config.txt", "the log's configuration file"});
  if (!c.save_dir.empty() && !c.eval_only) {
    outputs.push_back({(std::filesystem::path(c.save_dir) / "last.safetensors").string(), "--save-dir's last.safetensors"});
    outputs.push_back({(std::filesystem::path(c.save_dir) / "best.safetensors").string(), "--save-dir's best.safetensors"});
  }
  check_distinct_outputs(outputs);
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {c.resume, "--resume"}, {c.init_weights, "--init-weights"}, {c.config_path, "--config"}};
  for (const auto& [output, what] : outputs) {
    if (output.empty()) continue;
    const std::string a = resolved_path(output);
    for (const auto& [path, name] : inputs) {
      const bool own_checkpoint = name == "--resume" && what.rfind("--save-dir", 0) == 0;
      // A rerun from a log's side file (a config file itself) rewrites it with the same configuration.
      const bool own_side_file = name == "--config" && what == "the log's configuration file";
      ACTLAB_CHECK(path.empty() || own_checkpoint || own_side_file || resolved_path(path) != a, what, " names the file ", name,
                   " reads ('", path, "'): it would be overwritten");
    }
  }
}
}  // namespace

void validate(const TrainConfig& c) {
  ACTLAB_CHECK(c.epochs >= 1, "epochs must be >= 1, got ", c.epochs);
  ACTLAB_CHECK(c.batch_size >= 1, "batch size must be >= 1, got ", c.batch_size);
  ACTLAB_CHECK(c.lr > 0 && std::isfinite(c.lr), "learning rate must be > 0, got ", c.lr);
  ACTLAB_CHECK(c.momentum >= 0 && c.momentum < 1, "momentum must be in [0, 1), got ", c.momentum);
  ACTLAB_CHECK(c.weight_decay >= 0, "weight decay must be >= 0, got ", c.weight_decay);
  ACTLAB_CHECK(!c.nesterov || c.momentum > 0, "--nesterov needs momentum > 0");
  check_optimizer_name(c.optimizer);
  ACTLAB_CHECK(!c.nesterov || c.optimizer == kSgdName, "--nesterov is SGD's, not ", c.optimizer, "'s");
  ACTLAB_CHECK(c.adam_beta1 >= 0 && c.adam_beta1 < 1, "--adam-beta1 must be in [0, 1), got ", c.adam_beta1);
  ACTLAB_CHECK(c.adam_beta2 >= 0 && c.adam_beta2 < 1, "--adam-beta2 must be in [0, 1), got ", c.adam_beta2);
  ACTLAB_CHECK(c.adam_eps > 0 && std::isfinite(c.adam_eps), "--adam-eps must be > 0, got ", c.adam_eps);
  ACTLAB_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1, "label smoothing must be in [0, 1), got ",
               c.label_smoothing);
  ACTLAB_CHECK(c.threads >= 1 && c.threads <= 1024, "threads must be in [1, 1024], got ", c.threads);
  Device::parse(c.device);  // the form only; whether the device exists is checked when the run starts
  parse_precision(c.precision);  // likewise: whether this machine can run it is checked at the start
  loss_scale_options(c);
  if (!c.memory_limit.empty()) parse_byte_size(c.memory_limit, "--memory-limit");
  ACTLAB_CHECK(c.warmup_epochs == 0 || (c.warmup_epochs > 0 && c.warmup_epochs < c.epochs),
               "warm-up epochs must be in [0, epochs), got ", c.warmup_epochs);
  for (const auto& [value, flag] : {std::pair{c.steps_per_epoch, "--steps-per-epoch"},
                                    std::pair{c.train_limit, "--train-limit"}, std::pair{c.test_limit, "--test-limit"}})
    ACTLAB_CHECK(value >= 0, flag, " must be >= 0 (0: no limit), got ", value);
  ACTLAB_CHECK(c.print_every >= 0, "--print-every must be >= 0 (0: about 10 lines per epoch), got ", c.print_every);
  ACTLAB_CHECK(c.step_epochs >= 1, "--step-epochs must be >= 1, got ", c.step_epochs);
  ACTLAB_CHECK(!c.sync_bn || c.distributed, "--sync-bn needs --distributed");
  // Buckets are sized in bytes as int64: 2^40 MiB is far past any model and still fits.
  constexpr double kMaxBucketMib = 1099511627776.0;
  ACTLAB_CHECK(c.bucket_mib > 0 && c.bucket_mib <= kMaxBucketMib && c.dist_timeout > 0,
               "--bucket-mib must be in (0, 2^40] and --dist-timeout > 0, got ", c.bucket_mib, " and ", c.dist_timeout);
  ACTLAB_CHECK(c.bucket_tail_mib >= 0 && c.bucket_tail_mib <= kMaxBucketMib, "--bucket-tail-mib must be in [0, 2^40], got ",
               c.bucket_tail_mib);
  ACTLAB_CHECK(!c.cifar100_coarse || c.dataset == "cifar100", "--coarse (CIFAR-100's 20 superclasses) needs --dataset ",
               "cifar100, got --dataset ", c.dataset);
  ACTLAB_CHECK(c.synthetic_size >= 1, "--synthetic-size must be >= 1, got ", c.synthetic_size);
  ACTLAB_CHECK(c.on_nonfinite == "stop" || c.on_nonfinite == "skip-step", "--on-nonfinite must be stop or skip-step, got '",
               c.on_nonfinite, "'");
  ACTLAB_CHECK(c.inject_nan_step >= 0 && c.inject_nan_count >= 1 &&
                   (c.inject_nan_into == "input" || c.inject_nan_into == "grad" || c.inject_nan_into == "eval"),
               "NaN injection hook: step >= 0, count >= 1, into input, grad or eval; got step ", c.inject_nan_step, " count ",
               c.inject_nan_count, " into '", c.inject_nan_into, "'");
  LrSchedule::parse_kind(c.schedule);
  bool known_model = false;
  for (const auto& m : model_names()) known_model = known_model || m.first == c.model;
  if (!known_model) make_model({c.model, 1, 10, 28});  // throws the list of models
  check_drop_path(c.model, c.drop_path, "--drop-path");
  check_dataset_name(c.dataset);
  ACTLAB_CHECK(c.image_size >= 1 && (c.image_channels == 1 || c.image_channels == 3),
               "--image-size must be >= 1 and --image-channels 1 or 3");
  // 0 would leave the test split empty, and every run evaluates on it.
  ACTLAB_CHECK(c.test_fraction > 0 && c.test_fraction < 1, "--test-fraction must be in (0, 1), got ", c.test_fraction);
  ACTLAB_CHECK(!c.stream || c.dataset == "folder", "--stream needs --dataset folder (the other data sets are read ",
               "into memory whole), got --dataset ", c.dataset);
  ACTLAB_CHECK(c.data_workers >= 0 && c.data_workers <= 256, "--data-workers must be in [0, 256] (0: auto), got ",
               c.data_workers);
  PolicySet set = parse_policy_set(c.policy);
  for (const auto& r : c.policy_rules) set.add_rule(r);
  check_distinct_files(c);  // first: an output on a file the run reads says so, whatever else is wrong with it
  // A resumed run appends to its log and rewrites the log's side file: allowed where the log is an epoch
  // log already (a file of other content is refused as for a new run).
  const bool own_log = !c.resume.empty() && !c.log_file.empty() && is_epoch_log(c.log_file);
  ACTLAB_CHECK(c.resume.empty() || c.overwrite || c.log_file.empty() || !std::filesystem::exists(c.log_file) || own_log,
               "log file '", c.log_file, "' exists and is not an epoch log (a resumed run appends to its own); "
               "pass --overwrite to replace it or choose another name");
  // An output directly in --save-dir (--save-dir runs/a --log runs/a/log.csv) may name it before the run
  // creates it (prepare_save_dir; an evaluation or --summary creates none).
  const std::string dir = c.eval_only || c.summary_only ? std::string() : c.save_dir;
  check_writable(c.log_file, c.overwrite || own_log, "log file", /*atomic=*/false, dir);  // appended to in place
  if (!c.log_file.empty())  // written beside the log at start, rewritten by a resumed run
    check_writable(c.log_file + ".config.txt", c.overwrite || own_log, "log's configuration file", true, dir);
  check_writable(c.memory_report, c.overwrite || !c.resume.empty(), "memory report", true, dir);  // not rewritten on resume
  // Both are rewritten by every run, a resumed one too: an earlier run's file is replaced, anything else kept.
  check_writable(c.summary_json, c.overwrite || replaceable_output(c.summary_json, kSummaryJsonStart), "summary file",
                 true, dir);
  check_writable(c.export_weights, c.overwrite || replaceable_output(c.export_weights, is_exported_state_dict),
                 "--export-weights file", true, dir);  // before training, not after
}

// ---------------------------------------------------------------- stop requests
namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_interrupts = 0;  // SIGINTs and SIGTERMs received
bool g_stderr_tty = false;                    // read once at install: isatty is not async-signal-safe
// The first SIGINT/SIGTERM asks for a checkpointed stop; a second one ends the run at once, by the signal's
// default action (so the exit status says which), after one line saying so (write(2) is async-signal-safe).
// SIGHUP only ever asks (stop.h: the kernel may send it once per exiting thread of a parent).
extern "C" void record_stop_signal(int sig) {
  if (sig != SIGHUP && g_interrupts++ > 0) {
    static const char line[] = "actlab-train: a second interrupt: stopped at once, without a checkpoint of this step\n";
    if (g_stderr_tty) (void)!::write(STDERR_FILENO, "\n", 1);  // end a live progress line first
    (void)!::write(STDERR_FILENO, line, sizeof line - 1);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop_signal = sig;
}
}  // namespace

void install_stop_handlers() {
  g_stderr_tty = ::isatty(STDERR_FILENO) == 1;
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a second SIGINT/SIGTERM: record_stop_signal ends the run
  ACTLAB_CHECK(sigaction(SIGINT, &sa, nullptr) == 0 && sigaction(SIGTERM, &sa, nullptr) == 0,
               "installing SIGINT/SIGTERM handlers failed");
  struct sigaction hup {};
  ACTLAB_CHECK(sigaction(SIGHUP, nullptr, &hup) == 0, "reading the SIGHUP disposition failed");
  if (hup.sa_handler != SIG_IGN) {
    sa.sa_flags = SA_RESTART;  // repeated: see stop.h
    ACTLAB_CHECK(sigaction(SIGHUP, &sa, nullptr) == 0, "installing the SIGHUP handler failed");
  }
}
int stop_signal() { return static_cast<int>(g_stop_signal); }
void request_stop(int signal) { g_stop_signal = signal; }

// ---------------------------------------------------------------- the run
namespace {

// Dropout and drop-path masks draw philox(seed, stream, i); reseeding every module from (run seed, global
// step, module index) before each step (Module::set_seed, which also restarts the per-call stream counter)
// makes them a function of the step rather than of how many calls this process made, so a resume redraws them.
void seed_dropout(Module& model, uint64_t seed, int64_t global_step) {
  uint64_t index = 0;
  for (const auto& m : model.named_modules()) {
    Module& module = m.second ? *m.second : model;  // the root is listed first, without a handle
    module.set_seed(fnv1a64(&index, sizeof index, fnv1a64(&global_step, sizeof global_step, seed ^ 0xD509u)));
    ++index;
  }
}

std::string describe_schedule(const LrSchedule& s, int64_t global_step) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s base_lr=%g total_steps=%lld warmup_steps=%lld step_size=%lld lr_now=%.9g",
                LrSchedule::kind_name(s.kind), s.base_lr, static_cast<long long>(s.total_steps),
                static_cast<long long>(s.warmup_steps), static_cast<long long>(s.step_size), s.lr_at(global_step));
  return buf;
}

void check_resume_compatible(const TrainConfig& now, const TrainConfig& saved, const std::string& path,
                             int64_t world_now, int64_t world_saved) {
  auto same = [&](const char* key, const std::string& a, const std::string& b) {
    ACTLAB_CHECK(a == b, "cannot resume from '", path, "': it was trained with ", key, " ", b, ", this run has ", a,
                 " (", key, " must match)");
  };
  same("model", now.model, saved.model);
  same("dataset", now.dataset, saved.dataset);
  same("batch-size", std::to_string(now.batch_size), std::to_string(saved.batch_size));
  same("seed", std::to_string(now.seed), std::to_string(saved.seed));
  same("train-limit", std::to_string(now.train_limit), std::to_string(saved.train_limit));
  same("steps-per-epoch", std::to_string(now.steps_per_epoch), std::to_string(saved.steps_per_epoch));
  // Each rank's shard of an epoch, and so which samples are still to come, depends on the world size.
  ACTLAB_CHECK(world_now == world_saved, "cannot resume from '", path, "': it was trained on ", world_saved,
               world_saved == 1 ? " rank" : " ranks", ", this run has ", world_now,
               " (the data shards depend on the world size; resume with ", world_saved, " ranks",
               world_saved > 1 ? ": mpirun -np " + std::to_string(world_saved) + " ... --distributed" : std::string(),
               ")");
  // A streamed folder crops and normalizes differently from the same folder decoded up front.
  if (now.dataset == "folder") same("stream", now.stream ? "true" : "false", saved.stream ? "true" : "false");
  if (now.dataset == "synthetic")
    same("synthetic-size", std::to_string(now.synthetic_size), std::to_string(saved.synthetic_size));
}

// "rank 1" or "ranks 0, 2".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

class Run {
 public:
  Run(const TrainConfig& c, const DistRun& dist, Device device) : c_(c), device_(device), dist_(dist) {}
  TrainSummary go();

 private:
  void setup();
  void restore();
  void print_header() const;
  bool run_epoch(int64_t epoch);  // false: stopped by a request
  bool train_step(const Batch& batch, int64_t epoch, int64_t step, EpochRow& row);  // false: update skipped
  std::string locate_in_forward(const Tensor& images);
  // weights_to_blame: this rank's weights gave the non-finite value on finite data (a non-finite gradient,
  // or a loss whose input batch was finite: locate_in_forward).
  void nonfinite_step(const std::string& what, const std::string& where, int64_t epoch, int64_t step,
                      bool weights_to_blame);
  void discard_update();
  void after_first_step(const StepResult& r);
  void finish_epoch(int64_t epoch, EpochRow& row, Clock::time_point start);
  void stop(int64_t epoch, int64_t step);
  TrainState state(int64_t epochs_done, int64_t step_in_epoch) const;
  // Dropout masks differ between ranks (as their samples do); rank 0 keeps the seed of a one-rank run.
  uint64_t dropout_seed() const {
    const uint64_t rank = static_cast<uint64_t>(dist_.rank());
    return rank == 0 ? c_.seed : fnv1a64(&rank, sizeof rank, c_.seed);
  }
  void save(const std::string& file, const TrainState& st) const;
  void gather_epoch_sums();
  void report_overlap(int64_t epoch);
  bool stop_requested() const;

  TrainConfig c_;
  Device device_;
  const DistRun& dist_;
  std::unique_ptr<GradReducer> reducer_;  // --distributed
  OverlapStats overlap_epoch_start_;
  DataSplits data_;
  std::unique_ptr<DataLoader> train_loader_, test_loader_;
  std::shared_ptr<Module> model_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<PolicySet> policies_;
  std::unique_ptr<BufferSnapshot> buffers_;  // BN statistics before the current step's forward
  std::unique_ptr<MemoryCheck> memory_check_;  // --check-memory
  std::unique_ptr<LossScaler> scaler_;       // --loss-scale (disabled: scale 1)
  int64_t nonfinite_in_a_row_ = 0;
  bool first_step_done_ = false;
  bool fresh_log_ = false;  // a resumed run writes its log afresh (--overwrite over a log not its own)
  // The log as the run this one continues left it: what a run without --log records in its checkpoints, so
  // that a later resume with the log finds it still the run's (bytes 0: none, nothing to compare).
  LogMark log_before_{0, ""};
  bool resumed_mid_run_ = false;  // the first process printed the first-step report and wrote the memory report
  LrSchedule sched_;
  int64_t steps_per_epoch_ = 0;
  std::unique_ptr<EpochLogger> logger_;
  std::unique_ptr<Progress> progress_;
  TrainSummary summary_;
  std::vector<double> all_rates_, rates_;
  int64_t global_step_ = 0;
  int64_t first_epoch_ = 0, resume_step_ = 0;  // where this process starts (resume)
  double epoch_wall_before_ = 0;                // the resumed epoch's wall seconds before its stop
  Clock::time_point epoch_start_ = Clock::now();  // the running epoch's, as its logged wall time counts
  double loss_sum_ = 0;                         // running sums of the current epoch
  int64_t correct_ = 0, seen_ = 0;
  double best_acc_ = -1;
  Clock::time_point last_;
};

void Run::setup() {
  data_ = load_data(c_);
  dist_.check_same_data(data_.identity);
  const ImageSpec spec = data_.train->spec();
  const ImageSpec test_spec = data_.test->spec();
  ACTLAB_CHECK(test_spec.channels == spec.channels && test_spec.height == spec.height && test_spec.width == spec.width,
               "train and test splits have different image shapes: ", spec.channels, "x", spec.height, "x", spec.width,
               " and ", test_spec.channels, "x", test_spec.height, "x", test_spec.width);
  const int workers = data_workers(c_);
  // Only a training run needs whole batches: an evaluation or a --summary takes a train split smaller than
  // one batch.
  const bool trains = !c_.eval_only && !c_.summary_only;
  train_loader_ = std::make_unique<DataLoader>(*data_.train, c_.batch_size, true, c_.seed, trains, data_.train_transforms,
                                               kPrefetchBatches, workers);
  test_loader_ = std::make_unique<DataLoader>(*data_.test, std::min<int64_t>(c_.batch_size, 256), false, c_.seed, false,
                                              data_.test_transforms, kPrefetchBatches, workers);
  if (dist_.on()) {
    train_loader_->shard(dist_.rank(), dist_.world());
    test_loader_->shard(dist_.rank(), dist_.world());
  }
  model_ = make_model({c_.model, spec.channels, spec.num_classes, spec.height, static_cast<float>(c_.drop_path)});
  model_->to(device_);  // before the optimizer and the snapshot: momentum and copies live beside the weights
  opt_ = make_optimizer(c_, *model_);
  policies_ = std::make_unique<PolicySet>(parse_policy_set(c_.policy));
  for (const auto& r : c_.policy_rules) policies_->add_rule(r);
  make_checkpoint_plan(*model_, policies_->checkpoint());  // a request this model cannot take fails now
  buffers_ = std::make_unique<BufferSnapshot>(*model_);
  scaler_ = std::make_unique<LossScaler>(loss_scale_options(c_));
  if (dist_.on())
    reducer_ = std::make_unique<GradReducer>(model_->parameters(), *dist_.comm(),
                                             static_cast<int64_t>(c_.bucket_mib * 1024 * 1024),
                                             static_cast<int64_t>(c_.bucket_tail_mib * 1024 * 1024),
                                             Averaging::ThroughSeed);
  if (c_.check_memory) memory_check_ = std::make_unique<MemoryCheck>(device_);
  steps_per_epoch_ = c_.steps_per_epoch > 0 ? std::min(c_.steps_per_epoch, train_loader_->num_batches())
                                            : train_loader_->num_batches();
  sched_.kind = LrSchedule::parse_kind(c_.schedule);
  sched_.base_lr = static_cast<float>(c_.lr);
  sched_.total_steps = steps_per_epoch_ * c_.epochs;
  sched_.warmup_steps = steps_per_epoch_ * c_.warmup_epochs;
  sched_.step_size = steps_per_epoch_ * c_.step_epochs;
  summary_.data_note = data_.note;
  summary_.input_channels = data_.train->spec().channels;
  summary_.input_height = data_.train->spec().height;
  summary_.input_width = data_.train->spec().width;
  summary_.policy = policies_->describe();
  summary_.world_size = dist_.world();
  summary_.rank = dist_.rank();
}

void Run::restore() {
  const SafetensorsFile file = read_safetensors(c_.resume);
  const TrainState st = checkpoint_state(file);
  // Evaluating the weights does not depend on how many ranks trained them.
  check_resume_compatible(c_, config_from_json(st.config_json), c_.resume, c_.eval_only ? st.world_size : dist_.world(),
                          st.world_size);
  // The same flags can name other data (files added to a folder, a class renamed, another --data-dir):
  // its labels and the epoch's order would change under the resumed weights. Evaluating the weights on
  // other data (--eval-only) is a use of its own.
  ACTLAB_CHECK(c_.eval_only || st.data_identity.empty() || same_data_identity(st.data_identity, data_.identity), "cannot resume from '", c_.resume,
               "': it was trained on data of ", st.data_identity, "; ", data_.note, " now has ", data_.identity,
               " (the data must be the same)");
  restore_checkpoint(file, *model_, opt_.get());
  ACTLAB_CHECK(st.step_in_epoch <= steps_per_epoch_, "checkpoint '", c_.resume, "' stopped at step ",
               st.step_in_epoch, " of an epoch of ", steps_per_epoch_, " steps");
  ACTLAB_CHECK(c_.eval_only || st.epoch < c_.epochs, "checkpoint '", c_.resume, "' has already completed ", st.epoch,
               " of ", c_.epochs, " epochs; raise --epochs to train further");
  // Cutting back or appending to another run's log under the same name would lose its rows or mix the two.
  if (!c_.eval_only && !resumed_log_continues(c_.log_file, st.log)) {
    // A checkpoint written before its log's first row cannot tell another run's rows from its own run's
    // written after it (a kill between a row and the checkpoint): either way a resume would cut them all.
    ACTLAB_CHECK(c_.overwrite, "log file '", c_.log_file, "' is not the log of the run checkpointed in '", c_.resume,
                 st.log.bytes == 0 ? "' (it holds rows where the checkpoint recorded none: another run's, or this run's "
                                     "own written after the checkpoint, which a resume cuts); choose another --log, or "
                                     "pass --overwrite to start it afresh"
                                   : "' (its rows differ from those the checkpoint recorded: another run's log?); choose "
                                     "another --log, or pass --overwrite to start it afresh");
    fresh_log_ = true;
    if (dist_.lead())
      std::fprintf(stderr, "actlab-train: note: log '%s' does not go on from the checkpoint's rows; --overwrite: it is "
                   "written afresh\n", c_.log_file.c_str());
  }
  log_before_ = st.log;
  first_epoch_ = st.epoch;
  if (!c_.eval_only) summary_.epochs_before = st.epoch;  // an evaluation trains no epochs
  resume_step_ = st.step_in_epoch;
  epoch_wall_before_ = st.step_in_epoch > 0 ? st.epoch_wall_s : 0;
  global_step_ = st.global_step;
  // The stored sums are the whole job's (gather_epoch_sums before the save): rank 0 carries them on.
  loss_sum_ = dist_.lead() ? st.loss_sum : 0;
  correct_ = dist_.lead() ? st.correct : 0;
  seen_ = dist_.lead() ? st.seen : 0;
  best_acc_ = st.best_acc;
  // A dynamic scale carries on from where the saved run left it; any other mode starts from its own.
  if (scaler_->dynamic() && loss_scale_options(config_from_json(st.config_json)).mode == LossScaleOptions::Mode::Dynamic)
    scaler_->restore(st.loss_scale, st.loss_scale_good_steps);
  if (!c_.quiet)
    std::printf("resumed from %s: %lld epochs done%s, global step %lld, best test accuracy %.2f%%\n", c_.resume.c_str(),
                static_cast<long long>(st.epoch),
                st.step_in_epoch > 0 ? (" + " + std::to_string(st.step_in_epoch) + " steps").c_str() : "",
                static_cast<long long>(st.global_step), std::max(0.0, st.best_acc));
  // Options a resume may change at will (its length, its outputs, its placement) pass in silence; any other
  // change (another --policy, --lr, schedule) is allowed, as a deliberate change of recipe, but named, so
  // a resume that meant to continue the same run and did not is seen (on stderr, even --quiet).
  if (dist_.lead() && !c_.resume_note.empty()) std::fprintf(stderr, "actlab-train: note: %s\n", c_.resume_note.c_str());
  if (dist_.lead() && !c_.eval_only) {
    // Besides placement and outputs, a resume may raise --epochs, save elsewhere, and no longer names the
    // weights the first run started from.
    const std::string changed =
        config_differences(c_, config_from_json(st.config_json), {"epochs", "save-dir", "init-weights"});
    if (!changed.empty())
      std::fprintf(stderr, "actlab-train: note: resuming with options the checkpoint's run did not have: %s\n",
                   changed.c_str());
    if (acgc_average_bits(*policies_) >= 0)  // -1: no acgc policy in the set
      std::fprintf(stderr, "actlab-train: note: acgc's gradient measurements are not in checkpoints: this run "
                           "measures again, so it does not end bit-identical to an uninterrupted one\n");
  }
  // The checkpoint stores --save-dir as given, so a relative one is taken from this run's directory: when
  // that is not where the resumed save-dir checkpoint lies, say where the checkpoints now go (even --quiet).
  namespace fs = std::filesystem;
  const std::string name = fs::path(c_.resume).filename().string();
  if (dist_.lead() && !c_.save_dir.empty() && !c_.eval_only && (name == "last.safetensors" || name == "best.safetensors") &&
      resolved_path(c_.save_dir) != resolved_path(fs::path(c_.resume).has_parent_path() ? fs::path(c_.resume).parent_path().string() : "."))
    std::fprintf(stderr, "actlab-train: note: checkpoints go to '%s' (--save-dir '%s', taken from this directory), "
                 "not beside '%s'\n", resolved_path(c_.save_dir).c_str(), c_.save_dir.c_str(), c_.resume.c_str());
}

TrainState Run::state(int64_t epochs_done, int64_t step_in_epoch) const {
  TrainState st;
  st.model = c_.model;
  st.epoch = epochs_done;
  st.step_in_epoch = step_in_epoch;
  st.global_step = global_step_;
  st.pack_step = static_cast<uint64_t>(global_step_);
  st.seed = c_.seed;
  st.loss_sum = step_in_epoch > 0 ? loss_sum_ : 0;
  st.correct = step_in_epoch > 0 ? correct_ : 0;
  st.seen = step_in_epoch > 0 ? seen_ : 0;
  st.best_acc = best_acc_;
  st.lr_schedule = describe_schedule(sched_, global_step_);
  st.config_json = config_to_json(c_);
  st.world_size = dist_.world();
  st.loss_scale = scaler_->scale();
  st.loss_scale_good_steps = scaler_->good_steps();
  st.data_identity = data_.identity;
  st.epoch_wall_s = step_in_epoch > 0 ? seconds_since(epoch_start_) : 0;
  st.log = logger_ && !c_.log_file.empty() ? logger_->mark() : log_before_;
  return st;
}

void Run::save(const std::string& file, const TrainState& st) const {
  if (!dist_.lead()) return;  // every rank holds the same weights; one writes them
  save_checkpoint((std::filesystem::path(c_.save_dir) / file).string(), *model_, *opt_, st);
}

void Run::print_header() const {
  const ImageSpec spec = data_.train->spec();
  std::printf("actlab-train: %s on %s (%lld train / %lld test images, %lldx%lldx%lld), %lld parameters\n",
              c_.model.c_str(), data_.note.c_str(), static_cast<long long>(data_.train->size()),
              static_cast<long long>(data_.test->size()), static_cast<long long>(spec.channels),
              static_cast<long long>(spec.height), static_cast<long long>(spec.width),
              static_cast<long long>(model_->parameter_count()));
  std::printf("policy %s, batch %lld, %lld epochs x %lld steps, %s lr %g (%s), %s, wd %g, %lld threads, seed %llu\n",
              policies_->describe().c_str(), static_cast<long long>(c_.batch_size), static_cast<long long>(c_.epochs),
              static_cast<long long>(steps_per_epoch_), optimizer_title(c_.optimizer), c_.lr,
              c_.schedule.c_str(), optimizer_text(c_).c_str(), c_.weight_decay, static_cast<long long>(c_.threads),
              static_cast<unsigned long long>(c_.seed));
  if (device_.is_cuda()) std::printf("device %s (%s)\n", device_.str().c_str(), cuda_device_name(device_.index).c_str());
  if (compute_precision() != Precision::F32) {
    const Precision p = compute_precision();
    const std::string where = device_.is_cuda() ? std::string("tensor cores")
                                                : "CPU bf16 instructions: " + cpu_bf16_flags();
    std::printf("precision %s: convolutions, linear layers and matmuls compute in %s with fp32 accumulation (%s); "
                "exact saves are kept in %s; weights, optimizer state, batch norm and the loss stay fp32\n",
                precision_name(p), precision_name(p), where.c_str(), precision_name(p));
  }
  if (scaler_->enabled())
    std::printf("loss scale %s: backward starts from the loss times the scale, gradients are divided by it before "
                "the update%s\n",
                loss_scale_name(loss_scale_options(c_)).c_str(),
                scaler_->dynamic() ? "; an overflowing step is skipped and halves the scale" : "");
  if (dist_.on()) {
    char taper[64] = "";
    if (c_.bucket_tail_mib > 0 && c_.bucket_tail_mib < c_.bucket_mib)
      std::snprintf(taper, sizeof taper, ", tapering to %g MiB at the end of backward", c_.bucket_tail_mib);
    std::string sizes;
    for (size_t b = 0; b < reducer_->buckets().size(); ++b)
      sizes += (b ? ", " : "") + format_bytes(reducer_->bucket_bytes(b));
    std::printf("distributed: %d ranks over %s; --batch-size %lld is per rank (global batch %lld), each rank reads "
                "1/%d of every epoch; %zu gradient buckets of <= %g MiB%s, in backward order: %s\n",
                dist_.world(), dist_.comm()->backend().c_str(), static_cast<long long>(c_.batch_size),
                static_cast<long long>(c_.batch_size * dist_.world()), dist_.world(), reducer_->buckets().size(),
                c_.bucket_mib, taper, sizes.c_str());
  }
  std::string line = "config:";
  for (const auto& e : config_entries(c_)) line += " " + e.first + "=" + e.second;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

bool Run::train_step(const Batch& host_batch, int64_t epoch, int64_t step, EpochRow& row) {
  TapeClearGuard clear_tape;  // an exception mid-step (out of memory) must not leave saved tensors behind
  const float lr = sched_.lr_at(global_step_);
  opt_->set_lr(lr);
  row.lr = lr;
  // Every random stream of a step is a function of (seed, global step): resume needs no counters.
  set_pack_step(static_cast<uint64_t>(global_step_));
  seed_dropout(*model_, dropout_seed(), global_step_);
  buffers_->save();
  const bool inject = c_.inject_nan_step > 0 && global_step_ + 1 >= c_.inject_nan_step &&
                      global_step_ + 1 < c_.inject_nan_step + c_.inject_nan_count;
  if (inject && c_.inject_nan_into == "input") poison(host_batch.images);
  const Batch batch = on_device(host_batch, device_);
  StepOptions so;
  so.label_smoothing = static_cast<float>(c_.label_smoothing);
  so.record_saves = true;  // the summary's saves are the same step's as its activation memory (below)
  // The loss is read every step anyway; only a non-finite one pays for the diagnostic forward. With
  // --distributed every rank takes the same decision: one rank's NaN stops or skips the step on all.
  std::vector<int> bad_loss_ranks;
  so.after_forward = [&](float loss) {
    bad_loss_ranks = dist_.ranks_with(!std::isfinite(loss));
    if (!bad_loss_ranks.empty()) return false;
    if (reducer_) reducer_->begin_backward();  // each bucket's all-reduce starts as backward fills it
    return true;
  };
  std::string bad_gradient;
  bool overflow_skipped = false;
  // With ranks, backward also starts divided by their number: the all-reduce's sum is then the average.
  so.loss_scale = scaler_->scale() * (reducer_ ? reducer_->seed_factor() : 1.0);
  so.before_update = [&] {
    if (reducer_) reducer_->finish();  // the gradients are now the average over the ranks
    const auto params = model_->named_parameters();
    if (inject && c_.inject_nan_into == "grad" && !params.empty()) poison(params.back().second.grad());
    scaler_->unscale(model_->parameters());
    // Before the update: a bad gradient never reaches the weights or the momentum.
    const std::vector<std::string> bad = nonfinite_gradients(*model_);
    // Every rank holds the same averaged gradients, so every rank's scaler takes the same decision.
    const std::vector<int> bad_ranks = dist_.ranks_with(!bad.empty());
    if (!bad_ranks.empty() && scaler_->absorbs_overflow()) {
      scaler_->update(true);
      overflow_skipped = true;
      return false;
    }
    if (bad_ranks.empty()) return scaler_->update(false);
    if (bad.empty()) {
      bad_gradient = "on " + rank_list(bad_ranks) + " (this rank's gradients were finite)";
      return false;
    }
    const std::string& last = bad.back();  // the nearest the loss: where backward met it first
    bad_gradient = "first in layer '" + last.substr(0, last.rfind('.')) + "' (parameter " + last + "; " +
                   std::to_string(bad.size()) + " of " + std::to_string(params.size()) +
                   " parameter gradients non-finite)";
    return false;
  };
  const StepResult r = run_step(*model_, opt_.get(), *policies_, batch.images, batch.labels, so);
  if (!r.backward_done) {
    const bool here = !std::isfinite(r.loss);
    const std::string where = here ? locate_in_forward(batch.images) : "this rank's loss was finite";
    nonfinite_step(dist_.on() ? "loss on " + rank_list(bad_loss_ranks) : "loss (" + std::to_string(r.loss) + ")",
                   where, epoch, step, here && where != kNonfiniteInputBatch);
    return false;
  }
  if (!r.updated && !overflow_skipped) {
    nonfinite_step("gradient", bad_gradient, epoch, step, true);
    return false;
  }
  // An overflow the scaler absorbed: the forward was good and is counted; its update is dropped.
  if (overflow_skipped) discard_update();
  nonfinite_in_a_row_ = 0;
  const int64_t act = r.activation_bytes;
  const float loss_value = r.loss;
  const int64_t correct = r.correct;
  if (!first_step_done_) after_first_step(r);
  const int64_t n = batch.labels.size(0);
  correct_ += correct;
  loss_sum_ += static_cast<double>(loss_value) * static_cast<double>(n);
  seen_ += n;
  row.activation_bytes = act;
  // Every memory figure of the summary is the last good step's: the steady state (AC-GC packs at 8 bits
  // until its first measurement and at its chosen widths after), and one step, so that the policy's
  // saves are a part of the whole step's activation memory.
  summary_.activation_bytes = act;
  summary_.saved_raw_bytes = r.saved.raw;
  summary_.saved_packed_bytes = r.saved.packed;
  summary_.saved_expected_bytes = r.saved.expected;
  const double dt = seconds_since(last_);
  last_ = Clock::now();
  if (global_step_ > 0) rates_.push_back(static_cast<double>(n) / dt);
  const int64_t steps_left = (steps_per_epoch_ - step - 1) + (c_.epochs - epoch - 1) * steps_per_epoch_;
  const double rate = rates_.empty() ? static_cast<double>(n) / dt : rates_.back();
  progress_->step(epoch + 1, c_.epochs, step + 1, steps_per_epoch_, loss_sum_ / static_cast<double>(seen_),
                  100.0 * static_cast<double>(correct_) / static_cast<double>(seen_), rate,
                  memory_stats(device_).total.current, static_cast<double>(steps_left * c_.batch_size) / rate);
  return !overflow_skipped;
}

// The first good step's memory report: its per-pack statistics (run_step records each step afresh).
void Run::after_first_step(const StepResult& r) {
  first_step_done_ = true;
  // Each rank's policy packs its own activations: the measure per rank, and what the job holds.
  const std::vector<double> act = dist_.gather(static_cast<double>(r.activation_bytes));
  // A whole step has looked up every save's policy (a checkpointed segment's in its recompute): a rule
  // that took none is a pattern that names nothing here, and training on would ignore it silently. A
  // resumed run checks too: a rule given to the resume was never checked before.
  policies_->check_rules_matched(c_.model);
  // A resumed run: the report was printed by the run it continues, whose memory report stays as it was; a
  // report the resume asks for and no earlier run wrote is written.
  const bool report_written = resumed_mid_run_ && std::filesystem::exists(c_.memory_report);
  if (!c_.memory_report.empty() && !report_written) write_memory_report(c_.memory_report, r.saves);
  if (resumed_mid_run_) return;
  if (dist_.on() && !c_.quiet) std::printf("distributed: activation memory %s\n", per_rank_bytes(act).c_str());
  if (!c_.quiet) print_first_step_report(summary_, r, c_);
}

// Re-runs the failing forward (same dropout masks) to find the first layer with a non-finite
// output; the pass updates the BN statistics again, so the snapshot is restored after it.
std::string Run::locate_in_forward(const Tensor& images) {
  seed_dropout(*model_, dropout_seed(), global_step_);
  // This rank alone re-runs its forward: synchronized batch norm would wait for the others.
  if (c_.sync_bn) set_batch_norm_train_override(nullptr);
  const std::string where = locate_nonfinite_forward(*model_, images);
  if (c_.sync_bn) set_batch_norm_train_override(dist_.sync_bn());
  buffers_->restore();
  return where.empty() ? "every layer output finite (the loss itself overflowed)" : where;
}

// An update that is not applied leaves nothing behind: the gradients are dropped and the batch-norm
// statistics of its forward are put back.
void Run::discard_update() {
  buffers_->restore();
  opt_->zero_grad();
}

// Nothing of the bad step has been applied: undo the forward's buffer update, drop the gradients,
// then skip the step, or fail with one line saying where it happened. The state before the step is saved
// as the last good one only when no rank's weights are to blame (every non-finite loss came from its input
// batch): otherwise the weights themselves gave it on finite data (a learning rate that diverged leaves
// them huge but finite), and writing them over last.safetensors lost the epoch-end state a smaller --lr
// could resume from.
void Run::nonfinite_step(const std::string& what, const std::string& where, int64_t epoch, int64_t step,
                         bool weights_to_blame) {
  discard_update();
  const std::string at = "at epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step + 1) +
                         " (global step " + std::to_string(global_step_ + 1) + "), " + where;
  ++nonfinite_in_a_row_;
  const bool skipping = c_.on_nonfinite == "skip-step";
  if (skipping && nonfinite_in_a_row_ < kMaxConsecutiveSkips) {
    ++summary_.skipped_steps;
    if (dist_.lead()) std::fprintf(stderr, "actlab-train: warning: non-finite %s %s; update skipped (%lld skipped so far)\n",
                 what.c_str(), at.c_str(), static_cast<long long>(summary_.skipped_steps));
    return;
  }
  std::string saved = "; nothing saved (no --save-dir)";
  if (!c_.save_dir.empty()) {
    gather_epoch_sums();
    // Every rank takes this path for the same step: the blame is agreed on by a sum, so all save or none.
    std::vector<double> blame = {weights_to_blame ? 1.0 : 0.0};
    dist_.sum(blame);
    const std::string path = (std::filesystem::path(c_.save_dir) / "last.safetensors").string();
    const std::string kept = std::filesystem::exists(path) ? path + " was left as it was" : "nothing was saved";
    bool weights_finite = true;
    for (const auto& p : model_->named_parameters()) weights_finite = weights_finite && all_finite(p.second.data());
    if (!weights_finite) {  // a finite gradient times the learning rate overflowed in an earlier update
      saved = "; the weights themselves are no longer finite, so " + kept;
    } else if (blame[0] > 0) {
      saved = "; the weights give it on a finite batch, so " + kept;
    } else {
      save("last.safetensors", state(epoch, step));
      saved = "; the last good state is in " + path;
    }
  }
  const std::string message = detail::concat(
      "non-finite ", what, " ", at,
      skipping ? " (" + std::to_string(kMaxConsecutiveSkips) + " non-finite steps in a row)" : "", saved,
      "; try a smaller --lr (now ", c_.lr, ")",
      c_.weight_decay > 1 ? detail::concat(" or a smaller --weight-decay (now ", c_.weight_decay, ")") : "");
  if (!c_.summary_json.empty()) {  // a result, not a failure: what was measured up to here, and why it ended
    summary_.diverged = message;
    summary_.steps = global_step_;
    summary_.final_test_acc = summary_.final_test_loss = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> rates = all_rates_;
    rates.insert(rates.end(), rates_.begin(), rates_.end());
    summary_.median_img_per_s = median(rates);
    write_summary_json(c_.summary_json, summary_, c_);
  }
  ACTLAB_FAIL(message);
}

// The epoch's running loss and accuracy sums over every rank; afterwards rank 0 holds them (the
// others start from zero again, so a later gather does not count their part twice).
void Run::gather_epoch_sums() {
  if (!dist_.on()) return;
  std::vector<double> sums = {loss_sum_, static_cast<double>(correct_), static_cast<double>(seen_)};
  dist_.sum(sums);
  loss_sum_ = dist_.lead() ? sums[0] : 0;
  correct_ = dist_.lead() ? static_cast<int64_t>(sums[1]) : 0;
  seen_ = dist_.lead() ? static_cast<int64_t>(sums[2]) : 0;
}

// Rank 0's line on the epoch's gradient all-reduces: their own time against the time backward's end
// waited for them, i.e. how much of the communication ran behind the computation.
void Run::report_overlap(int64_t epoch) {
  if (!reducer_) return;
  const OverlapStats& now = reducer_->stats();
  const OverlapStats& was = overlap_epoch_start_;
  OverlapStats d;
  d.steps = now.steps - was.steps;
  d.buckets = now.buckets - was.buckets;
  d.bytes = now.bytes - was.bytes;
  d.comm_s = now.comm_s - was.comm_s;
  d.exposed_s = now.exposed_s - was.exposed_s;
  d.comm_cpu_s = now.comm_cpu_s - was.comm_cpu_s;
  overlap_epoch_start_ = now;
  summary_.comm_s = now.comm_s;
  summary_.comm_exposed_s = now.exposed_s;
  summary_.comm_cpu_s = now.comm_cpu_s;
  if (c_.quiet || d.steps == 0) return;
  std::printf("epoch %lld all-reduce: %lld steps x %lld buckets (%.2f MiB), communication %.3f s (%.3f s of CPU), "
              "exposed wait %.3f s: %.0f%% hidden behind backward\n",
              static_cast<long long>(epoch + 1), static_cast<long long>(d.steps),
              static_cast<long long>(d.buckets / d.steps),
              static_cast<double>(d.bytes / d.steps) / (1024.0 * 1024.0), d.comm_s, d.comm_cpu_s, d.exposed_s,
              100.0 * d.hidden_fraction());
}

// A stop request (a signal, or the test hook) on any rank stops every rank after the same step.
bool Run::stop_requested() const {
  const bool here = stop_signal() != 0 || (c_.stop_after_steps > 0 && global_step_ >= c_.stop_after_steps);
  return !dist_.ranks_with(here).empty();
}

void Run::finish_epoch(int64_t epoch, EpochRow& row, Clock::time_point start) {
  ACTLAB_CHECK(seen_ > 0 || summary_.skipped_steps > 0, "epoch ", epoch + 1, " had no training batches");
  gather_epoch_sums();
  report_overlap(epoch);
  // An epoch whose every step was skipped (--on-nonfinite=skip-step) has no training figures: NaN.
  const double seen = seen_ > 0 ? static_cast<double>(seen_) : std::nan("");
  row.train_loss = loss_sum_ / seen;
  row.train_acc = 100.0 * static_cast<double>(correct_) / seen;
  row.img_per_s = median(rates_);
  const MemoryStats stats = memory_stats(device_);
  row.peak_bytes = memory_check_ ? memory_check_->epoch_peak() : stats.total.peak;
  summary_.reserved_peak_bytes = std::max(summary_.reserved_peak_bytes, stats.reserved_peak);
  const bool poison_eval = c_.inject_nan_into == "eval" && c_.inject_nan_step > 0 && epoch + 1 >= c_.inject_nan_step &&
                           epoch + 1 < c_.inject_nan_step + c_.inject_nan_count;
  dist_.broadcast_buffers(*model_);  // the statistics the checkpoint holds score every shard
  const EvalResult ev = evaluate(*model_, *test_loader_, data_.test->name(), device_, dist_, poison_eval);
  row.test_loss = ev.loss;
  row.test_acc = ev.acc;
  row.wall_s = seconds_since(start);
  row.acgc_bits = acgc_average_bits(*policies_);
  all_rates_.insert(all_rates_.end(), rates_.begin(), rates_.end());
  summary_.peak_bytes = std::max(summary_.peak_bytes, row.peak_bytes);
  summary_.epochs.push_back(row);
  const bool best = std::isfinite(ev.loss) && ev.acc > best_acc_;  // a model whose test loss is not finite is never the best
  if (best) best_acc_ = ev.acc;
  // The row before the checkpoint: a kill between the two leaves a row whose epoch the last checkpoint
  // lacks, which a resume cuts off and writes again (EpochLogger), where the other order lost the row. A row
  // that cannot be written (a full disk under the log) still lets the epoch's checkpoint be saved first.
  std::exception_ptr row_error;
  try {
    logger_->write(row);
  } catch (const Error&) {
    row_error = std::current_exception();
  }
  if (!c_.save_dir.empty()) {
    // The best first: last.safetensors records the raised best accuracy, so a kill (or a failed write)
    // between the two in the other order left an older model as the best for good, as the resumed run
    // believed it had this one. In this order a resume redoes the epoch and writes both.
    const TrainState st = state(epoch + 1, 0);
    if (best) save("best.safetensors", st);
    save("last.safetensors", st);
  }
  if (row_error) std::rethrow_exception(row_error);
  progress_->epoch_done(row, c_.epochs);
}

void Run::stop(int64_t epoch, int64_t step) {
  summary_.interrupted = true;
  summary_.stop_signal = stop_signal();
  summary_.stop_epoch = epoch + 1;
  summary_.stop_step = step;
  if (c_.save_dir.empty()) return;
  gather_epoch_sums();
  // The exact mid-epoch state: weights, momentum, the step reached and the epoch's running sums.
  summary_.stop_checkpoint = (std::filesystem::path(c_.save_dir) / "last.safetensors").string();
  save("last.safetensors", state(epoch, step));
}

bool Run::run_epoch(int64_t epoch) {
  model_->train();
  const bool resumed_mid_epoch = epoch == first_epoch_ && resume_step_ > 0;
  // A resumed epoch's clock starts where the stopped one's was: its row's wall time is the whole epoch's.
  epoch_start_ = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(resumed_mid_epoch ? epoch_wall_before_ : 0.0));
  const auto start = epoch_start_;
  // Resumed mid-epoch: the batches already used are skipped unread (a streamed folder would decode
  // them), and the ones that follow are the same, being functions of (seed, epoch, sample).
  ACTLAB_CHECK(!resumed_mid_epoch || resume_step_ <= train_loader_->num_batches(), "resume: the checkpoint is at step ",
               resume_step_, " of an epoch of ", train_loader_->num_batches(), " batches");
  train_loader_->start_epoch(epoch, resumed_mid_epoch ? resume_step_ : 0);
  reset_peak(device_);
  if (memory_check_) memory_check_->epoch_peak();  // forget the previous epoch's step windows
  rates_.clear();
  EpochRow row;
  row.epoch = epoch + 1;
  Batch batch;
  int64_t step = 0;
  if (resumed_mid_epoch) {
    step = resume_step_;
    row.lr = sched_.lr_at(global_step_ - 1);
  } else {
    loss_sum_ = 0;
    correct_ = seen_ = 0;
  }
  last_ = Clock::now();
  for (; step < steps_per_epoch_; ++step) {
    if (stop_requested()) {
      stop(epoch, step);
      return false;
    }
    bool more = false;
    try {
      more = train_loader_->next(batch);
    } catch (const OutOfMemory&) {
      throw;  // exit 3 and its own hint; a batch that does not fit is not a data error
    } catch (const Error& e) {
      // A file that cannot be read mid-epoch (a streamed folder decodes as it goes) costs the epoch's progress
      // only if nothing is saved: keep the state the steps so far reached, as a stop does. One process only:
      // with ranks, the others find this one gone (docs/distributed.md) and a collective save would wait.
      if (c_.save_dir.empty() || dist_.on()) throw;
      stop(epoch, step);
      throw Error(detail::concat(e.message(), "; the state after ", step, step == 1 ? " step" : " steps",
                                 " of epoch ", epoch + 1, " is in ", summary_.stop_checkpoint,
                                 " (--resume it once the data reads again", c_.overwrite ? ", with --overwrite" : "", ")"),
                  e.where());
    }
    if (!more) break;
    if (memory_check_) memory_check_->start_step();
    const bool applied = train_step(batch, epoch, step, row);
    if (memory_check_ && applied)  // a skipped step allocates no momentum: not a baseline
      memory_check_->end_step("epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step + 1) +
                              " (global step " + std::to_string(global_step_ + 1) + ")");
    ++global_step_;
  }
  finish_epoch(epoch, row, start);
  return true;
}

TrainSummary Run::go() {
  if (c_.summary_only) {  // the layer table needs the input's shape, not the data: CIFAR need not be fetched yet
    if (const std::optional<ImageSpec> spec = known_data_spec(c_)) {
      const auto model =
          make_model({c_.model, spec->channels, spec->num_classes, spec->height, static_cast<float>(c_.drop_path)});
      if (dist_.lead()) std::printf("%s", model_summary(*model, {spec->channels, spec->height, spec->width}).c_str());
      return summary_;
    }
  }
  setup();
  if (c_.summary_only) {
    const ImageSpec spec = data_.train->spec();
    if (dist_.lead()) std::printf("%s", model_summary(*model_, {spec.channels, spec.height, spec.width}).c_str());
    return summary_;
  }
  if (!c_.resume.empty()) restore();
  if (dist_.on() && !c_.resume.empty()) {
    // Each rank reads its own --resume file (one per machine's save directory): they must hold one step.
    const std::vector<double> steps = dist_.gather(static_cast<double>(global_step_));
    std::string listed;
    for (size_t r = 0; r < steps.size(); ++r)
      listed += (r ? ", " : "") + ("rank " + std::to_string(r) + " at " + std::to_string(static_cast<int64_t>(steps[r])));
    ACTLAB_CHECK(std::all_of(steps.begin(), steps.end(), [&](double v) { return v == steps[0]; }),
                 "the ranks' --resume checkpoints are at different global steps (", listed,
                 "); give every rank a copy of the same checkpoint");
  }
  if (!c_.init_weights.empty()) {
    import_state_dict(read_safetensors(c_.init_weights), *model_, "--init-weights '" + c_.init_weights + "'");
    buffers_->save();  // the snapshot the non-finite guard restores from holds the imported statistics
    if (!c_.quiet) std::printf("initial weights from %s\n", c_.init_weights.c_str());
  }
  // Rank 0's weights everywhere: the same initialisation or checkpoint either way, but a rank that
  // computed anything differently would otherwise drift unseen.
  dist_.broadcast_model(*model_);
  if (c_.eval_only) {
    const EvalResult ev = evaluate(*model_, *test_loader_, data_.test->name(), device_, dist_);
    summary_.final_test_loss = ev.loss;
    summary_.final_test_acc = ev.acc;
    if (!c_.quiet)
      std::printf("eval %s on %s%s: test loss %.4f accuracy %.2f%% (%lld images)\n",
                  (c_.resume.empty() ? c_.init_weights : c_.resume).c_str(), data_.note.c_str(),
                  // The precision moves the figures (a bf16 run's checkpoint evaluated in fp32 differs), so a
                  // low-precision evaluation says so.
                  compute_precision() == Precision::F32 ? "" : (std::string(", in ") + precision_name(compute_precision())).c_str(),
                  ev.loss, ev.acc, static_cast<long long>(data_.test->size()));
    if (!c_.export_weights.empty()) export_state_dict(c_.export_weights, *model_, opt_->steps());
    if (!c_.summary_json.empty()) write_summary_json(c_.summary_json, summary_, c_);
    return summary_;
  }
  resumed_mid_run_ = global_step_ > 0;
  // The configuration is written beside the log once the log's first row is written: a log that cannot be
  // written leaves no side file (nor a log it created), and a run that fails before then leaves both as
  // they were. (A side file that cannot be written then fails the run with the first row logged.)
  logger_ = std::make_unique<EpochLogger>(c_.log_file, !c_.resume.empty() && !fresh_log_, first_epoch_, [this] {
    write_text_atomic(c_.log_file + ".config.txt",
                      "# effective configuration of the run logged in " + c_.log_file + "\n" + config_to_text(c_));
  });
  progress_ = std::make_unique<Progress>(c_.quiet, c_.print_every > 0 ? c_.print_every
                                                                      : std::max<int64_t>(1, steps_per_epoch_ / 10));
  if (!c_.quiet) print_header();
  const auto run_start = Clock::now();
  for (int64_t epoch = first_epoch_; epoch < c_.epochs; ++epoch)
    if (!run_epoch(epoch)) break;
  if (!summary_.epochs.empty()) {
    summary_.final_test_acc = summary_.epochs.back().test_acc;
    summary_.final_test_loss = summary_.epochs.back().test_loss;
  }
  // No epoch with a finite test loss: no best accuracy (NaN, null in the JSON), not the -1 that stands for none.
  summary_.best_test_acc = best_acc_ >= 0 ? best_acc_ : std::numeric_limits<double>::quiet_NaN();
  summary_.median_img_per_s = median(all_rates_);
  summary_.steps = global_step_;
  summary_.wall_s = seconds_since(run_start);
  if (dist_.on()) {  // collective: every rank takes part, rank 0 prints
    const std::vector<double> peaks = dist_.gather(static_cast<double>(summary_.peak_bytes));
    const std::vector<double> rates = dist_.gather(summary_.median_img_per_s);
    double total_rate = 0;
    for (double r : rates) total_rate += r;
    if (!c_.quiet && !summary_.epochs.empty())
      std::printf("distributed: peak memory %s; throughput %s over %d ranks\n", per_rank_bytes(peaks).c_str(),
                  rate_text(total_rate).c_str(), dist_.world());
  }
  if (!c_.quiet && !summary_.interrupted && !summary_.epochs.empty()) print_summary(summary_, c_);
  summary_.loss_scale = scaler_->scale();
  summary_.overflow_skips = scaler_->overflow_skips();
  if (scaler_->enabled() && !c_.quiet)
    std::printf("loss scale at the end: %g; updates skipped for an overflow in this process: %lld\n", scaler_->scale(),
                static_cast<long long>(scaler_->overflow_skips()));
  if (summary_.skipped_steps > 0 && dist_.lead())  // every rank skipped the same steps: rank 0 says so
    std::fprintf(stderr, "actlab-train: warning: %lld steps skipped for non-finite values (--on-nonfinite=skip-step)\n",
                 static_cast<long long>(summary_.skipped_steps));
  if (memory_check_) {
    summary_.memory_check = memory_check_->verdict();
    if (!c_.quiet) std::printf("%s\n", summary_.memory_check.c_str());
  }
  if (!c_.export_weights.empty() && !summary_.interrupted) {
    export_state_dict(c_.export_weights, *model_, opt_->steps());
    if (!c_.quiet) std::printf("weights exported to %s\n", c_.export_weights.c_str());
  }
  if (!c_.summary_json.empty()) write_summary_json(c_.summary_json, summary_, c_);
  return summary_;
}

// The --save-dir's lock, and the folders the lead rank made for it: a run that ends with nothing saved
// there (no data, out of memory at its first step) takes them back, its lock file included.
struct SaveDir {
  std::string dir;
  std::vector<std::string> made;  // what make_output_dir created for it (a/b/.. makes a/b, the save dir a too)
  std::unique_ptr<DirectoryLock> lock;
  SaveDir() = default;
  SaveDir(SaveDir&&) = default;
  SaveDir& operator=(SaveDir&&) = default;
  ~SaveDir() {
    if (!lock) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path real = fs::canonical(dir, ec);  // a/b/.. stops resolving once a/b is gone
    if (ec) return;
    bool created = false;  // the save dir itself, not only a folder on the way to it
    for (const std::string& m : made) created = created || fs::equivalent(m, real, ec);
    remove_empty_directories(made);  // first the ones inside it (a/b of a/b/..); its parents are not empty yet
    bool only_lock = created;
    for (fs::directory_iterator it(real, ec), end; only_lock && !ec && it != end; it.increment(ec))
      only_lock = it->path().filename() == ".lock";
    if (ec || !only_lock) return;
    fs::remove(real / ".lock", ec);  // while it is still held: no other run took it meanwhile
    lock.reset();
    remove_empty_directories(made);
  }
};

// Creates the save directory, locks it for the lead rank's run (two runs writing one directory's checkpoints
// both ended with exit 0, one of them without its checkpoint) and refuses to clobber another run's
// checkpoints.
SaveDir prepare_save_dir(const TrainConfig& c, bool lead) {
  SaveDir out;
  if (c.save_dir.empty()) return out;
  namespace fs = std::filesystem;
  const std::vector<std::string> made = make_output_dir(c.save_dir, "save directory");
  if (lead) {
    out.lock = std::make_unique<DirectoryLock>(c.save_dir, "another training run is using --save-dir '" + c.save_dir +
                                                               "' (it holds " + (fs::path(c.save_dir) / ".lock").string() +
                                                               "); wait for it to end, or choose another --save-dir");
    out.made = made;
    out.dir = c.save_dir;
  }
  const fs::path last = fs::path(c.save_dir) / "last.safetensors";
  if (c.overwrite || !fs::exists(last)) return out;
  ACTLAB_CHECK(!c.resume.empty(), "'", last.string(), "' already exists; pass --resume ", last.string(),
               " to continue that run, or --overwrite");
  // A resumed run replaces its own checkpoints; a --save-dir holding another run's is refused as above.
  const std::string from = resolved_path(c.resume);
  ACTLAB_CHECK(from == resolved_path(last.string()) || from == resolved_path((fs::path(c.save_dir) / "best.safetensors").string()),
               "'", last.string(), "' already exists and is not the checkpoint being resumed ('", c.resume,
               "'); pass --overwrite to replace it, or a --save-dir of its own");
  return out;
}

}  // namespace

TrainSummary train(const TrainConfig& c) {
  validate(c);
  ACTLAB_CHECK(!c.eval_only || !c.resume.empty() || !c.init_weights.empty(),
               "--eval-only needs --resume CHECKPOINT or --init-weights FILE");
  ACTLAB_CHECK(c.resume.empty() || c.init_weights.empty(),
               "--init-weights starts a new run and --resume continues one: give one of them");
  // The run sets the OpenMP thread count and the memory limit; whatever way it ends (done, stopped, an
  // error), put both back as they were.
  struct Restore {
    int threads = omp_get_max_threads();
    Device device;
    int64_t limit = memory_limit(device);
    ~Restore() {
      omp_set_num_threads(threads);
      set_memory_limit(device, limit);
    }
  } restore{omp_get_max_threads(), Device::parse(c.device)};
  omp_set_num_threads(static_cast<int>(c.threads));
  Device device = Device::parse(c.device);
  ACTLAB_CHECK(device.is_cuda() || (!c.cudnn_benchmark && !c.tf32),
               "--cudnn-benchmark and --tf32 choose GPU math; this run is on ", c.device);
  // Distributed, MPI is initialised here, after every check of the configuration, and a plain
  // "--device cuda" means one GPU per rank on each machine.
  DistRun dist = c.distributed ? DistRun(c, device) : DistRun();
  if (dist.on()) device = dist.device();
  struct SyncBn {  // every BatchNorm2d of this thread's training forwards, for the run's length
    bool on;
    ~SyncBn() {
      if (on) set_batch_norm_train_override(nullptr);
    }
  } sync_bn{c.sync_bn && dist.on()};
  if (sync_bn.on) set_batch_norm_train_override(dist.sync_bn());
  if (device.is_cuda()) {
    cuda_init();  // throws saying why when there is none (a CPU-only build, no driver, no GPU)
    ACTLAB_CHECK(device.index < cuda_device_count(), "--device ", c.device, ": only ", cuda_device_count(),
                 " CUDA device(s) visible (cuda:0 .. cuda:", cuda_device_count() - 1, ")");
  }
#if defined(ACTLAB_WITH_CUDA)
  // Process-wide settings (conv plans are keyed by them): this run's, then back to what they were.
  struct GpuMath {
    cuda::MathOptions saved = cuda::math_options();
    ~GpuMath() { cuda::math_options() = saved; }
  } gpu_math;
  if (device.is_cuda()) {
    cuda::math_options().benchmark = c.cudnn_benchmark;
    cuda::math_options().deterministic = c.deterministic;
    cuda::math_options().allow_tf32 = c.tf32;
  }
#endif
  if (!c.memory_limit.empty()) set_memory_limit(device, parse_byte_size(c.memory_limit, "--memory-limit"));
  const Precision precision = parse_precision(c.precision);
  check_precision_supported(precision, device);
  const PrecisionScope precision_scope(precision);  // this thread's forwards, backwards and evaluations
  seed_init(c.seed);  // the same initial weights on every rank (and rank 0's are broadcast anyway)
  // Stochastic rounding draws differ between ranks, as their activations do; rank 0's are a one-rank run's.
  const uint64_t rank = static_cast<uint64_t>(dist.rank());
  set_pack_seed(rank == 0 ? c.seed : fnv1a64(&rank, sizeof rank, c.seed ^ 0x9ACCu));
  set_pack_step(0);
  CacheStats::global().reset();
  TrainConfig rank_config = c;
  if (!dist.lead()) {  // rank 0 prints and writes every output; the others train
    rank_config.quiet = true;
    rank_config.log_file = rank_config.memory_report = rank_config.summary_json = rank_config.export_weights = "";
  }
  SaveDir save_dir;  // locked for the whole run, the last checkpoint's write included
  try {
    dist.check_same_config(c);  // before any rank writes or trains
    if (!c.eval_only && !c.summary_only) save_dir = prepare_save_dir(rank_config, dist.lead());
    if (dist.lead()) {  // the rank that writes the outputs: what a killed run of them left half-written
      const auto in_save_dir = [&](const char* name) {
        return c.save_dir.empty() ? std::string() : (std::filesystem::path(c.save_dir) / name).string();
      };
      remove_stale_outputs("actlab-train", {in_save_dir("last.safetensors"), in_save_dir("best.safetensors"),
                                            c.export_weights, c.summary_json,
                                            c.log_file.empty() ? std::string() : c.log_file + ".config.txt",
                                            c.memory_report});
    }
    Run run(rank_config, dist, device);
    return run.go();
  } catch (const DistError&) {  // names its rank already
    dist.fail_job();
    throw;
  } catch (const OutOfMemory& e) {
    dist.fail_job();
    if (!dist.on()) throw;
    throw OutOfMemory(dist.who() + e.message(), e.where());  // still exit 3, and the rank it happened on
  } catch (const Error& e) {
    dist.fail_job();
    if (!dist.on()) throw;
    throw Error(dist.who() + e.message(), e.where());
  }
}

}  // namespace actlab
