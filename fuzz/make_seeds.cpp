// fuzz_make_seeds OUT_DIR: writes the seed inputs of every fuzz target, small but in the real
// formats, to OUT_DIR/<target>/seed-* (the committed fuzz/corpus/ came from it:
// `build/fuzz_make_seeds fuzz/corpus`). Deterministic: the same files on every run.
// The input layouts are described in each fuzz/<target>.cpp.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <stb_image_write.h>

#include "actlab/autograd/functions.h"
#include "fuzz/tiny_model.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/config_file.h"

namespace {

using Bytes = std::vector<uint8_t>;
namespace fs = std::filesystem;

fs::path g_out;

void put(const std::string& target, const std::string& name, const Bytes& bytes) {
  const fs::path p = g_out / target / ("seed-" + name);
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                           static_cast<std::streamsize>(bytes.size()));
  std::printf("%s (%zu bytes)\n", p.c_str(), bytes.size());
}
void put_text(const std::string& target, const std::string& name, uint8_t mode, const std::string& text) {
  Bytes b{mode};
  b.insert(b.end(), text.begin(), text.end());
  put(target, name, b);
}
void be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}
Bytes gzip(const Bytes& in) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);  // 16+: gzip wrapper
  Bytes out(deflateBound(&z, in.size()) + 32);
  z.next_in = const_cast<uint8_t*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// ---- idx: u16 LE images length, the images file, the labels file.
Bytes idx_images(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes b;
  be32(b, 0x803);
  be32(b, count);
  be32(b, rows);
  be32(b, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) b.push_back(static_cast<uint8_t>(i * 37));
  return b;
}
Bytes idx_labels(const Bytes& labels) {
  Bytes b;
  be32(b, 0x801);
  be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}
