// Tests of actlab-inspect's analysis library: the 2-D DCT against the paper's formula written out as a
// naive loop and its algebra (DC, Parseval, inverse, single basis functions, non-square planes), the
// low-pass mask, band energies with known answers, policy round trips against closed-form sizes,
// conv-input capture, Theorem 3.1's per-layer gradient error, and the PNG grids.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include <stb_image.h>

#include "actlab/analysis/dct.h"
#include "actlab/analysis/grad_error.h"
#include "actlab/analysis/image_grid.h"
#include "actlab/analysis/spectrum.h"
#include "actlab/compress/policies.h"
#include "actlab/core/allocator.h"
#include "actlab/data/dataloader.h"
#include "actlab/models/registry.h"
#include "temp_dir.h"

using namespace actlab;

namespace {

const double kPi = std::acos(-1.0);

int64_t live_bytes() { return memory_stats(Device::cpu()).total.current; }

Tensor random_map(const Shape& shape, uint64_t seed) {
  PhiloxStream rng(seed, 11);
  return Tensor::randn(shape, rng, 0.f, 1.f);
}

// The paper's Eq. 3 (orthonormal DCT-II of an H×W plane), straight from the definition, in double.
std::vector<double> naive_dct(const std::vector<float>& x, int64_t h, int64_t w) {
  std::vector<double> out(static_cast<size_t>(h * w));
  for (int64_t u = 0; u < h; ++u)
    for (int64_t v = 0; v < w; ++v) {
      double s = 0;
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j)
          s += x[i * w + j] * std::cos(kPi * (2 * i + 1) * u / (2.0 * h)) * std::cos(kPi * (2 * j + 1) * v / (2.0 * w));
      out[u * w + v] = s * std::sqrt((u ? 2.0 : 1.0) / h) * std::sqrt((v ? 2.0 : 1.0) / w);
    }
  return out;
}

double norm2(const std::vector<float>& v) {
  double s = 0;
  for (float f : v) s += static_cast<double>(f) * f;
  return std::sqrt(s);
}

// A plane that is exactly the (u, v) basis function (unnormalized cosines).
std::vector<float> cosine_plane(int64_t h, int64_t w, int64_t u, int64_t v) {
  std::vector<float> x(static_cast<size_t>(h * w));
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j)
      x[i * w + j] = static_cast<float>(std::cos(kPi * (2 * i + 1) * u / (2.0 * h)) *
                                        std::cos(kPi * (2 * j + 1) * v / (2.0 * w)));
  return x;
}

// A small ResNet-20 on the synthetic sinusoid data set (normalized like Fashion-MNIST).
struct SmallSetup {
  std::shared_ptr<Module> model;
  Tensor images, labels;
};
SmallSetup small_resnet20(int64_t batch, int64_t size) {
  SmallSetup s;
  seed_init(7);
  s.model = make_model({"resnet20", 1, 10, size});
  const InMemoryImageDataset data = make_synthetic_dataset(batch, 1, size, size, 10, 3);
  DataLoader loader(data, batch, false, 0, false, default_transforms("fashion-mnist", false));
  loader.start_epoch(0);
  Batch b;
  REQUIRE(loader.next(b));
  s.images = b.images;
  s.labels = b.labels;
  return s;
}

}  // namespace

