// Config files: `key = value` lines with comments, repeatable policy-rule, command-line override,
// errors naming FILE:LINE, and the text/JSON forms of the effective configuration round-tripping.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "actlab/core/error.h"
#include "actlab/train/config_file.h"

using namespace actlab;

namespace {

struct ConfFile {
  std::string path;
  explicit ConfFile(const std::string& text)
      : path((std::filesystem::temp_directory_path() / ("actlab_conf_" + std::to_string(::getpid()) + ".conf")).string()) {
    std::ofstream(path) << text;
  }
  ~ConfFile() { std::filesystem::remove(path); }
};

std::string error_of_file(const std::string& text) {
  ConfFile f(text);
  TrainConfig c;
  try {
    apply_config_file(c, f.path);
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.rfind(f.path + ":", 0) == 0);  // starts with FILE:
    return msg.substr(f.path.size());
  }
  return "";
}

}  // namespace

TEST_CASE("config file: values, comments, repeatable rules and command-line override") {
  ConfFile f(
      "# a ResNet-18 run\n"
      "\n"
      "model = resnet18\n"
      "  policy = division:B=8,Q=2   # the paper's setting\n"
      "policy-rule = conv1=exact\n"
      "policy-rule = fc=exact\n"
      "lr=0.05\n"
      "nesterov = true\n"
      "no-augment = yes\n"
      "epochs = 7\n");
  TrainConfig c;
  c.policy_rules = {"from=elsewhere"};
  apply_config_file(c, f.path, {"epochs"});  // --epochs was given on the command line
  CHECK(c.model == "resnet18");
  CHECK(c.policy == "division:B=8,Q=2");
  CHECK(c.policy_rules == std::vector<std::string>{"conv1=exact", "fc=exact"});
  CHECK(c.lr == 0.05);
  CHECK(c.nesterov);
  CHECK(!c.augment);
  CHECK(c.epochs == 1);  // the file's value was checked but not applied
}

TEST_CASE("config file: unknown keys and bad values name the file and line") {
  CHECK(error_of_file("model = resnet20\n# fine\nbatchsize = 4\n").rfind(":3: unknown key 'batchsize'", 0) == 0);
  CHECK(error_of_file("epochs = ten\n").rfind(":1: epochs needs an integer, got 'ten'", 0) == 0);
  CHECK(error_of_file("\nbatch-size = 0\n").rfind(":2: batch size must be >= 1", 0) == 0);
  CHECK(error_of_file("lr 0.1\n").rfind(":1: expected 'key = value'", 0) == 0);
  CHECK(error_of_file("model = resnet7\n").find("resnet7") != std::string::npos);
  CHECK(error_of_file("policy = zip:Q=2\n").rfind(":1:", 0) == 0);
  CHECK(error_of_file("nesterov = maybe\n").rfind(":1: nesterov needs true or false", 0) == 0);
  CHECK(error_of_file("resume = x.safetensors\n").find("command line only") != std::string::npos);
  CHECK(error_of_file("warmup-epochs = 3\n").empty());  // valid alone; checked against epochs later
  // Quoted values (config_to_text writes a value with '#' or end spaces so): closed, then only a comment.
  CHECK(error_of_file("log = \"a #1.csv\"  # the log\n").empty());
  CHECK(error_of_file("log = \"a.csv\n").find(":1: a quoted value without its closing quote") != std::string::npos);
  CHECK(error_of_file("log = \"a\" b.csv\n").find(":1: text after the closing quote: 'b.csv'") != std::string::npos);
  TrainConfig c;
  CHECK_THROWS_WITH_AS(apply_config_file(c, "/nonexistent/actlab.conf"), doctest::Contains("cannot read"), Error);
}

