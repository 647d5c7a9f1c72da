// Config-file reading and the TrainConfig <-> key/value table behind it.
#include "actlab/train/config_file.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "actlab/core/error.h"
#include "actlab/core/precision.h"
#include "actlab/compress/policy.h"
#include "actlab/io/json.h"
#include "actlab/layers/optim/loss_scale.h"
#include "actlab/models/registry.h"
#include "actlab/train/cli.h"

namespace actlab {
namespace {

int64_t to_int(const std::string& key, const std::string& v) {
  int64_t x = 0;
  ACTLAB_CHECK(parse_int(v, &x), key, " needs an integer, got '", v, "'");
  return x;
}
double to_float(const std::string& key, const std::string& v) {
  double x = 0;
  ACTLAB_CHECK(parse_float(v, &x), key, " needs a number, got '", v, "'");
  return x;
}
bool to_bool(const std::string& key, const std::string& v) {
  bool x = false;
  ACTLAB_CHECK(parse_bool(v, &x), key, " needs true or false, got '", v, "'");
  return x;
}
std::string num(double v) {  // shortest text that reads back to v
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
std::string flag(bool v) { return v ? "true" : "false"; }

// The option table: each actlab-train option that is part of a run's configuration is declared here
// once: its key (the long flag name and the config-file key), its kind, its help text, how to set
// the TrainConfig field from text and how to print it. The default is the field's value in a
// default-constructed TrainConfig. From this table come the flags and --help of actlab-train
// (add_config_flags), the config-file keys, the effective-configuration text and the JSON stored in
// logs and checkpoints. Range checks of the values live in validate() (train/trainer.cpp), which
// also checks the combinations, and check_value_alone() below applies it to one key.
struct Field {
  const char* key;
  const char* kind;  // FlagParser kinds: "string", "int", "float", "bool"
  std::string help;
  std::function<void(TrainConfig&, const std::string&)> set;
  std::function<std::string(const TrainConfig&)> get;
  bool repeatable = false;
  // A file or directory: not range-checked alone, since whether it may be used depends on --overwrite
  // and --resume, which validate() sees together.
  bool path = false;
};

// A row for a path option (Field::path).
Field path_field(Field f) {
  f.path = true;
  return f;
}

#define ACTLAB_STR(k, f, help) {k, "string", help, [](TrainConfig& c, const std::string& v) { c.f = v; }, \
                                [](const TrainConfig& c) { return c.f; }}
#define ACTLAB_INT(k, f, help) {k, "int", help, [](TrainConfig& c, const std::string& v) { c.f = to_int(k, v); }, \
                                [](const TrainConfig& c) { return std::to_string(c.f); }}
#define ACTLAB_FLT(k, f, help) {k, "float", help, [](TrainConfig& c, const std::string& v) { c.f = to_float(k, v); }, \
                                [](const TrainConfig& c) { return num(c.f); }}
