// The training loop: setup, steps with memory measurement, evaluation, logging, summary.
#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "autograd/functions.h"
#include "autograd/saved_tensor.h"
#include "data/dataloader.h"
#include "data/cifar.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "layers/optim/schedule.h"
#include "layers/optim/sgd.h"
#include "models/registry.h"
#include "train/logging.h"

namespace actlab {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t live_excluding_data(const MemoryStats& s) { return s.total.current - s[MemTag::Data].current; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A view of the first `limit` samples of another data set.
class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<Dataset> base, int64_t limit) : base_(std::move(base)), limit_(limit) {}
  int64_t size() const override { return std::min(limit_, base_->size()); }
  ImageSpec spec() const override { return base_->spec(); }
  std::string name() const override { return base_->name(); }
  int64_t read(int64_t index, uint8_t* pixels) const override {
    ACTLAB_CHECK(index >= 0 && index < size(), "sample ", index, " out of range [0,", size(), ")");
    return base_->read(index, pixels);
  }
 private:
  std::shared_ptr<Dataset> base_;
  int64_t limit_;
};

struct EvalResult {
  double loss = 0, acc = 0;
};

EvalResult evaluate(Module& model, DataLoader& loader, const std::string& dataset) {
  NoGradGuard no_grad;
  model.eval();
  loader.start_epoch(0);
  Batch batch;
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  while (loader.next(batch)) {
    MemTagScope tag(MemTag::Activation);
    const Variable logits = model(Variable(batch.images));
    const Variable loss = cross_entropy(logits, batch.labels);
    const int64_t n = batch.labels.size(0);
    loss_sum += static_cast<double>(loss.data().item()) * static_cast<double>(n);
    correct += count_correct(logits.data(), batch.labels);
    seen += n;
  }
  model.train();
  ACTLAB_CHECK(seen > 0, "the ", dataset, " test split produced no batches");
  return {loss_sum / static_cast<double>(seen), 100.0 * static_cast<double>(correct) / static_cast<double>(seen)};
}

void check_writable(const std::string& path, bool overwrite, const char* what) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  ACTLAB_CHECK(overwrite || !fs::exists(p), what, " '", path,
               "' already exists; pass --overwrite to replace it or choose another name");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  ACTLAB_CHECK(fs::is_directory(dir), what, " '", path, "': directory '", dir.string(), "' does not exist");
  ACTLAB_CHECK(::access(dir.c_str(), W_OK) == 0, what, " '", path, "': directory '", dir.string(),
               "' is not writable");
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

void validate(const TrainConfig& c) {
  ACTLAB_CHECK(c.epochs >= 1, "epochs must be >= 1, got ", c.epochs);
  ACTLAB_CHECK(c.batch_size >= 1, "batch size must be >= 1, got ", c.batch_size);
  ACTLAB_CHECK(c.lr > 0 && std::isfinite(c.lr), "learning rate must be > 0, got ", c.lr);
  ACTLAB_CHECK(c.momentum >= 0 && c.momentum < 1, "momentum must be in [0, 1), got ", c.momentum);
  ACTLAB_CHECK(c.weight_decay >= 0, "weight decay must be >= 0, got ", c.weight_decay);
  ACTLAB_CHECK(!c.nesterov || c.momentum > 0, "--nesterov needs momentum > 0");
  ACTLAB_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1, "label smoothing must be in [0, 1), got ",
               c.label_smoothing);
  ACTLAB_CHECK(c.threads >= 1 && c.threads <= 1024, "threads must be >= 1, got ", c.threads);
  ACTLAB_CHECK(c.warmup_epochs == 0 || (c.warmup_epochs > 0 && c.warmup_epochs < c.epochs),
               "warm-up epochs must be in [0, epochs), got ", c.warmup_epochs);
  ACTLAB_CHECK(c.steps_per_epoch >= 0 && c.train_limit >= 0 && c.test_limit >= 0 && c.print_every >= 0,
               "step and sample limits must be >= 0");
  ACTLAB_CHECK(c.step_epochs >= 1, "--step-epochs must be >= 1, got ", c.step_epochs);
  ACTLAB_CHECK(c.synthetic_size >= 1, "--synthetic-size must be >= 1, got ", c.synthetic_size);
  LrSchedule::parse_kind(c.schedule);
  bool known_model = false;
  for (const auto& m : model_names()) known_model = known_model || m.first == c.model;
  if (!known_model) make_model({c.model, 1, 10, 28});  // throws the list of models
  ACTLAB_CHECK(c.dataset == "fashion-mnist" || c.dataset == "mnist" || c.dataset == "cifar10" ||
                   c.dataset == "cifar100" || c.dataset == "folder" || c.dataset == "synthetic",
               "unknown data set '", c.dataset, "'; available: fashion-mnist, mnist, cifar10, cifar100, folder, synthetic");
  ACTLAB_CHECK(c.image_size >= 1 && (c.image_channels == 1 || c.image_channels == 3),
               "--image-size must be >= 1 and --image-channels 1 or 3");
  ACTLAB_CHECK(c.test_fraction >= 0 && c.test_fraction < 1, "--test-fraction must be in [0, 1), got ", c.test_fraction);
  PolicySet set(parse_policy(c.policy));
  for (const auto& r : c.policy_rules) set.add_rule(r);
  check_writable(c.log_file, c.overwrite, "log file");
  check_writable(c.memory_report, c.overwrite, "memory report");
  ACTLAB_CHECK(c.log_file.empty() || c.log_file != c.memory_report, "log file and memory report are the same file");
}