TEST_CASE("config: the effective configuration round-trips through text and JSON") {
  TrainConfig c;
  c.model = "wrn28_10";
  c.dataset = "cifar10";
  c.lr = 0.1 / 3;
  c.seed = 42;
  c.policy_rules = {"conv1=exact", "layer1.*=quant:Q=4"};
  c.augment = false;
  c.save_dir = "runs/a b";
  c.log_file = "log #1 \"quoted\" \\ .csv ";  // a '#', quotes, a backslash, a trailing space: written quoted
  ConfFile f(config_to_text(c));
  TrainConfig from_text;
  apply_config_file(from_text, f.path);
  const TrainConfig from_json = config_from_json(config_to_json(c));
  CHECK(config_entries(from_text) == config_entries(c));
  CHECK(config_entries(from_json) == config_entries(c));
  CHECK(from_json.lr == c.lr);  // bit-exact number text
  // A transformer's own keys, which validate() alone would check against the default model.
  TrainConfig vit;
  vit.model = "vit_tiny_cifar";
  vit.drop_path = 0.05;
  vit.no_decay_norm_bias = true;
  ConfFile vf(config_to_text(vit));
  TrainConfig vit_read;
  apply_config_file(vit_read, vf.path);
  CHECK(config_entries(vit_read) == config_entries(vit));
  CHECK(vit_read.drop_path == 0.05);
  // Keys that validate() alone checks against another key's default: a streamed image folder, CIFAR-100's
  // coarse labels, synchronized batch norm. Their runs' side files were unreadable.
  for (int k = 0; k < 3; ++k) {
    TrainConfig r;
    if (k == 0) r.dataset = "folder", r.data_dir = "images", r.stream = true;
    if (k == 1) r.dataset = "cifar100", r.cifar100_coarse = true;
    if (k == 2) r.distributed = true, r.sync_bn = true;
    CAPTURE(k);
    ConfFile rf(config_to_text(r));
    TrainConfig read;
    apply_config_file(read, rf.path);
    CHECK(config_entries(read) == config_entries(r));
  }
  CHECK_THROWS_AS(config_from_json("{\"epochs\": 3}"), Error);  // values are strings
  CHECK_THROWS_AS(config_from_json("{\"frobnicate\": \"3\"}"), Error);
}

TEST_CASE("config file: docs/example.conf is valid") {
  TrainConfig c;
  apply_config_file(c, std::string(ACTLAB_SOURCE_DIR) + "/docs/example.conf");
  CHECK(c.model == "resnet18");
  CHECK(c.policy_rules.size() == 2);
  CHECK_NOTHROW(validate(c));
}

TEST_CASE("option table: actlab-train's flags are the config keys, with TrainConfig's defaults") {
  FlagParser flags("actlab-train", "test");
  add_config_flags(flags);
  const TrainConfig defaults;
  const auto entries = config_entries(defaults);
  const auto declared = flags.effective();
  std::set<std::string> keys;
  for (const auto& e : entries) keys.insert(e.first);
  keys.insert("policy-rule");  // no entry while the default has no rule
  REQUIRE(declared.size() == keys.size());
  for (const auto& d : declared) {
    CAPTURE(d.first);
    CHECK(is_config_key(d.first));
    CHECK(keys.count(d.first) == 1);
  }
  // The flags' defaults read back into a TrainConfig give the default configuration exactly.
  TrainConfig from_flags;
  for (const auto& e : entries) {
    const std::string v = flags.get(e.first);
    set_config_value(from_flags, e.first, v.empty() && e.second == "false" ? "false" : v);
  }
  CHECK(config_to_json(from_flags) == config_to_json(defaults));
  // A parsed command line sets the same fields as the same keys in a config file would.
  const char* argv[] = {"actlab-train", "--batch-size", "64", "--nesterov", "--policy-rule", "conv1=exact",
                        "--policy-rule", "fc=quant:Q=4", "--weight-decay=1e-3"};
  REQUIRE(flags.parse(9, argv));
  CHECK(flags.get_int("batch-size") == 64);
  CHECK(flags.get_bool("nesterov"));
  CHECK(flags.get_all("policy-rule").size() == 2);
  CHECK(flags.get_float("weight-decay") == 1e-3);
  CHECK(flags.help().find("--memory-limit") != std::string::npos);
}

TEST_CASE("config differences: a key only one side has counts, whichever side has it") {
  // A rank without rules compares its configuration with rank 0's: rank 0's rule must be named, not
  // just a rule the comparing side has (the comparison used to walk the first side's keys alone).
  TrainConfig plain, ruled;
  ruled.policy_rules = {"blocks.0.attn=exact"};
  CHECK(config_differences(plain, plain).empty());
  CHECK(config_differences(ruled, plain) == "--policy-rule 'blocks.0.attn=exact' (was '')");
  CHECK(config_differences(plain, ruled) == "--policy-rule '' (was 'blocks.0.attn=exact')");
  TrainConfig other_lr = plain;
  other_lr.lr = 0.5;
  CHECK(config_differences(other_lr, plain).find("--lr '0.5'") == 0);
  other_lr.threads = plain.threads + 1;  // placement: free to differ
  CHECK(config_differences(other_lr, plain).find("threads") == std::string::npos);
}