#define ACTLAB_BOOL(k, f, help) {k, "bool", help, [](TrainConfig& c, const std::string& v) { c.f = to_bool(k, v); }, \
                                 [](const TrainConfig& c) { return flag(c.f); }}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::string models;
    for (const auto& m : model_names()) models += (models.empty() ? "" : ", ") + m.first;
    return std::vector<Field>{
        ACTLAB_STR("model", model, "model: " + models),
        ACTLAB_STR("dataset", dataset, "data set: fashion-mnist, mnist, cifar10, cifar100, folder, synthetic"),
        path_field(ACTLAB_STR("data-dir", data_dir,
                   "directory of the data set files (default: Debian's Fashion-MNIST; for CIFAR the directory "
                   "scripts/get-cifar.sh fills, ~/.cache/actlab/cifar or $ACTLAB_CIFAR_DIR)")),
        ACTLAB_INT("image-size", image_size, "folder data set: resize/crop images to this size"),
        ACTLAB_INT("image-channels", image_channels, "folder data set: 1 (grey) or 3 (RGB)"),
        ACTLAB_FLT("test-fraction", test_fraction, "folder data set without train/ and test/ (or val/): held-out share per class, in (0, 1) (one fixed draw, the same for every --seed)"),
        ACTLAB_BOOL("stream", stream,
                    "folder data set: keep only the file list in memory and decode images as batches need them "
                    "(--data-workers threads, 2 batches ahead) instead of all up front, for folders too large to "
                    "hold decoded; training crops are then RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3) + flip and "
                    "test images Resize(size*256/224) + CenterCrop(size), torchvision's ImageNet recipe (with "
                    "--no-augment both are the plain centre crop), normalization from 512 sampled images"),
        ACTLAB_INT("data-workers", data_workers,
                   "threads that read and transform each batch; 0: 1, or with --stream half the CPU threads "
                   "(1 to 8); the batches are the same for any number"),
        ACTLAB_BOOL("coarse", cifar100_coarse, "cifar100: the 20 coarse labels"),
        ACTLAB_INT("synthetic-size", synthetic_size, "training images of --dataset synthetic"),
        ACTLAB_INT("epochs", epochs, "training epochs"),
        ACTLAB_INT("batch-size", batch_size, "mini-batch size"),
        ACTLAB_FLT("lr", lr, "initial learning rate (SGD; AdamW is usually run at about 1e-3)"),
        ACTLAB_STR("optimizer", optimizer,
                   "sgd (torch.optim.SGD: momentum, Nesterov, weight decay added to the gradient) or adamw "
                   "(torch.optim.AdamW: decoupled weight decay on every parameter, bias-corrected moments)"),
        ACTLAB_FLT("momentum", momentum, "SGD momentum"),
        ACTLAB_FLT("weight-decay", weight_decay,
                   "weight decay: SGD adds wd*w to the gradient, AdamW shrinks w by lr*wd*w each step (ViTs: ~0.05)"),
        ACTLAB_BOOL("nesterov", nesterov, "SGD: Nesterov momentum"),
        ACTLAB_FLT("adam-beta1", adam_beta1, "AdamW: decay of the first moment"),
        ACTLAB_FLT("adam-beta2", adam_beta2, "AdamW: decay of the second moment"),
        ACTLAB_FLT("adam-eps", adam_eps, "AdamW: added to the second moment's root"),
        ACTLAB_BOOL("no-decay-norm-bias", no_decay_norm_bias,
                    "no weight decay on biases, normalization weights and the transformers' embeddings (cls_token, "
                    "pos_embed, relative position tables), as timm's and torchvision's ViT/Swin recipes; off: every "
                    "parameter decays"),
        ACTLAB_STR("schedule", schedule, "learning-rate schedule: cosine, step (x0.1 every --step-epochs), constant"),
        ACTLAB_INT("step-epochs", step_epochs, "step schedule: epochs between decays"),
        ACTLAB_INT("warmup-epochs", warmup_epochs, "linear learning-rate warm-up epochs"),
        ACTLAB_FLT("label-smoothing", label_smoothing, "label smoothing of the cross-entropy"),
        ACTLAB_FLT("drop-path", drop_path,
                   "stochastic depth of vit_tiny_cifar and swin_t: the deepest block's rate, spread over the blocks "
                   "as timm/torchvision do; 0 turns it off; -1: the model's own (0.1 and 0.2)"),
        {"seed", "int", "random seed (init, shuffling, augmentation, stochastic rounding)",
         [](TrainConfig& c, const std::string& v) {
           const int64_t s = to_int("seed", v);
           ACTLAB_CHECK(s >= 0, "seed must be >= 0, got ", s);
           c.seed = static_cast<uint64_t>(s);
         },
         [](const TrainConfig& c) { return std::to_string(c.seed); }},
        ACTLAB_INT("threads", threads, "CPU threads"),
        ACTLAB_STR("device", device,
                   "where to train: cpu, cuda or cuda:N (a build with the CUDA backend and an NVIDIA GPU)"),
        ACTLAB_BOOL("cudnn-benchmark", cudnn_benchmark,
                    "GPU: time every cuDNN convolution algorithm on a shape's first use and keep the fastest (like "
                    "torch.backends.cudnn.benchmark); off: cuDNN's heuristic first choice"),
        ACTLAB_BOOL("deterministic", deterministic,
                    "GPU: only the cuDNN algorithms that give the same bits on every run (like "
                    "torch.backends.cudnn.deterministic; the fastest backward ones add with atomics). CPU runs are "
                    "deterministic already"),
        ACTLAB_BOOL("tf32", tf32, "GPU: TF32 tensor cores for fp32 convolutions and GEMMs (10-bit mantissa products)"),
        ACTLAB_STR("policy", policy, "activation-cache policy, one of\n" + policy_forms() + "\n" + checkpoint_forms()),
        {"precision", "string",
         "compute precision: fp32, or bf16 (convolutions, linear layers and matmuls in bf16 with fp32 accumulation, exact saves kept "
         "in bf16, fp32 master weights; a CPU with avx512_bf16 or amx_bf16); fp16 needs a GPU. docs/precision.md",
         // Stored by its canonical name ("f32" as "fp32"), so that a resume compares precisions, not spellings;
         // an unknown name is kept as given for validation's error.
         [](TrainConfig& c, const std::string& v) { c.precision = canonical_precision_name(v); },
         [](const TrainConfig& c) { return c.precision; }},
        ACTLAB_STR("loss-scale", loss_scale,
                   "loss scaling: auto (dynamic under fp16, none otherwise), " + loss_scale_forms() +
                       "; gradients are unscaled before the update. docs/precision.md"),
        {"policy-rule", "string", "per-module override PATTERN=POLICY, e.g. conv1=exact, 'layer1.*=quant:Q=4' or 'layer1.*=checkpoint'; "
         "a PATTERN with a '/' names saves as MODULE/OP/ROLE, e.g. '*/softmax/*=exact'",
         [](TrainConfig& c, const std::string& v) { c.policy_rules.push_back(v); },
         [](const TrainConfig&) { return std::string(); },  // printed per rule by config_entries
         true},
        {"no-augment", "bool", "disable training augmentation",
         [](TrainConfig& c, const std::string& v) { c.augment = !to_bool("no-augment", v); },
         [](const TrainConfig& c) { return flag(!c.augment); }},
        ACTLAB_INT("steps-per-epoch", steps_per_epoch, "stop each epoch after N steps (0: full epochs)"),
        ACTLAB_INT("train-limit", train_limit, "use only N training images, the first N (a folder data set: N spread evenly over its class-sorted list, every class keeping its share) (0: all)"),
        ACTLAB_INT("test-limit", test_limit, "evaluate on N test images, chosen as --train-limit chooses (0: all)"),
        path_field(ACTLAB_STR("log", log_file,
                              "per-epoch log file: JSON Lines where the name ends in .jsonl or .json, CSV otherwise (a resume "
                              "appends to its own run's log only)")),
        path_field(ACTLAB_STR("memory-report", memory_report,
                              "per-layer saved-tensor table of the first step: JSON where the name ends in .json, CSV otherwise")),
        path_field(ACTLAB_STR("summary-json", summary_json,
                   "write the final summary (accuracy, img/s, memory, per-epoch rows) as JSON")),
        ACTLAB_BOOL("overwrite", overwrite,
                    "allow replacing an existing log (a resume's: one not its own run's) or memory report, and a "
                    "--summary-json or --export-weights file that is not an earlier run's"),
        ACTLAB_INT("print-every", print_every, "progress line every N steps (0: about 10 per epoch)"),
        path_field(ACTLAB_STR("save-dir", save_dir,
                   "write DIR/last.safetensors every epoch and DIR/best.safetensors on a new best")),
        ACTLAB_BOOL("eval-only", eval_only,
                    "with --resume or --init-weights: evaluate those weights on the test split, no training"),
        path_field(ACTLAB_STR("init-weights", init_weights,
                   "start from the weights of a plain safetensors state dict (torchvision names; e.g. from "
                   "--export-weights or PyTorch's safetensors.torch.save_file), every name and shape checked")),
        path_field(ACTLAB_STR("export-weights", export_weights,
                   "write the final weights as a plain safetensors state dict that PyTorch's "
                   "load_state_dict(strict=True) takes (no optimizer state)")),
        ACTLAB_BOOL("quiet", quiet, "print only errors"),
        ACTLAB_STR("on-nonfinite", on_nonfinite,
                   "a NaN/Inf loss or gradient: stop (save the last good state to --save-dir, name the step and "
                   "layer, exit 2) or skip-step (drop that update; stop after " +
                       std::to_string(kMaxConsecutiveSkips) + " in a row)"),
        ACTLAB_BOOL("check-memory", check_memory,
                    "check after every step that live bytes per tag return to the same value and the peak does not grow"),
        ACTLAB_STR("memory-limit", memory_limit,
                   "cap the live bytes on the device (e.g. 2GiB): past it the run fails with out of memory, as a "
                   "smaller GPU would (try batch sizes against it to find the one that fits)"),
        ACTLAB_BOOL("distributed", distributed,
                    "data-parallel training, one process per rank (mpirun -np N actlab-train --distributed ...): "
                    "--batch-size is per rank, each rank reads a disjoint shard, gradients are averaged"),
        ACTLAB_FLT("bucket-mib", bucket_mib, "--distributed: MiB of gradients per all-reduce bucket"),
        ACTLAB_FLT("bucket-tail-mib", bucket_tail_mib,
                   "--distributed: the last buckets shrink towards this many MiB (each takes at most half of the "
                   "gradient bytes still to come), so the all-reduce left for after backward is small; 0: every "
                   "bucket up to --bucket-mib"),
        ACTLAB_BOOL("sync-bn", sync_bn,
                    "--distributed on CPU ranks: batch-norm mean and variance over every rank's batch (all-reduced "
                    "in forward and backward) instead of each rank's own"),
        ACTLAB_FLT("dist-timeout", dist_timeout,
                   "--distributed: seconds a collective may wait for the other ranks before the run fails"),
    };
  }();
  return table;
}
#undef ACTLAB_STR
#undef ACTLAB_INT
#undef ACTLAB_FLT
#undef ACTLAB_BOOL