DataSplits load_data(const TrainConfig& c) {
  DataSplits d;
  d.family = c.dataset;
  if (c.dataset == "synthetic") {
    d.train = std::make_shared<InMemoryImageDataset>(make_synthetic_dataset(c.synthetic_size, 1, 28, 28, 10, c.seed));
    d.test = std::make_shared<InMemoryImageDataset>(
        make_synthetic_dataset(std::max<int64_t>(1, c.synthetic_size / 4), 1, 28, 28, 10, c.seed + 1));
    d.note = "synthetic 1x28x28, 10 classes (generated)";
    d.family = "fashion-mnist";
  } else if (c.dataset == "folder") {
    ACTLAB_CHECK(!c.data_dir.empty(), "--dataset folder needs --data-dir ROOT (ROOT/train/<class>/*.png|jpg ...)");
    ImageFolderOptions o;
    o.channels = c.image_channels;
    o.size = c.image_size;
    o.test_fraction = c.test_fraction;
    o.split_seed = c.seed;
    ImageFolderData f = load_image_folder(c.data_dir, o);
    for (const auto& w : f.warnings) std::fprintf(stderr, "actlab-train: warning: %s\n", w.c_str());
    const auto stats = channel_mean_std(f.train);
    d.train = std::make_shared<InMemoryImageDataset>(f.train);
    d.test = std::make_shared<InMemoryImageDataset>(f.test);
    d.note = "image folder " + c.data_dir + " (" + std::to_string(f.class_names.size()) + " classes)";
    d.train_transforms.mean = d.test_transforms.mean = stats.first;
    d.train_transforms.std = d.test_transforms.std = stats.second;
    if (c.augment) {
      d.train_transforms.crop_padding = c.image_size / 8;
      d.train_transforms.horizontal_flip = true;
    }
  } else if (c.dataset == "cifar10" || c.dataset == "cifar100") {
    const std::string dir = c.data_dir.empty() ? default_cifar_dir() : c.data_dir;
    const bool ten = c.dataset == "cifar10";
    d.train = std::make_shared<InMemoryImageDataset>(ten ? load_cifar10(dir, true)
                                                         : load_cifar100(dir, true, c.cifar100_coarse));
    d.test = std::make_shared<InMemoryImageDataset>(ten ? load_cifar10(dir, false)
                                                        : load_cifar100(dir, false, c.cifar100_coarse));
    d.note = c.dataset + " from " + dir;
  } else {
    const bool fashion = c.dataset == "fashion-mnist";
    const std::string dir = !c.data_dir.empty() ? c.data_dir : fashion ? default_fashion_mnist_dir()
                                                                       : std::string("data/mnist");
    ACTLAB_CHECK(std::filesystem::is_directory(dir), c.dataset, " data directory '", dir, "' not found",
                 fashion && c.data_dir.empty()
                     ? " (install Debian's dataset-fashion-mnist package: scripts/setup.sh does)"
                     : " (pass --data-dir)");
    d.train = std::make_shared<InMemoryImageDataset>(fashion ? load_fashion_mnist(dir, true) : load_mnist(dir, true));
    d.test = std::make_shared<InMemoryImageDataset>(fashion ? load_fashion_mnist(dir, false) : load_mnist(dir, false));
    d.note = c.dataset + " from " + dir;
  }
  if (c.dataset != "folder") {
    d.train_transforms = default_transforms(d.family, c.augment);
    d.test_transforms = default_transforms(d.family, false);
    if (c.dataset == "synthetic") d.train_transforms.crop_padding = 0;
  }
  ACTLAB_CHECK(d.test->size() > 0, "the test split of ", d.note, " is empty");
  if (c.train_limit > 0) d.train = std::make_shared<SubsetDataset>(d.train, c.train_limit);
  if (c.test_limit > 0) d.test = std::make_shared<SubsetDataset>(d.test, c.test_limit);
  return d;
}

