// actlab-inspect: the teaching tool. For a trained checkpoint (or a fresh model) and one batch of real
// test images it draws the DIVISION paper's Fig. 3(a) (DCT and DIVISION LFC/HFC of activation maps,
// PNG), measures Fig. 4's λᴸ/λᴴ per conv input and token map, each policy's reconstruction error and bits
// per element, and Theorem 3.1's per-layer weight-gradient error, and writes CSV, SVG and a README.md into --out.
// The measurements live in analysis/ (tested in tests/test_inspect.cpp); this file is flags and files.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <exception>
#include <filesystem>
#include <set>
#include <sstream>

#include "actlab/analysis/dct.h"
#include "actlab/analysis/grad_error.h"
#include "actlab/analysis/image_grid.h"
#include "actlab/analysis/plot.h"
#include "actlab/analysis/spectrum.h"
#include "actlab/core/allocator.h"
#include "actlab/core/precision.h"
#include "actlab/data/dataloader.h"
#include "actlab/models/registry.h"
#include "actlab/io/files.h"
#include "actlab/io/markdown.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/cli.h"
#include "actlab/train/config_file.h"
#include "actlab/train/grid.h"
#include "actlab/train/logging.h"
#include "actlab/train/trainer.h"

using namespace actlab;
namespace fs = std::filesystem;