const Field* find_field(const std::string& key) {
  for (const auto& f : fields())
    if (key == f.key) return &f;
  return nullptr;
}

constexpr const char* kBlank = " \t\r";  // what a config line's key and value are trimmed of

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(kBlank);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(kBlank) - b + 1);
}

// Range checks of one value on its own: validate() on the defaults with only this key changed. Paths,
// and --overwrite which only matters for them, are checked later, all together.
void check_value_alone(const std::string& key, const std::string& value) {
  const Field* f = find_field(key);
  if (f != nullptr && (f->path || key == "overwrite")) return;
  TrainConfig d;
  set_config_value(d, key, value);
  if (key == "warmup-epochs") d.epochs = d.warmup_epochs + 1;
  if (key == "nesterov") d.momentum = 0.9;
  if (key == "drop-path") d.model = "vit_tiny_cifar";  // whether the file's model has one is checked with it
  // Keys valid only beside another key's value (checked with it): without these a run's own side file
  // (<log>.config.txt, every key written) of a streamed, coarse-label or synchronized-BN run could not be read.
  if (key == "stream") d.dataset = "folder";
  if (key == "coarse") d.dataset = "cifar100";
  if (key == "sync-bn") d.distributed = true;
  validate(d);
}

}  // namespace

bool is_config_key(const std::string& key) { return find_field(key) != nullptr; }