Bytes idx_pair(const Bytes& images, const Bytes& labels) {
  Bytes b{static_cast<uint8_t>(images.size()), static_cast<uint8_t>(images.size() >> 8)};
  b.insert(b.end(), images.begin(), images.end());
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void idx_seeds() {
  put("idx", "raw-3x4x5", idx_pair(idx_images(3, 4, 5), idx_labels({0, 9, 3})));
  put("idx", "raw-2x28x28", idx_pair(idx_images(2, 28, 28), idx_labels({7, 1})));
  put("idx", "gzip-images", idx_pair(gzip(idx_images(2, 6, 3)), idx_labels({4, 2})));
  put("idx", "gzip-both", idx_pair(gzip(idx_images(1, 3, 3)), gzip(idx_labels({5}))));
  put("idx", "swapped", idx_pair(idx_labels({1, 2}), idx_images(2, 2, 2)));
}

// ---- cifar: mode byte, then the test file.
void cifar_seeds() {
  for (const int mode : {0, 1, 3, 4, 5}) {
    const bool hundred = mode & 1;
    Bytes b{static_cast<uint8_t>(mode)};
    for (int r = 0; r < 2; ++r) {
      b.push_back(static_cast<uint8_t>(hundred ? 7 + r : 3 + r));  // CIFAR-100: coarse, then fine
      if (hundred) b.push_back(static_cast<uint8_t>(42 + r));
      for (int i = 0; i < 3072; ++i) b.push_back(static_cast<uint8_t>((i * 13 + r) & 0xff));
    }
    put("cifar", "mode" + std::to_string(mode) + "-2records", b);
  }
}

// ---- image_folder: options byte, size byte, the image file.
void append_bytes(void* context, void* data, int size) {
  auto* b = static_cast<Bytes*>(context);
  b->insert(b->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
}
void image_seeds() {
  const int w = 7, h = 5;
  std::vector<uint8_t> rgb(w * h * 3), grey(w * h);
  for (int i = 0; i < w * h * 3; ++i) rgb[i] = static_cast<uint8_t>(i * 29);
  for (int i = 0; i < w * h; ++i) grey[i] = static_cast<uint8_t>(i * 11);
  struct Encoded {
    const char* name;
    uint8_t options, size;
    Bytes bytes;
  };
  // PNG, JPEG and BMP only: anything else is refused before stb sees it (data/image_bytes.h).
  std::vector<Encoded> images = {{"png-rgb", 0x01, 4, {}}, {"png-grey", 0x02, 9, {}}, {"bmp-rgb", 0x13, 3, {}},
                                 {"jpg-rgb", 0x09, 4, {}}, {"jpg-grey", 0x08, 2, {}}};
  stbi_write_png_to_func(append_bytes, &images[0].bytes, w, h, 3, rgb.data(), w * 3);
  stbi_write_png_to_func(append_bytes, &images[1].bytes, w, h, 1, grey.data(), w);
  stbi_write_bmp_to_func(append_bytes, &images[2].bytes, w, h, 3, rgb.data());
  stbi_write_jpg_to_func(append_bytes, &images[3].bytes, w, h, 3, rgb.data(), 90);
  stbi_write_jpg_to_func(append_bytes, &images[4].bytes, w, h, 1, grey.data(), 50);
  for (const Encoded& e : images) {
    Bytes b{e.options, e.size};
    b.insert(b.end(), e.bytes.begin(), e.bytes.end());
    put("image_folder", e.name, b);
  }
}

// ---- safetensors: checkpoint files.
Bytes file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void safetensors_seeds() {
  using namespace actlab;
  seed_init(1);
  auto model = fuzz::make_tiny_model();
  Sgd opt(model->parameters(), SgdOptions{});
  PhiloxStream rng(2, 3);
  const Tensor images = Tensor::randn({4, 1, 4, 4}, rng);
  Tensor labels = Tensor::empty({4}, DType::I64);
  for (int i = 0; i < 4; ++i) labels.data<int64_t>()[i] = i % 3;
  Variable loss = cross_entropy((*model)(Variable(images)), labels);
  opt.zero_grad();
  backward(loss);
  opt.step();  // creates the momentum buffers
  TrainState st;
  st.model = "tiny";
  st.epoch = 1;
  st.global_step = 1;
  st.config_json = config_to_json(TrainConfig{});
  const fs::path tmp = fs::temp_directory_path() / "actlab_make_seeds.safetensors";
  save_checkpoint(tmp.string(), *model, opt, st);
  put("safetensors", "checkpoint", file_bytes(tmp));
  NamedTensors all_dtypes;
  for (const DType d : {DType::F32, DType::BF16, DType::F16, DType::U8, DType::I32, DType::I64})
    all_dtypes.emplace_back(std::string("t_") + dtype_name(d), Tensor::zeros({2, 1}, d));
  all_dtypes.emplace_back("empty", Tensor::zeros({0, 3}, DType::F32));
  write_safetensors(tmp.string(), all_dtypes, {{"note", "every dtype"}});
  put("safetensors", "dtypes", file_bytes(tmp));
  write_safetensors(tmp.string(), {}, {});
  put("safetensors", "no-tensors", file_bytes(tmp));
  fs::remove(tmp);
}

// ---- policy: lines (default policy, rules, module path).
void policy_seeds() {
  const char* const specs[] = {
      "exact",
      "division:B=8,Q=2\nconv1=exact\nlayer1.*=quant:Q=4\nlayer1.0.conv1",
      "quant:Q=8\n*.bn?=lfc:B=3\nlayer2.1.bn1",
      "hfc:B=2,Q=1\nfc=hfc:B=4\nfc",
      "pergroup:G=7,Q=1\n*=division:B=1,Q=8\n**a*b=exact\naXb",
      "lfc:B=3",
  };
  int k = 0;
  for (const char* s : specs) {
    const std::string text(s);
    put("policy", std::to_string(k++), Bytes(text.begin(), text.end()));
  }
}

// ---- config: mode byte (even: config file, odd: stored JSON), then the text.
void config_seeds() {
  put_text("config", "file-basic", 0,
           "# a run\nmodel = resnet20\nepochs = 3   # trailing comment\nbatch-size=64\nlr = 0.05\n"
           "policy = division:B=8,Q=2\npolicy-rule = conv1=exact\npolicy-rule = layer1.*=quant:Q=4\n"
           "no-augment = true\nseed = 7\n");
  actlab::TrainConfig c;
  put_text("config", "file-effective", 0, actlab::config_to_text(c));
  c.policy_rules = {"fc=exact"};
  c.dataset = "cifar10";
  put_text("config", "json-effective", 1, actlab::config_to_json(c));
  put_text("config", "json-small", 1, "{\"epochs\":\"2\",\"policy-rule\":[\"a=exact\"],\"model\":\"mlp\"}");
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: fuzz_make_seeds OUT_DIR (e.g. fuzz/corpus): writes every fuzz target's seed inputs\n";
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("%s", usage);
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "fuzz_make_seeds: error: %s%s", argc == 2 ? "unknown option; " : "", usage);
    return 2;
  }
  g_out = argv[1];
  idx_seeds();
  cifar_seeds();
  image_seeds();
  safetensors_seeds();
  policy_seeds();
  config_seeds();
  return 0;
}