TEST_CASE("dct: matches the paper's formula on non-square planes, constant planes have only DC") {
  const int64_t start = live_bytes();
  {
    for (const auto& hw : std::vector<std::pair<int64_t, int64_t>>{{6, 10}, {7, 7}, {1, 5}, {9, 4}}) {
      const auto [h, w] = hw;
      const Tensor x = random_map({2, h, w}, 1);
      const std::vector<float> got = dct2d(x).to_vector();
      const std::vector<float> in = x.to_vector();
      for (int64_t p = 0; p < 2; ++p) {
        const std::vector<float> plane(in.begin() + p * h * w, in.begin() + (p + 1) * h * w);
        const std::vector<double> want = naive_dct(plane, h, w);
        for (int64_t i = 0; i < h * w; ++i) CHECK(got[p * h * w + i] == doctest::Approx(want[i]).epsilon(1e-5));
      }
    }
    const Tensor c = Tensor::full({6, 10}, 2.5f);
    const std::vector<float> coeffs = dct2d(c).to_vector();
    CHECK(coeffs[0] == doctest::Approx(2.5 * std::sqrt(60.0)).epsilon(1e-6));
    for (size_t i = 1; i < coeffs.size(); ++i) CHECK(std::fabs(coeffs[i]) < 1e-5f);
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("dct: inverse(forward(x)) = x, Parseval, and one basis function maps to one coefficient") {
  const int64_t start = live_bytes();
  {
    for (const Shape& shape : std::vector<Shape>{{3, 2, 12, 20}, {16, 16}, {2, 5, 1, 9}, {4, 31, 8}}) {
      const Tensor x = random_map(shape, 2);
      const Tensor y = dct2d(x);
      const std::vector<float> back = idct2d(y).to_vector(), in = x.to_vector(), coeffs = y.to_vector();
      float worst = 0;
      for (size_t i = 0; i < in.size(); ++i) worst = std::max(worst, std::fabs(back[i] - in[i]));
      CHECK(worst < 1e-5f);
      CHECK(norm2(coeffs) == doctest::Approx(norm2(in)).epsilon(1e-5));  // orthonormal: ‖DCT x‖ = ‖x‖
    }
    const int64_t h = 8, w = 12;
    for (const auto& uv : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {0, 11}, {7, 0}, {1, 1}}) {
      const auto [u, v] = uv;
      const std::vector<float> coeffs = dct2d(Tensor::from_vector(cosine_plane(h, w, u, v), {h, w})).to_vector();
      // ⟨a_u cos_u, cos_u⟩ = a_u·h/2 for u > 0 and √h for u = 0 (a_0 = √(1/h)); likewise for v.
      const double along_u = u ? std::sqrt(2.0 / h) * h / 2.0 : std::sqrt(static_cast<double>(h));
      const double along_v = v ? std::sqrt(2.0 / w) * w / 2.0 : std::sqrt(static_cast<double>(w));
      for (int64_t k = 0; k < h * w; ++k) {
        if (k == u * w + v) CHECK(coeffs[k] == doctest::Approx(along_u * along_v).epsilon(1e-5));
        else CHECK(std::fabs(coeffs[k]) < 1e-5f);
      }
    }
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("dct: the low-pass mask keeps u < r·H, v < r·W and rejects bad ratios") {
  const LowPassMask m32 = low_pass_mask(32, 32, 0.1);  // r·N = 3.2: the paper's W rounded up
  CHECK(m32.kept_rows == 4);
  CHECK(m32.kept_cols == 4);
  const LowPassMask m20 = low_pass_mask(20, 20, 0.1);  // r·N = 2 exactly: the paper's W = 2
  CHECK(m20.kept_rows == 2);
  const LowPassMask m7 = low_pass_mask(7, 7, 0.1);  // only the DC term
  CHECK((m7.kept_rows == 1 && m7.kept_cols == 1));
  const LowPassMask rect = low_pass_mask(10, 30, 0.1);
  CHECK((rect.kept_rows == 1 && rect.kept_cols == 3));
  int64_t ones = 0;
  for (int64_t u = 0; u < 10; ++u)
    for (int64_t v = 0; v < 30; ++v) {
      ones += rect.mask[u * 30 + v];
      CHECK(rect.mask[u * 30 + v] == ((u < 1 && v < 3) ? 1 : 0));
    }
  CHECK(ones == 3);
  const LowPassMask all = low_pass_mask(5, 6, 1.0);
  CHECK((all.kept_rows == 5 && all.kept_cols == 6));
  for (double bad : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()})
    CHECK_THROWS_AS(low_pass_mask(8, 8, bad), Error);
}

TEST_CASE("dct: split_frequencies separates low and high basis functions, LFC + HFC = x") {
  const int64_t start = live_bytes();
  {
    const int64_t h = 20, w = 20;  // r = 0.1 keeps u, v in {0, 1}
    std::vector<float> mixed = cosine_plane(h, w, 1, 0), high = cosine_plane(h, w, 9, 13);
    for (size_t i = 0; i < mixed.size(); ++i) mixed[i] += 0.5f * high[i];
    const Tensor x = Tensor::from_vector(mixed, {1, 1, h, w});
    const FrequencySplit s = split_frequencies(x, 0.1);
    const std::vector<float> lfc = s.lfc.to_vector(), hfc = s.hfc.to_vector(), low = cosine_plane(h, w, 1, 0);
    for (size_t i = 0; i < mixed.size(); ++i) {
      CHECK(lfc[i] == doctest::Approx(low[i]).epsilon(1e-4).scale(1.0));
      CHECK(hfc[i] == doctest::Approx(0.5f * high[i]).epsilon(1e-4).scale(1.0));
      CHECK(lfc[i] + hfc[i] == doctest::Approx(mixed[i]).epsilon(1e-6));
    }
    CHECK_THROWS_AS(split_frequencies(x, 0.0), Error);
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("spectrum: band energies of a constant map, a checkerboard and a mixed batch") {
  const int64_t start = live_bytes();
  {
    const BandEnergy flat = band_energy(Tensor::full({2, 3, 16, 16}, -1.5f), 0.1);
    CHECK(flat.planes == 6);
    CHECK(flat.lambda_low == doctest::Approx(1.5 * 16).epsilon(1e-5));  // |c|·√(H·W)
    CHECK(flat.lambda_high < 1e-4);
    CHECK(flat.high_over_low() < 1e-5);

    std::vector<float> board(16 * 16);
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t j = 0; j < 16; ++j) board[i * 16 + j] = ((i + j) % 2) ? -1.f : 1.f;
    const BandEnergy checker = band_energy(Tensor::from_vector(board, {1, 1, 16, 16}), 0.1);
    CHECK(checker.lambda_high == doctest::Approx(16.0).epsilon(1e-3));  // ‖x‖ = 16, nearly all of it high
    CHECK(checker.lambda_low < 0.01 * checker.lambda_high);
    CHECK(checker.high_over_low() > 100.0);

    // λ is the mean of per-plane norms: planes of constants 1 and 3 on 4×4 give (4 + 12) / 2.
    std::vector<float> two(2 * 16, 1.f);
    for (size_t i = 16; i < two.size(); ++i) two[i] = 3.f;
    CHECK(band_energy(Tensor::from_vector(two, {2, 4, 4}), 0.25).lambda_low == doctest::Approx(8.0).epsilon(1e-6));
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("spectrum: policy round trips — exact is lossless at 32 bits, DIVISION sizes match the closed form") {
  const int64_t start = live_bytes();
  {
    for (const Shape& shape : std::vector<Shape>{{2, 3, 16, 16}, {2, 4, 28, 28}, {3, 2, 7, 7}}) {
      const Tensor x = random_map(shape, 5);
      const Reconstruction exact = measure_reconstruction(*parse_policy("exact"), x, {0, 0});
      CHECK(exact.relative_error == 0.0);
      CHECK(exact.bits_per_element == 32.0);

      // division:B=8,Q=2 per H×W plane: a floor(H/b)×floor(W/b) bf16 LFC (b = min(8, H)), a bf16 min and
      // step, and ceil(2·H·W/8) bytes of 2-bit codes (docs/policies.md).
      const int64_t h = shape[2], w = shape[3], b = std::min<int64_t>(8, h);
      const int64_t per_plane = 2 * (h / b) * (w / b) + 2 + 2 + (2 * h * w + 7) / 8;
      const int64_t planes = shape[0] * shape[1];
      const Reconstruction div = measure_reconstruction(*parse_policy("division:B=8,Q=2"), x, {3, 1});
      CHECK(div.packed_bytes == planes * per_plane);
      CHECK(div.bits_per_element == doctest::Approx(8.0 * per_plane / (h * w)));
      CHECK(div.relative_error > 0.0);
      CHECK(measure_reconstruction(*parse_policy("division:B=8,Q=8"), x, {3, 1}).relative_error < 0.02);

      // On a smooth map (a ramp across the plane plus 5% noise) with several B×B blocks per plane, the LFC
      // carries the ramp and DIVISION's 2-bit residual spans only a block's share of it, so it loses less
      // than 2-bit codes of x itself (per-plane min/max already absorbs any constant offset). On white
      // noise, or a plane of one block, there is no such gain: the paper's argument needs λᴸ > λᴴ.
      if (h >= 16) {
        std::vector<float> smooth = random_map(shape, 6).to_vector();
        for (size_t i = 0; i < smooth.size(); ++i) {
          const int64_t row = static_cast<int64_t>(i) / w % h, col = static_cast<int64_t>(i) % w;
          smooth[i] = 0.05f * smooth[i] + 2.f * (static_cast<float>(row) / h + static_cast<float>(col) / w);
        }
        const Tensor xs = Tensor::from_vector(smooth, shape);
        CHECK(measure_reconstruction(*parse_policy("division:B=8,Q=2"), xs, {3, 1}).relative_error <
              0.75 * measure_reconstruction(*parse_policy("quant:Q=2"), xs, {3, 1}).relative_error);
      }
    }
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("spectrum: capture_layer_inputs sees every conv input and leaves the model untouched") {
  const int64_t start = live_bytes();
  {
    SmallSetup s = small_resnet20(4, 16);
    std::vector<Tensor> before;
    for (const auto& [name, buffer] : s.model->named_buffers()) before.push_back(buffer.clone());
    s.model->eval();
    const std::vector<CapturedInput> inputs = capture_layer_inputs(*s.model, s.images, /*train_mode=*/true);
    int64_t convs = 0;
    for (const auto& [path, m] : s.model->named_modules()) convs += m && m->kind() == "Conv2d";
    REQUIRE(static_cast<int64_t>(inputs.size()) == convs);
    CHECK(inputs[0].path == "conv1");
    CHECK(inputs[0].input.to_vector() == s.images.to_vector());  // the stem sees the images
    CHECK(inputs[1].path == "layer1.0.conv1");
    CHECK(inputs[1].input.shape() == Shape{4, 16, 16, 16});
    CHECK(!s.model->is_training());
    size_t k = 0;
    for (const auto& [name, buffer] : s.model->named_buffers()) CHECK(buffer.to_vector() == before[k++].to_vector());

    const auto policies = std::vector<std::shared_ptr<const ActivationCachePolicy>>{parse_policy("exact"),
                                                                                     parse_policy("lfc:B=8")};
    const std::vector<LayerSpectrum> rows = layer_spectra(inputs, policies, {0.1, 0, true});
    REQUIRE(rows.size() == inputs.size());
    for (const auto& r : rows) {
      CHECK(r.reconstruction[0].relative_error == 0.0);
      CHECK(r.reconstruction[1].relative_error > 0.0);  // lfc drops the HFC on purpose
      CHECK(r.energy.lambda_low > 0.0);
    }
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("grad_error: exact is exactly 0, near-lossless DIVISION is tiny, 1-bit quant is worse than DIVISION") {
  const int64_t start = live_bytes();
  {
    SmallSetup s = small_resnet20(8, 16);
    std::vector<Tensor> before;
    for (const auto& [name, buffer] : s.model->named_buffers()) before.push_back(buffer.clone());
    const std::vector<std::string> specs = {"exact", "division:B=1,Q=8", "division:B=8,Q=2", "quant:Q=1"};
    std::vector<std::shared_ptr<const ActivationCachePolicy>> policies;
    for (const auto& spec : specs) policies.push_back(parse_policy(spec));
    const GradErrorReport r = gradient_errors(*s.model, s.images, s.labels, policies, {42});
    REQUIRE(r.layers.size() == 39);  // conv1, 18 block convs, fc; the 19 batch norms' scales
    REQUIRE(r.weight_layer_count() == 20);
    REQUIRE(r.norm_scale_count() == 19);
    CHECK(r.layers.back().kind == "Linear");
    CHECK(r.layers[1].kind == "BatchNorm2d");  // bn1, after conv1 in named_modules() order
    CHECK(std::isfinite(r.loss));
    for (const auto& layer : r.layers) {
      CHECK(layer.grad_norm > 0.0);
      CHECK(layer.relative_error[0] == 0.0);
      CHECK(layer.relative_error[1] < 1e-2);
    }
    const std::vector<double> mean = r.mean_relative_error(), norms = r.norm_mean_relative_error();
    MESSAGE("mean relative gradient error: division:B=1,Q=8 ", mean[1], ", division:B=8,Q=2 ", mean[2],
            ", quant:Q=1 ", mean[3], "; batch-norm scales: ", norms[1], ", ", norms[2], ", ", norms[3]);
    CHECK(mean[3] > mean[2]);
    CHECK(norms[0] == 0.0);
    CHECK(norms[3] > norms[2]);
    // The first mean is over the weights only, the second over the scales only.
    for (int norm = 0; norm < 2; ++norm) {
      double sum = 0;
      int count = 0;
      for (const auto& layer : r.layers)
        if (is_norm_kind(layer.kind) == (norm == 1)) sum += layer.relative_error[2], ++count;
      CHECK(count == (norm == 1 ? 19 : 20));
      CHECK((norm == 1 ? norms[2] : mean[2]) == doctest::Approx(sum / count).epsilon(1e-12));
    }
    // The model comes back as it was: running statistics, (absent) gradients, training flag.
    size_t k = 0;
    for (const auto& [name, buffer] : s.model->named_buffers()) CHECK(buffer.to_vector() == before[k++].to_vector());
    for (const auto& p : s.model->parameters()) CHECK(!p.grad().defined());
    CHECK(s.model->is_training());
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("grad_error draws: stochastic rounding's error of the mean falls as 1/sqrt(draws), a deterministic bias stays") {
  const int64_t start = live_bytes();
  {
    SmallSetup s = small_resnet20(8, 16);
    const std::vector<std::string> specs = {"exact", "division:B=8,Q=2", "lfc:B=8"};
    std::vector<std::shared_ptr<const ActivationCachePolicy>> policies;
    for (const auto& spec : specs) policies.push_back(parse_policy(spec));
    GradErrorOptions one;
    one.seed = 7;
    const GradErrorReport r1 = gradient_errors(*s.model, s.images, s.labels, policies, one);
    GradErrorOptions many = one;
    many.draws = 16;
    const GradErrorReport r16 = gradient_errors(*s.model, s.images, s.labels, policies, many);
    CHECK(r1.draws == 1);
    CHECK(r16.draws == 16);
    REQUIRE(r16.layers.size() == r1.layers.size());
    for (size_t l = 0; l < r1.layers.size(); ++l) {
      // One draw: the mean is that draw. Draw 0 of the 16 is the same pass as the single draw.
      CHECK(r1.layers[l].mean_error == r1.layers[l].relative_error);
      CHECK(r16.layers[l].relative_error == r1.layers[l].relative_error);
      CHECK(r16.layers[l].mean_error[0] == 0);  // exact: 16 equal gradients average to that gradient
      // lfc rounds to nearest: every draw is the same gradient, so averaging removes nothing.
      CHECK(r16.layers[l].mean_error[2] == r16.layers[l].relative_error[2]);
    }
    // DIVISION's draws are independent zero-mean noise: over 20 layers the mean of 16 has about a quarter of
    // one draw's error (a bias would keep it near one draw's).
    const double one_draw = r16.mean_relative_error()[1], of_16 = r16.mean_error_of_draws()[1];
    MESSAGE("division:B=8,Q=2 one draw ", one_draw, ", mean of 16 draws ", of_16, " (unbiased: ", one_draw / 4, ")");
    CHECK(of_16 > 0.15 * one_draw);
    CHECK(of_16 < 0.40 * one_draw);
    GradErrorOptions none = one;
    none.draws = 0;
    CHECK_THROWS_WITH_AS(gradient_errors(*s.model, s.images, s.labels, policies, none),
                         doctest::Contains("draws must be >= 1"), Error);
  }
  CHECK(live_bytes() == start);
}

TEST_CASE("image_grid: layout, per-tile and shared ranges, colormaps, labels") {
  ImageGrid g;
  g.rows = 2;
  g.cols = 2;
  g.padding = 1;
  g.upscale = 2;
  g.tiles.resize(4);
  const std::vector<float> ramp = {0, 1, 2, 3, 4, 5};
  g.tiles[0] = make_tile(ramp.data(), 2, 3);                             // own range [0, 5]
  const std::vector<float> signed_values = {-2, 0, 1, 2, 0, 0};
  g.tiles[1] = make_tile(signed_values.data(), 2, 3, Colormap::Diverging);
  const std::vector<float> a = {0, 1, 1, 1, 1, 1}, b = {0, 2, 2, 2, 2, 2};
  g.tiles[2] = make_tile(a.data(), 2, 3, Colormap::Gray, 0);  // shared range [0, 2]
  g.tiles[3] = make_tile(b.data(), 2, 3, Colormap::Gray, 0);
  const RgbImage img = render_grid(g);
  CHECK(img.width == 1 + 2 * (6 + 1));
  CHECK(img.height == 1 + 2 * (4 + 1));
  auto px = [&](int64_t x, int64_t y, int c) { return img.pixels[(y * img.width + x) * 3 + c]; };
  CHECK(px(0, 0, 0) == 200);                   // background
  CHECK(px(1, 1, 0) == 0);                     // tile 0: min → black (upscaled 2×2)
  CHECK(px(2, 2, 1) == 0);
  CHECK(px(1 + 5, 1 + 3, 0) == 255);           // tile 0: max (row 1, col 2) → white
  CHECK((px(8, 1, 0) == 33 && px(8, 1, 2) == 172));   // tile 1 (x0 = 8): −2 = −max → blue end
  CHECK((px(10, 1, 0) == 255 && px(10, 1, 1) == 255)); // 0 → white
  CHECK((px(8, 3, 0) == 178 && px(8, 3, 1) == 24));    // +2 → red end
  CHECK(px(3, 6, 0) == 128);                   // tile 2, value 1 of the shared [0, 2] → mid grey
  CHECK(px(10, 6, 0) == 255);                  // tile 3, value 2 → white

  g.row_labels = {"A", "B"};
  const RgbImage labelled = render_grid(g);
  CHECK(labelled.width > img.width);
  int64_t ink = 0;
  for (int64_t y = 0; y < labelled.height; ++y)
    for (int64_t x = 0; x < labelled.width - img.width; ++x) ink += labelled.pixels[(y * labelled.width + x) * 3] == 0;
  CHECK(ink > 0);

  // A tile with its own magnification: a 4×6 picture beside 2×3 maps takes the same cell size at 1×.
  g.row_labels.clear();
  const std::vector<float> big(24, 1.f);
  g.tiles[1] = make_tile(big.data(), 4, 6);
  g.tiles[1].upscale = 1;
  const RgbImage mixed = render_grid(g);
  CHECK(mixed.width == img.width);
  CHECK(mixed.height == img.height);

  g.tiles.pop_back();
  CHECK_THROWS_AS(render_grid(g), Error);
}

TEST_CASE("image_grid: PNG bytes decode to the rendered pixels, write_png is atomic") {
  ImageGrid g;
  g.rows = 1;
  g.cols = 1;
  std::vector<float> v(35);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i));
  g.tiles = {make_tile(v.data(), 5, 7, Colormap::Diverging)};
  g.upscale = 3;
  const RgbImage img = render_grid(g);
  const std::string png = encode_png(img);
  int w = 0, h = 0, c = 0;
  unsigned char* decoded = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(png.data()),
                                                 static_cast<int>(png.size()), &w, &h, &c, 3);
  REQUIRE(decoded != nullptr);
  CHECK(w == img.width);
  CHECK(h == img.height);
  CHECK(std::vector<uint8_t>(decoded, decoded + w * h * 3) == img.pixels);
  stbi_image_free(decoded);

  testing::TempDir dir("inspect");
  write_png(dir.file("grid.png"), img);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  CHECK(files == 1);  // no temp file left behind
  CHECK(std::filesystem::file_size(dir.file("grid.png")) == png.size());
  CHECK_THROWS_AS(write_png(dir.file("missing/grid.png"), img), Error);
}

TEST_CASE("spectrum: a (B, T, D) token map is measured along the tokens, one plane per feature, and (N, D) gets no λ") {
  // Feature j of sample b is constant over the tokens (all energy at frequency 0: λᴴ = 0) in the first map,
  // and alternates sign token to token (the energy at the top frequencies) in the second.
  Tensor smooth = Tensor::empty({2, 16, 3}), rough = Tensor::empty({2, 16, 3});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 16; ++t)
      for (int64_t j = 0; j < 3; ++j) {
        smooth.data<float>()[(b * 16 + t) * 3 + j] = static_cast<float>(1 + j + b);
        rough.data<float>()[(b * 16 + t) * 3 + j] = (t % 2 ? -1.f : 1.f) * static_cast<float>(1 + j);
      }
  const std::vector<CapturedInput> inputs = {{"blocks.0.mlp.fc1", "Linear", smooth}, {"blocks.0.mlp.fc2", "Linear", rough},
                                             {"head", "Linear", Tensor::zeros({2, 3})}};
  const auto rows = layer_spectra(inputs, {parse_policy("division:B=8,Q=2")}, {0.25, 0, true});
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].token_axis);
  CHECK(rows[0].has_spectrum);
  // The (N, D) input of the head has no axis to measure along, so no λ; the policy codes it all the same,
  // so its reconstruction is measured.
  CHECK(rows[2].path == "head");
  CHECK(!rows[2].has_spectrum);
  CHECK(rows[2].energy.planes == 0);
  REQUIRE(rows[2].reconstruction.size() == 1);
  CHECK(rows[2].reconstruction[0].numel == 6);
  CHECK(rows[2].reconstruction[0].packed_bytes ==
        static_cast<int64_t>(parse_policy("division:B=8,Q=2")->expected_bytes({2, 3})));
  CHECK(rows[2].reconstruction[0].relative_error == 0.0);  // zeros come back as zeros
  CHECK(rows[0].energy.planes == 6);  // B·D sequences
  CHECK(rows[0].energy.lambda_high == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(rows[0].energy.lambda_low > 1.0);
  CHECK(rows[1].energy.high_over_low() > 3.0);
  // The reconstruction is of the token map itself, in the token layout (one plane per sample).
  CHECK(rows[0].reconstruction[0].packed_bytes ==
        static_cast<int64_t>(parse_policy("division:B=8,Q=2")->expected_bytes({2, 16, 3})));
  CHECK(rows[0].reconstruction[0].relative_error < 1e-2);  // the LFC along the tokens holds it all
}