bool is_output_file_key(const std::string& key) {
  static const std::set<std::string> keys = {"log", "memory-report", "summary-json", "export-weights"};
  return keys.count(key) > 0;
}

bool is_output_key(const std::string& key) {
  static const std::set<std::string> keys = {"quiet", "print-every", "overwrite", "check-memory"};
  return keys.count(key) > 0 || is_output_file_key(key);
}

bool is_placement_or_output_key(const std::string& key) {
  static const std::set<std::string> placement = {"device",       "threads",      "data-workers",
                                                  "data-dir",     "dist-timeout", "memory-limit"};
  return placement.count(key) > 0 || is_output_key(key);
}

std::string config_differences(const TrainConfig& a, const TrainConfig& b, const std::set<std::string>& also_free) {
  const auto as_map = [](const TrainConfig& c) {
    std::map<std::string, std::string> m;
    for (const auto& [key, value] : config_entries(c)) m[key] += (m.count(key) ? " " : "") + value;
    return m;
  };
  const auto ma = as_map(a), mb = as_map(b);
  // Both sides' keys: a repeated key (--policy-rule) that only b has is listed by neither map's
  // defaults, and walking a's keys alone let a rank with no rules accept rank 0's.
  std::set<std::string> keys;
  for (const auto& entry : ma) keys.insert(entry.first);
  for (const auto& entry : mb) keys.insert(entry.first);
  const auto value_of = [](const std::map<std::string, std::string>& m, const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? std::string() : it->second;
  };
  std::string out;
  for (const std::string& key : keys) {
    const std::string value = value_of(ma, key), before = value_of(mb, key);
    if (value != before && !is_placement_or_output_key(key) && !also_free.count(key))
      out += (out.empty() ? "" : ", ") + ("--" + key + " '" + value + "' (was '" + before + "')");
  }
  return out;
}