TrainSummary train(const TrainConfig& c) {
  validate(c);
  const auto run_start = Clock::now();
  omp_set_num_threads(static_cast<int>(c.threads));
  seed_init(c.seed);
  set_pack_seed(c.seed);
  set_pack_step(0);
  CacheStats::global().reset();

  DataSplits data = load_data(c);
  const ImageSpec spec = data.train->spec();
  ACTLAB_CHECK(data.test->spec().channels == spec.channels && data.test->spec().height == spec.height,
               "train and test splits have different image shapes");
  DataLoader train_loader(*data.train, c.batch_size, true, c.seed, true, data.train_transforms);
  DataLoader test_loader(*data.test, std::min<int64_t>(c.batch_size, 256), false, c.seed, false,
                         data.test_transforms);

  std::shared_ptr<Module> model = make_model({c.model, spec.channels, spec.num_classes, spec.height});
  Sgd opt(model->parameters(), {static_cast<float>(c.lr), static_cast<float>(c.momentum), 0.f,
                                static_cast<float>(c.weight_decay), c.nesterov});
  PolicySet policies(parse_policy(c.policy));
  for (const auto& r : c.policy_rules) policies.add_rule(r);

  const int64_t steps_per_epoch =
      c.steps_per_epoch > 0 ? std::min(c.steps_per_epoch, train_loader.num_batches()) : train_loader.num_batches();
  LrSchedule sched;
  sched.kind = LrSchedule::parse_kind(c.schedule);
  sched.base_lr = static_cast<float>(c.lr);
  sched.total_steps = steps_per_epoch * c.epochs;
  sched.warmup_steps = steps_per_epoch * c.warmup_epochs;
  sched.step_size = steps_per_epoch * c.step_epochs;

  EpochLogger logger(c.log_file);
  Progress progress(c.quiet, c.print_every > 0 ? c.print_every : std::max<int64_t>(1, steps_per_epoch / 10));
  if (!c.quiet) {
    std::printf("actlab-train: %s on %s (%lld train / %lld test images, %lldx%lldx%lld), %lld parameters\n",
                c.model.c_str(), data.note.c_str(), static_cast<long long>(data.train->size()),
                static_cast<long long>(data.test->size()), static_cast<long long>(spec.channels),
                static_cast<long long>(spec.height), static_cast<long long>(spec.width),
                static_cast<long long>(model->parameter_count()));
    std::printf("policy %s, batch %lld, %lld epochs x %lld steps, lr %g (%s), momentum %g, wd %g, %lld threads, seed %llu\n",
                policies.describe().c_str(), static_cast<long long>(c.batch_size), static_cast<long long>(c.epochs),
                static_cast<long long>(steps_per_epoch), c.lr, c.schedule.c_str(), c.momentum, c.weight_decay,
                static_cast<long long>(c.threads), static_cast<unsigned long long>(c.seed));
    std::fflush(stdout);
  }

  TrainSummary summary;
  summary.data_note = data.note;
  std::vector<double> all_rates;
  int64_t global_step = 0;
  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    model->train();
    train_loader.start_epoch(epoch);
    reset_peak();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    std::vector<double> rates;
    EpochRow row;
    row.epoch = epoch + 1;
    Batch batch;
    auto last = Clock::now();
    for (int64_t step = 0; step < steps_per_epoch && train_loader.next(batch); ++step, ++global_step) {
      const float lr = sched.lr_at(global_step);
      opt.set_lr(lr);
      row.lr = lr;
      const int64_t live_before = live_excluding_data(memory_stats());
      Variable logits, loss;
      {
        ActivationCacheScope scope(policies);
        MemTagScope tag(MemTag::Activation);
        logits = (*model)(Variable(batch.images));
        loss = cross_entropy(logits, batch.labels, static_cast<float>(c.label_smoothing));
      }
      const int64_t live_after = live_excluding_data(memory_stats());
      const int64_t act = live_after - live_before - static_cast<int64_t>(logits.data().nbytes()) -
                          static_cast<int64_t>(loss.data().nbytes()) +
                          static_cast<int64_t>(batch.images.nbytes());
      const float loss_value = loss.data().item();
      if (!std::isfinite(loss_value)) {
        Tape::current().clear();
        ACTLAB_FAIL("non-finite loss (", loss_value, ") at epoch ", epoch + 1, " step ", step + 1,
                    "; try a smaller --lr (now ", c.lr, ")");
      }
      const int64_t n = batch.labels.size(0);
      correct += count_correct(logits.data(), batch.labels);
      if (global_step == 0) {
        summary.saved_raw_bytes = summary.saved_packed_bytes = summary.saved_expected_bytes = 0;
        for (const auto& e : CacheStats::global().entries()) {
          if (e.op.find(".input") == std::string::npos) continue;  // lossy saves only
          summary.saved_raw_bytes += e.bytes_raw;
          summary.saved_packed_bytes += e.bytes_packed;
          summary.saved_expected_bytes += e.bytes_expected;
        }
      }
      logits = Variable();
      opt.zero_grad();
      {
        MemTagScope tag(MemTag::Activation);
        backward(loss);
      }
      loss = Variable();
      opt.step();
      if (global_step == 0) {
        CacheStats::global().set_enabled(false);
        if (!c.quiet) print_first_step_report(summary, act, c);
        if (!c.memory_report.empty()) write_memory_report(c.memory_report, CacheStats::global().entries());
      }
      loss_sum += static_cast<double>(loss_value) * static_cast<double>(n);
      seen += n;
      row.activation_bytes = act;
      summary.activation_bytes = act;
      const double dt = seconds_since(last);
      last = Clock::now();
      if (global_step > 0) rates.push_back(static_cast<double>(n) / dt);
      progress.step(epoch + 1, c.epochs, step + 1, steps_per_epoch, loss_sum / static_cast<double>(seen),
                    100.0 * static_cast<double>(correct) / static_cast<double>(seen),
                    rates.empty() ? static_cast<double>(n) / dt : rates.back(), memory_stats().total.current);
    }
    CacheStats::global().set_enabled(true);
    ACTLAB_CHECK(seen > 0, "epoch ", epoch + 1, " had no training batches");
    row.train_loss = loss_sum / static_cast<double>(seen);
    row.train_acc = 100.0 * static_cast<double>(correct) / static_cast<double>(seen);
    row.img_per_s = median(rates);
    row.peak_bytes = memory_stats().total.peak;
    const EvalResult ev = evaluate(*model, test_loader, data.test->name());
    row.test_loss = ev.loss;
    row.test_acc = ev.acc;
    row.wall_s = seconds_since(epoch_start);
    all_rates.insert(all_rates.end(), rates.begin(), rates.end());
    summary.peak_bytes = std::max(summary.peak_bytes, row.peak_bytes);
    summary.epochs.push_back(row);
    logger.write(row);
    progress.epoch_done(row, c.epochs);
  }
  summary.final_test_acc = summary.epochs.back().test_acc;
  summary.median_img_per_s = median(all_rates);
  summary.steps = global_step;
  summary.wall_s = seconds_since(run_start);
  if (!c.quiet) print_summary(summary, c);
  return summary;
}

}  // namespace actlab