namespace {

using PolicyList = std::vector<std::shared_ptr<const ActivationCachePolicy>>;
using Clock = std::chrono::steady_clock;

struct Setup {
  std::shared_ptr<Module> model;
  DataSplits data;
  TrainConfig config;
  std::string model_note;  // where the weights come from
  bool trained = false;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt(double v, const char* format = "%.4g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string dims(const Shape& s) {  // "32x16x28x28"
  std::string out;
  for (int64_t d : s) out += (out.empty() ? "" : "x") + std::to_string(d);
  return out;
}

// Each entry is a run's policy string (parse_policy_set): a codec, or checkpointing with or without one.
// The spectra and reconstructions use the codec (exact under a bare "checkpoint"); the gradient errors the
// whole set, recompute included, and `rules` (--policy-rule) are added to every set, so they reach only the
// gradient errors.
std::vector<PolicySet> parse_policies(const std::string& text, const std::vector<std::string>& rules,
                                      PolicyList* codecs, std::vector<std::string>* specs) {
  std::vector<PolicySet> out;
  for (const auto& spec : split_list(text, ';')) {
    try {
      out.push_back(parse_policy_set(spec));
    } catch (const Error& e) {
      ACTLAB_FAIL("bad --policies entry '", spec, "' (separate policies with ';'): ", e.what());
    }
    for (const auto& rule : rules) out.back().add_rule(rule);  // its errors name --policy-rule
    codecs->push_back(out.back().shared_default());
    specs->push_back(out.back().describe());
  }
  ACTLAB_CHECK(!out.empty(), "--policies is empty; give e.g. 'division:B=8,Q=2;quant:Q=2'");
  return out;
}

// The model and data set, from a checkpoint's stored configuration or from --model/--dataset.
Setup load_setup(const FlagParser& flags, uint64_t seed) {
  Setup s;
  const std::string checkpoint = flags.get("checkpoint");
  SafetensorsFile file;
  if (!checkpoint.empty()) {
    file = read_safetensors(checkpoint);  // its errors name a missing file, a directory, a corrupt file
    const TrainState st = checkpoint_state(file);
    s.config = config_from_json(st.config_json);
    for (const auto& [key, stored] : {std::make_pair("model", s.config.model), std::make_pair("dataset", s.config.dataset)})
      ACTLAB_CHECK(!flags.given(key) || flags.get(key) == stored, "--", key, " ", flags.get(key),
                   " contradicts checkpoint '", checkpoint, "', which holds ", stored);
    s.model_note = "checkpoint " + checkpoint + " (" + s.config.model + ", " + std::to_string(st.epoch) +
                   " epochs, policy " + s.config.policy + ")";
    s.trained = true;
  } else {
    s.config.model = flags.get("model");
    s.config.dataset = flags.get("dataset");
    s.model_note = "a freshly initialised " + s.config.model + " (seed " + std::to_string(seed) + "), NOT trained";
  }
  if (flags.given("data-dir")) s.config.data_dir = flags.get("data-dir");
  s.data = load_data(s.config);
  const ImageSpec spec = s.data.test->spec();
  seed_init(seed);
  s.model = make_model(
      {s.config.model, spec.channels, spec.num_classes, spec.height, static_cast<float>(s.config.drop_path)});
  if (s.trained) restore_checkpoint(file, *s.model, nullptr);
  return s;
}

Batch first_test_batch(const DataSplits& d, int64_t batch_size, uint64_t seed) {
  const int64_t n = std::min(batch_size, d.test->size());
  DataLoader loader(*d.test, n, /*shuffle=*/false, seed, /*drop_last=*/true, d.test_transforms);
  loader.start_epoch(0);
  Batch b;
  ACTLAB_CHECK(loader.next(b), "the test split of ", d.note, " gave no batch");
  return b;
}

// The conv inputs of distinct paths, in call order.
std::vector<const CapturedInput*> unique_maps(const std::vector<CapturedInput>& inputs) {
  std::vector<const CapturedInput*> out;
  std::set<std::string> seen;
  for (const auto& in : inputs)
    if (in.input.dim() == 4 && seen.insert(in.path).second) out.push_back(&in);
  return out;
}

// Default Fig. 3(a) layers: the first conv at each input resolution, the stem (whose input is the image,
// drawn in fig3a_input.png) excluded.
std::vector<std::string> default_fig_layers(const std::vector<const CapturedInput*>& maps) {
  std::vector<std::string> out;
  std::set<int64_t> sizes;
  for (size_t i = 1; i < maps.size(); ++i)
    if (sizes.insert(maps[i]->input.size(2)).second) out.push_back(maps[i]->path);
  return out;
}

const CapturedInput& find_map(const std::vector<const CapturedInput*>& maps, const std::string& name) {
  std::string names;
  for (const auto* m : maps) {
    if (m->path == name) return *m;
    names += (names.empty() ? "" : ", ") + m->path;
  }
  ACTLAB_CHECK(!names.empty(), "unknown layer '", name, "' in --layers: this model has no activation maps to draw");
  ACTLAB_FAIL("unknown layer '", name, "' in --layers; available: ", names);
}

// Channels with the largest mean square over the first `images` samples: dead channels make poor pictures.
std::vector<int64_t> busiest_channels(const Tensor& map, int64_t images, int64_t count) {
  const int64_t c = map.size(1), hw = map.size(2) * map.size(3);
  const float* p = map.data<float>();
  std::vector<std::pair<double, int64_t>> energy;
  for (int64_t ch = 0; ch < c; ++ch) {
    double e = 0;
    for (int64_t n = 0; n < images; ++n)
      for (int64_t i = 0; i < hw; ++i) e += static_cast<double>(p[(n * c + ch) * hw + i]) * p[(n * c + ch) * hw + i];
    energy.emplace_back(-e, ch);
  }
  std::sort(energy.begin(), energy.end());
  std::vector<int64_t> out;
  for (int64_t k = 0; k < std::min(count, c); ++k) out.push_back(energy[k].second);
  std::sort(out.begin(), out.end());
  return out;
}

// Fig. 3(a) for a map (N,C,H,W): columns are (image, channel) pairs; rows the input image (when given),
// the map, its DCT LFC/HFC and DIVISION's LFC (avg-pool B, nearest up-sampling, bf16) and HFC.
// The map and both LFCs of a column share one grey scale; both HFCs share one symmetric colour scale.
ImageGrid fig3a_grid(const Tensor& map, const Tensor& images, int64_t n_images, int64_t n_channels, double ratio,
                     int64_t block) {
  const Tensor sub = map.slice(0, 0, n_images).contiguous();
  const FrequencySplit dct = split_frequencies(sub, ratio);
  const auto lfc_policy = parse_policy("lfc:B=" + std::to_string(block));
  const SaveInfo info{"conv2d", "input", true, ""};
  const Tensor div_lfc = lfc_policy->unpack(*lfc_policy->pack(sub, info, {}), info);
  Tensor div_hfc = sub.clone();
  div_hfc.add_(div_lfc, -1.f);
  const std::vector<int64_t> channels = busiest_channels(sub, n_images, n_channels);
  const int64_t c = sub.size(1), h = sub.size(2), w = sub.size(3), k = static_cast<int64_t>(channels.size());
  const bool with_image = images.defined();
  ImageGrid g;
  g.rows = with_image ? 6 : 5;
  g.cols = n_images * k;
  g.tiles.resize(static_cast<size_t>(g.rows * g.cols));
  g.upscale = std::max<int64_t>(1, 112 / std::max(h, w));
  if (with_image) g.row_labels.push_back("image");
  const std::string r = fmt(ratio, "%g"), b = std::to_string(block);
  for (const char* label : {"map", "DCT LFC", "DCT HFC", "DIVISION LFC", "DIVISION HFC"}) g.row_labels.push_back(label);
  g.row_labels[g.rows - 4] += " r=" + r;
  g.row_labels[g.rows - 2] += " B=" + b;
  const std::vector<float> img = with_image ? images.slice(0, 0, n_images).contiguous().to_vector() : std::vector<float>();
  const Tensor* rows[5] = {&sub, &dct.lfc, &dct.hfc, &div_lfc, &div_hfc};
  for (int64_t n = 0; n < n_images; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t col = n * k + j, plane = (n * c + channels[j]) * h * w;
      g.col_labels.push_back("#" + std::to_string(n) + " c" + std::to_string(channels[j]));
      int64_t row = 0;
      if (with_image) {  // channel mean of the (normalized) input image, own grey scale
        const int64_t ic = images.size(1), ih = images.size(2), iw = images.size(3);
        std::vector<float> grey(static_cast<size_t>(ih * iw), 0.f);
        for (int64_t ch = 0; ch < ic; ++ch)
          for (int64_t i = 0; i < ih * iw; ++i) grey[i] += img[(n * ic + ch) * ih * iw + i] / ic;
        g.tiles[col] = make_tile(grey.data(), ih, iw);
        g.tiles[col].upscale = std::max<int64_t>(1, (std::max(h, w) * g.upscale) / std::max(ih, iw));  // map-sized
        row = 1;
      }
      for (int64_t r5 = 0; r5 < 5; ++r5) {
        const bool high = r5 == 2 || r5 == 4;
        g.tiles[(row + r5) * g.cols + col] =
            make_tile(rows[r5]->data<float>() + plane, h, w, high ? Colormap::Diverging : Colormap::Gray,
                      static_cast<int>(high ? g.cols + col : col));
      }
    }
  return g;
}

// What Fig. 4 measured, so that its title, axis labels and README text name it: the (sample, channel)
// planes of conv inputs, the (sample, feature) sequences of token maps along the tokens (analysis/
// spectrum.h), or both (a ViT: its patch-embedding conv, then its blocks' token maps).
struct SpectrumKinds {
  bool planes = false, tokens = false;
  explicit SpectrumKinds(const std::vector<LayerSpectrum>& rows) {
    for (const auto& r : rows) (r.token_axis ? tokens : planes) = true;
  }
  std::string noun() const {  // "each <noun>"
    return planes && tokens ? "conv input and token map" : tokens ? "token map" : "conv input";
  }
};

// A value for a log-axis chart: a 0 is passed on, so that the plot writer can say a series is 0 everywhere
// (exact's error, λᴴ at --ratio 1) rather than draw nothing without a word; only what has no value is a gap.
double finite_or_gap(double v) { return std::isfinite(v) ? v : std::nan(""); }

// The first line of a report's README.md: a directory that holds one is an earlier report, whose files a new
// run replaces.
constexpr const char* kReportTitle = "# actlab-inspect report";

// Every file inspect writes into --out, named once: the writers below take their paths from here, and the
// run checks them all before its long work (a name blocked by a directory failed only at the end).
struct OutputFiles {
  std::string dir;
  std::string path(const std::string& name) const { return dir + "/" + name; }
  std::string fig3a(const std::string& layer) const { return path("fig3a_" + layer + ".png"); }
  std::string lambda_csv() const { return path("fig4_lambda.csv"); }
  std::string lambda_svg() const { return path("fig4_lambda.svg"); }
  std::string grad_csv() const { return path("grad_error.csv"); }
  std::string grad_svg() const { return path("grad_error.svg"); }
  std::string reconstruction_csv() const { return path("reconstruction.csv"); }
  std::string readme() const { return path("README.md"); }
  std::vector<std::string> all(const std::vector<std::string>& fig_layers) const {
    std::vector<std::string> files = {fig3a("input"), lambda_csv(), lambda_svg(), grad_csv(), grad_svg(),
                                      reconstruction_csv(), readme()};
    for (const auto& l : fig_layers) files.push_back(fig3a(l));
    return files;
  }
};

void write_lambda(const OutputFiles& out, const std::vector<LayerSpectrum>& rows, double ratio) {
  std::ostringstream csv;
  csv << "layer,input_shape,kept_block,lambda_low,lambda_high,high_over_low\n";
  plot::LineChart chart;
  const SpectrumKinds kinds(rows);
  chart.title = "Fig. 4: low/high-frequency energy of each " + kinds.noun() + " (DCT cut-off r = " + fmt(ratio, "%g") + ")";
  chart.x_label = "layer (" + kinds.noun() + ", call order)";
  chart.y_label = kinds.planes && kinds.tokens ? "mean Frobenius norm per plane (conv) or feature (tokens)"
                  : kinds.tokens               ? "mean per-feature Frobenius norm (DCT along the tokens)"
                                               : "mean per-plane Frobenius norm";
  chart.log_y = true;
  chart.series = {{"lambda_L = |DCT(H) * M|_F", {}, {}}, {"lambda_H = |DCT(H) * (1 - M)|_F", {}, {}}};
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    csv << r.path << "," << dims(r.shape) << "," << r.energy.kept_rows << "x" << r.energy.kept_cols << ","
        << fmt(r.energy.lambda_low, "%.6g") << "," << fmt(r.energy.lambda_high, "%.6g") << ","
        << fmt(r.energy.high_over_low(), "%.6g") << "\n";
    chart.x_tick_labels.push_back(r.path);
    for (int s = 0; s < 2; ++s) chart.series[s].x.push_back(static_cast<double>(i));
    chart.series[0].y.push_back(finite_or_gap(r.energy.lambda_low));
    chart.series[1].y.push_back(finite_or_gap(r.energy.lambda_high));
  }
  write_text_atomic(out.lambda_csv(), csv.str());
  if (rows.empty()) {
    // No data, no figure (the README says so); one left in --out by an earlier run would contradict it.
    fs::remove(out.lambda_svg());
    return;
  }
  plot::write_svg(out.lambda_svg(), plot::line_chart_svg(chart));
}

void write_grad_error(const OutputFiles& out, const GradErrorReport& report) {
  std::ostringstream csv;
  csv << "layer,kind,weight_shape,grad_norm,policy,relative_error,draws,mean_of_draws_error\n";
  plot::LineChart chart;
  chart.title = "Theorem 3.1: weight-gradient error per layer, |grad_hat - grad|_F / |grad|_F";
  chart.x_label = "layer (Conv2d / Linear weights, BatchNorm2d / LayerNorm scales)";
  chart.y_label = "relative error";
  chart.log_y = true;
  for (const auto& p : report.policies) chart.series.push_back({p, {}, {}});
  for (size_t l = 0; l < report.layers.size(); ++l) {
    const auto& layer = report.layers[l];
    chart.x_tick_labels.push_back(layer.path);
    for (size_t p = 0; p < report.policies.size(); ++p) {
      csv << layer.path << "," << layer.kind << "," << dims(layer.weight_shape) << "," << fmt(layer.grad_norm, "%.6g")
          << "," << csv_field(report.policies[p]) << "," << fmt(layer.relative_error[p], "%.6g") << "," << report.draws
          << "," << fmt(layer.mean_error[p], "%.6g") << "\n";
      chart.series[p].x.push_back(static_cast<double>(l));
      chart.series[p].y.push_back(finite_or_gap(layer.relative_error[p]));
    }
  }
  write_text_atomic(out.grad_csv(), csv.str());
  plot::write_svg(out.grad_svg(), plot::line_chart_svg(chart));
}

// `policy` is the entry as grad_error.csv names it (so the two files join on it), `codec` what packed the map.
void write_reconstruction(const OutputFiles& out, const std::vector<LayerSpectrum>& rows,
                          const std::vector<std::string>& policies, const std::vector<std::string>& codecs) {
  std::ostringstream csv;
  csv << "layer,input_shape,policy,relative_error,bits_per_element,packed_bytes,numel,codec\n";
  for (const auto& r : rows)
    for (size_t p = 0; p < policies.size(); ++p) {
      const Reconstruction& x = r.reconstruction[p];
      csv << r.path << "," << dims(r.shape) << "," << csv_field(policies[p]) << "," << fmt(x.relative_error, "%.6g")
          << "," << fmt(x.bits_per_element, "%.6g") << "," << x.packed_bytes << "," << x.numel << ","
          << csv_field(codecs[p]) << "\n";
    }
  write_text_atomic(out.reconstruction_csv(), csv.str());
}

struct Report {
  std::string command, model_note, data_note, bn_mode;
  std::string precision = "fp32";  // of the gradient errors
  bool trained = false;
  int64_t batch = 0;
  uint64_t seed = 0;
  double ratio = 0.1;
  int64_t block = 8;
  std::vector<std::string> policies, fig_layers;
  // The codec each entry's spectra and reconstructions use (policies[p] less its --policy-rule rules and
  // checkpointing, which reach only the gradient errors): their CSV names it beside the entry.
  std::vector<std::string> codecs;
  std::vector<LayerSpectrum> inputs;   // every measured Conv2d/Linear input: the reconstructions
  std::vector<LayerSpectrum> spectra;  // those with a spectrum (has_spectrum): Fig. 4
  GradErrorReport grads;
};

std::string markdown_tables(const Report& r) {
  std::ostringstream md;
  int64_t low_wins = 0;
  const SpectrumKinds kinds(r.spectra);
  if (r.spectra.empty())  // an MLP: every input is an (N, D) vector, with no axis to transform along
    md << "## Fig. 4: λᴸ and λᴴ\n\nNo layer here takes a 2-D map or a token map (the spectra are of conv inputs "
       << "and token maps; a Linear layer's (N, D) input has no axis to transform along), so there is no λᴸ/λᴴ to "
       << "compare: `fig4_lambda.svg` was not written and `fig4_lambda.csv` has its header only.\n\n";
  else
    md << "## Fig. 4: λᴸ and λᴴ of each " << kinds.noun() << "\n\n";
  if (kinds.planes)
    md << (kinds.tokens ? "- Conv inputs (N, C, H, W): " : "")
       << "λᴸ = ‖DCT(H) ⊙ M‖_F, λᴴ = ‖DCT(H) ⊙ (1 − M)‖_F per (sample, channel) plane, averaged over the batch. "
       << "M keeps frequencies u < r·H, v < r·W (the kept block is listed; at least the DC term).\n";
  if (kinds.tokens)
    md << (kinds.planes ? "- Token maps (B, T, D): " : "")
       << "λᴸ = ‖DCT(h) ⊙ M‖_F, λᴴ = ‖DCT(h) ⊙ (1 − M)‖_F of the 1-D DCT along the tokens, per (sample, feature) "
       << "sequence h of T values, averaged over the batch. M keeps frequencies u < r·T (the kept block is listed "
       << "as T′×1; at least the DC term).\n";
  if (!r.spectra.empty()) md << "\n| layer | input | kept | λᴸ | λᴴ | λᴴ/λᴸ |\n|---|---|---|---|---|---|\n";
  for (const auto& s : r.spectra) {
    low_wins += s.energy.lambda_low > s.energy.lambda_high;
    md << "| " << s.path << " | " << dims(s.shape) << " | " << s.energy.kept_rows << "×" << s.energy.kept_cols << " | "
       << fmt(s.energy.lambda_low) << " | " << fmt(s.energy.lambda_high) << " | " << fmt(s.energy.high_over_low(), "%.3f")
       << " |\n";
  }
  if (!r.spectra.empty())
    md << "\nλᴸ > λᴴ (the paper's observation) in " << low_wins << " of " << r.spectra.size() << " layers.\n\n";
  md << "## Theorem 3.1: weight-gradient error ‖∇̂W − ∇W‖_F / ‖∇W‖_F\n\n"
     << "Same batch, same parameters, same forward; only the activations backward reads differ. "
     << "Rows of Conv2d/Linear weights W, and of BatchNorm2d/LayerNorm scales γ (kind `BatchNorm2d`/`LayerNorm` in "
     << "`grad_error.csv`), whose gradient Σ dy·x̂ reads the normalized input from the layer's own save; the first "
     << "mean is over the weights only. Batch loss " << fmt(r.grads.loss) << ".\n\n| layer | ‖∇W‖_F |";
  for (const auto& p : r.policies) md << " " << md_cell(p) << " |";
  md << "\n|---|---|";
  for (size_t p = 0; p < r.policies.size(); ++p) md << "---|";
  md << "\n";
  for (const auto& l : r.grads.layers) {
    md << "| " << l.path << " | " << fmt(l.grad_norm) << " |";
    for (double e : l.relative_error) md << " " << fmt(e) << " |";
    md << "\n";
  }
  md << "| **mean over the " << r.grads.weight_layer_count() << " Conv2d/Linear layers** | |";
  for (double e : r.grads.mean_relative_error()) md << " **" << fmt(e) << "** |";
  const size_t norms = r.grads.norm_scale_count();
  if (norms > 0) {
    md << "\n| **mean over the " << norms << " normalization scales γ** | |";
    for (double e : r.grads.norm_mean_relative_error()) md << " **" << fmt(e) << "** |";
  }
  if (r.grads.draws > 1) {
    const std::vector<double> one = r.grads.mean_relative_error(), mean = r.grads.mean_error_of_draws();
    md << "\n\n### Bias or noise: the mean of " << r.grads.draws << " draws\n\n"
       << "Each policy ran " << r.grads.draws << " times with stochastic-rounding seeds " << r.seed << ", "
       << r.seed + 1 << ", …; the error of the mean gradient, against the error of one draw divided by √"
       << r.grads.draws << ", which is what zero-mean noise alone would leave (`mean_of_draws_error` in "
       << "`grad_error.csv`, per layer). A ratio near 1 says the error is noise that SGD averages over steps; "
       << "well above 1, a bias that no number of steps removes.\n\n"
       << "| policy | one draw | mean of " << r.grads.draws << " | one draw / √" << r.grads.draws << " | ratio |\n"
       << "|---|---|---|---|---|\n";
    for (size_t p = 0; p < r.policies.size(); ++p) {
      const double expected = one[p] / std::sqrt(static_cast<double>(r.grads.draws));
      md << "| " << md_cell(r.policies[p]) << " | " << fmt(one[p]) << " | " << fmt(mean[p]) << " | " << fmt(expected) << " | "
         << (expected > 0 ? fmt(mean[p] / expected, "%.2f") : std::string("—")) << " |\n";
    }
  }
  md << "\n\n## Reconstruction of each layer input: relative error / bits per element\n\n"
     << "The input each Conv2d and Linear layer keeps for its backward (conv maps, token maps and (N, D) vectors "
     << "alike): ‖x̂ − x‖_F / ‖x‖_F of pack → unpack (lfc: and hfc: keep one component on purpose, so their error "
     << "is the other component's share); bits = 8 · packed bytes / elements (exact: 32).";
  if (r.precision != "fp32")
    md << " These are each codec on the fp32 inputs, whatever --precision says: under " << r.precision << " a run's "
       << "`exact` keeps a " << r.precision << " copy (the `" << r.precision << "` policy's column, when listed), "
       << "as the gradient errors above assume.";
  if (r.codecs != r.policies)
    md << " Each entry's codec alone: per-module rules (--policy-rule) and checkpointing reach only the gradient "
       << "errors above.";
  md << "\n\n| layer |";
  for (size_t p = 0; p < r.policies.size(); ++p)
    md << " " << md_cell(r.policies[p]) << (r.codecs[p] == r.policies[p] ? "" : " (codec " + md_cell(r.codecs[p]) + ")")
       << " |";
  md << "\n|---|";
  for (size_t p = 0; p < r.policies.size(); ++p) md << "---|";
  md << "\n";
  for (const auto& s : r.inputs) {
    md << "| " << s.path << " |";
    for (const auto& x : s.reconstruction) md << " " << fmt(x.relative_error, "%.3g") << " / " << fmt(x.bits_per_element, "%.3g") << " |";
    md << "\n";
  }
  return md.str();
}

void write_readme(const OutputFiles& out, const Report& r) {
  std::ostringstream md;
  md << kReportTitle << "\n\nMade by:\n\n```\n" << r.command << "\n```\n\n"
     << "- Model: " << r.model_note << "\n- Data: " << r.batch << " test images of " << r.data_note << "\n"
     << "- BatchNorm: " << r.bn_mode << "; stochastic-rounding seed " << r.seed << "\n"
     << "- Gradient errors computed in " << r.precision
     << (r.precision == "fp32" ? "" : " (exact keeps bf16 copies; each policy against exact at this precision)") << "\n"
     << "- DCT low-pass cut-off r = W/N = " << fmt(r.ratio, "%g") << "; DIVISION block B = " << r.block << "\n\n";
  if (!r.trained)
    md << "> **Untrained weights.** Spectra and gradient errors of trained networks differ; train a checkpoint "
          "first (`actlab-train --epochs 5 --save-dir runs/r20`) and pass `--checkpoint runs/r20/best.safetensors`.\n\n";
  md << "## Fig. 3(a): LFC and HFC of activation maps\n\n"
     << "`fig3a_input.png` decomposes the input images; `fig3a_<layer>.png` the input map of that layer "
     << "(what a policy keeps for its backward). Columns: (image #, channel c) — the most active channels. "
     << "Rows: image (channel mean) · map · DCT LFC = iDCT(DCT(x)⊙M) · DCT HFC = x − LFC · DIVISION LFC "
     << "(B×B average pool, nearest up-sampling, bf16) · DIVISION HFC = x − LFC. Map and LFC rows share one "
     << "grey scale per column; HFC rows share one blue–white–red scale (white = 0) per column.\n\n";
  for (const auto& l : r.fig_layers) md << "- [`fig3a_" << l << ".png`](fig3a_" << l << ".png)\n";
  if (r.fig_layers.empty())
    md << "No conv layer after the stem takes a 2-D map here (a transformer's blocks see (B, T, D) token maps, an "
          "MLP flat vectors), so only `fig3a_input.png` is drawn"
       << (SpectrumKinds(r.spectra).tokens ? "; the token maps' spectra are in Fig. 4 below.\n" : ".\n");
  md << "\nFiles: `fig4_lambda.csv`" << (r.spectra.empty() ? "" : "/`.svg`")
     << ", `grad_error.csv`/`.svg`, `reconstruction.csv`.\n\n" << markdown_tables(r);
  write_text_atomic(out.readme(), md.str());
}

void print_summary(const Report& r) {
  std::printf("\n%-22s %10s %10s %8s\n", "layer", "lambda_L", "lambda_H", "H/L");
  for (const auto& s : r.spectra)
    std::printf("%-22s %10.4g %10.4g %8.3f\n", s.path.c_str(), s.energy.lambda_low, s.energy.lambda_high,
                s.energy.high_over_low());
  const size_t norms = r.grads.norm_scale_count();
  std::printf("\nmean relative weight-gradient error over %zu Conv2d/Linear layers%s:\n", r.grads.weight_layer_count(),
              norms > 0 ? " (and over the normalization scales)" : "");
  const std::vector<double> mean = r.grads.mean_relative_error(), of_draws = r.grads.mean_error_of_draws();
  const std::vector<double> norm_mean = r.grads.norm_mean_relative_error();
  for (size_t p = 0; p < r.policies.size(); ++p) {
    std::printf("  %-22s %.4g", r.policies[p].c_str(), mean[p]);
    if (norms > 0) std::printf("   (%zu scales %.4g)", norms, norm_mean[p]);
    if (r.grads.draws > 1)
      std::printf("   mean of %d draws %.4g (one draw / sqrt(%d) = %.4g)", r.grads.draws, of_draws[p], r.grads.draws,
                  mean[p] / std::sqrt(static_cast<double>(r.grads.draws)));
    std::printf("\n");
  }
}

void declare_flags(FlagParser& flags) {
  std::string models;
  for (const auto& m : model_names()) models += (models.empty() ? "" : ", ") + m.first;
  flags.add("checkpoint", "string", "", "a checkpoint of actlab-train (model and data set come from its configuration)");
  flags.add("model", "string", "resnet20", "model without a checkpoint: " + models);
  flags.add("dataset", "string", "fashion-mnist",
            "data set without a checkpoint: fashion-mnist, mnist, cifar10, cifar100, folder (with --data-dir), synthetic");
  flags.add("data-dir", "string", "", "directory of the data set files (default: the data set's usual place)");
  flags.add("out", "string", "", "output directory (created; required)");
  flags.add("layers", "string", "", "comma-separated conv layers to draw in Fig. 3(a) (default: the first conv at each resolution)");
  flags.add("ratio", "float", "0.1", "DCT low-pass cut-off r = W/N in (0, 1]: keep frequencies u < r*H, v < r*W");
  flags.add("policies", "string", "division:B=8,Q=2;quant:Q=2;lfc:B=8;hfc:B=8,Q=2",
            "policies separated by ';', each one of\n" + policy_forms() + "\n" + checkpoint_forms());
  flags.add("policy-rule", "string", "",
            "per-module override PATTERN=POLICY added to every --policies entry for the gradient errors, as in "
            "actlab-train (e.g. '*.act=exact': what the GELUs' saves add to the error; '*/softmax/*=exact': a save "
            "named MODULE/OP/ROLE)",
            true);
  flags.add("block", "int", "8", "DIVISION block size B of the Fig. 3(a) DIVISION rows");
  flags.add("batch-size", "int", "32", "test images in the batch");
  flags.add("images", "int", "4", "images drawn in Fig. 3(a) (at most --batch-size)");
  flags.add("channels", "int", "2", "channels per image drawn in Fig. 3(a) (the most active ones)");
  flags.add("eval-bn", "bool", "", "BatchNorm with running statistics (default: batch statistics, as in training)");
  flags.add("seed", "int", "0", "seed of a fresh model's initialisation and of stochastic rounding");
  flags.add("precision", "string", "",
            "compute precision of the gradient errors: fp32 or bf16 (default: the checkpoint's, else fp32); under bf16 "
            "exact keeps bf16 copies and each policy is measured against exact at bf16 (docs/precision.md)");
  flags.add("draws", "int", "1",
            "stochastic-rounding draws per policy (seeds seed, seed+1, ...): the error of their mean gradient "
            "falls as 1/sqrt(draws) for an unbiased policy, a bias stays");
  flags.add("threads", "int", "2", "CPU threads");
  flags.add("overwrite", "bool", "false",
            "replace files in --out that an earlier report did not write (an earlier report's are replaced anyway)");
}

// Flag values checked before anything slow runs.
struct Settings {
  std::string out;
  bool overwrite = false;
  int64_t images = 4, channels = 2;
  bool train_bn = true;
  int64_t draws = 1;
  PolicyList policies;               // the codec of each entry (spectra, reconstructions)
  std::vector<PolicySet> policy_sets;  // each entry whole (gradient errors)
};

Settings read_settings(const FlagParser& flags, int argc, char** argv, Report* r) {
  Settings st;
  std::vector<std::string> args(argv, argv + argc);
  args[0] = "actlab-inspect";
  r->command = shell_command_line(args);
  st.out = flags.get("out");
  st.overwrite = flags.get_bool("overwrite");
  ACTLAB_CHECK(!st.out.empty(), "--out DIR is required (see --help)");
  ACTLAB_CHECK(!fs::exists(st.out) || fs::is_directory(st.out), "--out '", st.out, "' exists and is not a directory");
  r->ratio = flags.get_float("ratio");
  ACTLAB_CHECK(r->ratio > 0 && r->ratio <= 1, "--ratio must be in (0, 1], got ", flags.get("ratio"));
  r->block = flags.get_int("block");
  parse_policy("lfc:B=" + std::to_string(r->block));  // rejects a bad --block
  r->batch = flags.get_int("batch-size");
  // The default 4 shrinks to a smaller batch; a number given is checked against it.
  st.images = flags.given("images") ? flags.get_int("images") : std::min<int64_t>(4, r->batch);
  st.channels = flags.get_int("channels");
  const int64_t threads = flags.get_int("threads");
  ACTLAB_CHECK(r->batch >= 1 && st.images >= 1 && st.images <= r->batch && st.channels >= 1 && threads >= 1,
               "need --batch-size >= 1, 1 <= --images <= --batch-size, --channels >= 1, --threads >= 1; got ",
               r->batch, ", ", st.images, ", ", st.channels, ", ", threads);
  omp_set_num_threads(static_cast<int>(threads));
  r->seed = static_cast<uint64_t>(flags.get_int("seed"));
  st.draws = flags.get_int("draws");
  ACTLAB_CHECK(st.draws >= 1 && st.draws <= 10000, "--draws must be in [1, 10000], got ", flags.get("draws"));
  const std::vector<std::string> rules =
      flags.given("policy-rule") ? flags.get_all("policy-rule") : std::vector<std::string>{};
  st.policy_sets = parse_policies(flags.get("policies"), rules, &st.policies, &r->policies);
  for (const auto& codec : st.policies) r->codecs.push_back(codec->name());
  // Checked before the slow work; without the flag the checkpoint's precision is taken once it is read.
  if (flags.given("precision")) {
    r->precision = flags.get("precision");
    check_precision_supported(parse_precision(r->precision), Device::cpu());
  }
  st.train_bn = !(flags.given("eval-bn") && flags.get_bool("eval-bn"));
  r->bn_mode = st.train_bn ? "batch statistics (training mode; running statistics untouched)" : "running statistics";
  return st;
}

void write_outputs(const Settings& st, const Report& r, const Batch& batch,
                   const std::vector<const CapturedInput*>& maps) {
  fs::create_directories(st.out);
  const OutputFiles out{st.out};
  const int64_t shown = std::min(st.images, r.batch);
  write_png(out.fig3a("input"), render_grid(fig3a_grid(batch.images, Tensor(), shown, st.channels, r.ratio, r.block)));
  for (const auto& l : r.fig_layers)
    write_png(out.fig3a(l),
              render_grid(fig3a_grid(find_map(maps, l).input, batch.images, shown, st.channels, r.ratio, r.block)));
  write_lambda(out, r.spectra, r.ratio);
  write_grad_error(out, r.grads);
  write_reconstruction(out, r.inputs, r.policies, r.codecs);
  write_readme(out, r);
}

int inspect(const FlagParser& flags, int argc, char** argv) {
  Report r;
  const Settings st = read_settings(flags, argc, argv, &r);
  set_pack_seed(r.seed);
  auto t = Clock::now();
  const Setup s = load_setup(flags, r.seed);  // a bad model, data set or checkpoint fails before --out exists
  if (!flags.given("precision") && s.trained) {
    r.precision = s.config.precision;
    check_precision_supported(parse_precision(r.precision), Device::cpu());
  }
  // Before the minutes of work, not after; taken back if the work fails before it writes (a --layers typo).
  struct TakeBack {
    std::vector<std::string> made;
    ~TakeBack() { remove_empty_directories(made); }
  } const out_dir{make_output_dir(st.out, "output directory")};
  r.model_note = s.model_note;
  r.trained = s.trained;
  r.data_note = s.data.note;
  std::printf("actlab-inspect: %s on %s\n", s.model_note.c_str(), s.data.note.c_str());
  if (!s.trained)
    std::printf("note: no --checkpoint, so these are the spectra of untrained weights; trained networks differ.\n"
                "      Train one first (actlab-train --epochs 5 --save-dir runs/r20) and pass --checkpoint.\n");
  const Batch batch = first_test_batch(s.data, r.batch, r.seed);
  r.batch = batch.images.size(0);
  std::printf("[1/4] data and model ready: batch %s (%.1f s)\n", dims(batch.images.shape()).c_str(), seconds_since(t));

  t = Clock::now();
  // Linear inputs too: a transformer's (B, T, D) token maps get their spectra along the tokens, and every
  // Linear input (an MLP's or a head's (N, D) vectors included) its reconstruction.
  const std::vector<CapturedInput> inputs = capture_layer_inputs(*s.model, batch.images, st.train_bn, true);
  const std::vector<const CapturedInput*> maps = unique_maps(inputs);
  r.fig_layers = flags.given("layers") ? split_list(flags.get("layers"), ',') : default_fig_layers(maps);
  for (const auto& l : r.fig_layers) find_map(maps, l);  // unknown names fail before the long work
  // An earlier report's files are replaced, one that stopped before its README.md too (it writes that
  // last); beside a README.md of anything else (--out . in a project) nothing is replaced without --overwrite.
  const OutputFiles out{st.out};
  std::string first_line;
  std::ifstream readme(out.readme());
  const bool earlier_report =
      !fs::exists(out.readme()) || (std::getline(readme, first_line) && first_line == kReportTitle);
  for (const auto& f : out.all(r.fig_layers)) check_writable(f, st.overwrite || earlier_report, "output file");
  remove_stale_outputs("actlab-inspect", out.all(r.fig_layers));
  r.inputs = layer_spectra(inputs, st.policies, {r.ratio, r.seed, st.train_bn});
  for (const auto& row : r.inputs)
    if (row.has_spectrum) r.spectra.push_back(row);
  std::printf("[2/4] spectra of %zu conv inputs and token maps, reconstructions of %zu layer inputs (%.1f s)\n",
              r.spectra.size(), r.inputs.size(), seconds_since(t));

  t = Clock::now();
  GradErrorOptions go;
  go.seed = r.seed;
  go.train_mode = st.train_bn;
  go.draws = static_cast<int>(st.draws);
  {
    PrecisionScope precision(parse_precision(r.precision));
    r.grads = gradient_errors(*s.model, batch.images, batch.labels, st.policy_sets, go);
  }
  for (const PolicySet& set : st.policy_sets) set.check_rules_matched(s.config.model);  // --policy-rule typos
  std::printf("[3/4] weight gradients (%s): exact + %zu policies × %lld draws over %zu layers (%.1f s)\n",
              r.precision.c_str(), st.policies.size(), static_cast<long long>(st.draws), r.grads.layers.size(),
              seconds_since(t));

  t = Clock::now();
  write_outputs(st, r, batch, maps);
  std::printf("[4/4] wrote %zu figures, CSV, SVG and README.md to %s (%.1f s)\n", r.fig_layers.size() + 1,
              st.out.c_str(), seconds_since(t));
  print_summary(r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("actlab-inspect",
                   "See what DIVISION sees: the paper's Fig. 3(a) (LFC/HFC of activation maps, PNG), Fig. 4 (low- and\n"
                   "high-frequency energy per layer), and Theorem 3.1 (per-layer weight-gradient error of each policy),\n"
                   "for one batch of real test images. Writes PNG, CSV, SVG and README.md into --out.\n"
                   "Example: actlab-inspect --checkpoint runs/r20/best.safetensors --out inspect/");
  declare_flags(flags);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each stage line as it happens, also into a pipe or a file
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    return inspect(flags, argc, argv);
  } catch (const std::exception& e) {
    return report_error("actlab-inspect", e);
  }
}