void add_config_flags(FlagParser& flags) {
  const TrainConfig defaults;
  for (const auto& f : fields()) {
    std::string def = f.get(defaults);
    if (std::string(f.kind) == "bool" && def == "false") def = "";  // a switch: no default shown
    flags.add(f.key, f.kind, def, f.help, f.repeatable);
  }
}

void set_config_value(TrainConfig& c, const std::string& key, const std::string& value) {
  const Field* f = find_field(key);
  ACTLAB_CHECK(f != nullptr, "unknown key '", key, "' (keys are actlab-train's long flag names, e.g. batch-size)");
  f->set(c, value);
}

std::vector<std::pair<std::string, std::string>> config_entries(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : fields()) {
    if (std::string(f.key) == "policy-rule") {
      for (const auto& r : c.policy_rules) out.emplace_back(f.key, r);
    } else {
      out.emplace_back(f.key, f.get(c));
    }
  }
  return out;
}

namespace {
// A value as a config line holds it: as it is, or in double quotes (with \" and \\) where it has a '#' (a
// comment otherwise), starts with a quote, or has spaces at either end (trimmed otherwise): `save-dir = "run #1"`.
std::string config_value_text(const std::string& v) {
  const bool plain = v.find('#') == std::string::npos && trim(v) == v && (v.empty() || v.front() != '"');
  if (plain) return v;
  std::string q = "\"";
  for (const char ch : v) q += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
  return q + "\"";
}

}  // namespace

std::string config_to_text(const TrainConfig& c) {
  std::string s;
  for (const auto& e : config_entries(c)) s += e.first + " = " + config_value_text(e.second) + "\n";
  return s;
}

std::string config_to_json(const TrainConfig& c) {
  JsonWriter w;
  w.begin_object();
  for (const auto& f : fields()) {
    w.key(f.key);
    if (std::string(f.key) == "policy-rule") {
      w.begin_array();
      for (const auto& rule : c.policy_rules) w.value(rule);
      w.end_array();
    } else {
      w.value(f.get(c));
    }
  }
  return w.end_object().str();
}

TrainConfig config_from_json(const std::string& json) {
  const JsonValue root = parse_json(json, "stored configuration");
  ACTLAB_CHECK(root.kind == JsonValue::Kind::Object, "stored configuration is not a JSON object");
  TrainConfig c;
  for (const auto& m : root.members) {
    if (m.second.kind == JsonValue::Kind::Array) {
      ACTLAB_CHECK(m.first == "policy-rule", "stored configuration: '", m.first, "' is an array");
      for (const auto& r : m.second.items) {
        ACTLAB_CHECK(r.kind == JsonValue::Kind::String, "stored configuration: policy-rule entries must be strings");
        set_config_value(c, m.first, r.string);
      }
      continue;
    }
    ACTLAB_CHECK(m.second.kind == JsonValue::Kind::String, "stored configuration: '", m.first, "' is not a string");
    set_config_value(c, m.first, m.second.string);
  }
  return c;
}

namespace {
// Text of a config line as an error quotes it: at most 60 bytes, anything but printable ASCII as '?', so a
// binary file named by --config gives one short line, not its bytes.
std::string excerpt(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 60; ++i) out += text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
  return text.size() > 60 ? out + "..." : out;
}

// The value after a line's '=': a quoted one up to its closing quote (then only a comment may follow), or
// the text up to a '#' (a comment), trimmed.
std::string config_value_of(const std::string& rest) {
  const std::string v = trim(rest);
  if (v.empty() || v.front() != '"') return trim(v.substr(0, v.find('#')));
  std::string out;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] == '\\' && i + 1 < v.size() && (v[i + 1] == '"' || v[i + 1] == '\\')) {
      out += v[++i];
    } else if (v[i] == '"') {
      const std::string after = trim(v.substr(i + 1));
      ACTLAB_CHECK(after.empty() || after.front() == '#', "text after the closing quote: '", excerpt(after), "'");
      return out;
    } else {
      out += v[i];
    }
  }
  ACTLAB_FAIL("a quoted value without its closing quote");
}
}  // namespace

void apply_config_file(TrainConfig& c, const std::string& path, const std::set<std::string>& skip) {
  ACTLAB_CHECK(!std::filesystem::is_directory(path), "config file '", path, "' is a directory");  // reads as empty
  std::ifstream file(path, std::ios::binary);
  ACTLAB_CHECK(file.good(), "cannot read config file '", path, "'");
  // Read whole, with a bound: a config is a few dozen lines, and a path like /dev/zero (or a file that is
  // no config) would otherwise be read until memory runs out. A pipe (--config <(...)) reads as a file does.
  constexpr size_t kMaxBytes = 1 << 20;
  std::string text(kMaxBytes + 1, '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(file.gcount()));
  ACTLAB_CHECK(text.size() <= kMaxBytes, "config file '", path, "' is larger than 1 MiB: not a config file");
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a UTF-8 byte-order mark (some editors write one)
  std::istringstream in(text);
  std::string line;
  int number = 0;
  bool rules_reset = false;
  while (std::getline(in, line)) {
    ++number;
    const size_t hash = line.find('#'), eq = line.find('=');
    const std::string body = trim(hash == std::string::npos ? line : line.substr(0, hash));
    if (body.empty()) continue;
    try {
      ACTLAB_CHECK(eq < hash, "expected 'key = value', got '", excerpt(body), "'");
      const std::string key = trim(line.substr(0, eq)), value = config_value_of(line.substr(eq + 1));
      ACTLAB_CHECK(!key.empty(), "missing key before '='");
      ACTLAB_CHECK(key != "config" && key != "resume" && key != "summary",
                   "'", key, "' cannot be set in a config file (command line only)");
      ACTLAB_CHECK(is_config_key(key), "unknown key '", excerpt(key), "' (keys are actlab-train's long flag names)");
      check_value_alone(key, value);
      if (skip.count(key)) continue;
      if (key == "policy-rule" && !rules_reset) {
        c.policy_rules.clear();
        rules_reset = true;
      }
      set_config_value(c, key, value);
    } catch (const Error& e) {
      throw Error(path + ":" + std::to_string(number) + ": " + e.what());
    }
  }
  ACTLAB_CHECK(!in.bad(), "reading config file '", path, "' failed");
}

}  // namespace actlab
