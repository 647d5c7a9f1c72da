// The scale-out model's tables (docs/scale-out.md): predicted data-parallel throughput of ResNet-50 and
// Swin-T on ImageNet at 8, 64 and 512 GPUs over stated ring links, with and without DIVISION, from
// dist/scale_model.h — the gradient buckets actlab's reducer makes, backward's multiply-accumulates per
// layer (models/summary.h) for when each bucket is ready, and per-GPU step times: the paper's measured
// RTX 3090 throughput for ResNet-50 (train/paper_reference.h), Swin-T's from it by a ratio measured on
// this project's CPU. Two more modes check the model against this machine:
//   bench_scale --measure-link            under mpirun -np N: all-reduce times through actlab's MPI
//                                         communicator, fitted to the ring model (bandwidth, latency)
//   bench_scale --check --compute-ms T --link-gbs B --latency-us L
//                                         the model's 2-rank ResNet-18 prediction (per-rank step T ms)
//                                         beside bench/bench_dist.sh's measurement
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "actlab/core/error.h"
#include "actlab/core/tensor.h"
#include "actlab/dist/communicator.h"
#include "actlab/dist/scale_model.h"
#include "actlab/io/markdown.h"
#include "actlab/models/registry.h"
#include "actlab/models/summary.h"
#include "actlab/train/cli.h"
#include "actlab/train/paper_reference.h"

namespace {

using namespace actlab;

// Parameters in registration order with the share of backward done when each gradient is final: backward
// runs the layers last to first, so a layer's gradients are ready once every layer from the last down to
// it has run; its cost is taken as proportional to its multiply-accumulates (Conv2d and Linear; the
// element-wise layers are cheap beside them).
std::vector<ParamCost> param_costs(const std::string& model, int64_t channels, int64_t classes, int64_t image) {
  auto net = make_model(ModelSpec{model, channels, classes, image});
  const ModelSummaryTable table = summarize_model(*net, {channels, image, image});
  std::map<std::string, double> ready;  // module path -> share of backward done after it
  double after = 0;
  for (auto row = table.rows.rbegin(); row != table.rows.rend(); ++row) {
    after += static_cast<double>(row->macs);
    ready[row->path] = table.total_macs > 0 ? after / static_cast<double>(table.total_macs) : 1.0;
  }
  std::vector<ParamCost> out;
  for (const auto& [name, p] : net->named_parameters()) {
    const std::string path = name.substr(0, name.rfind('.'));
    const auto it = ready.find(path);
    out.push_back({static_cast<int64_t>(p.data().nbytes()), it == ready.end() ? 1.0 : std::min(1.0, it->second)});
  }
  return out;
}

struct Link {
  std::string name;
  RingLink ring;
};

// The whole numbers of a ',' list flag; Error naming the flag and the item that is not one ("8x", "abc").
std::vector<int64_t> int_list(const FlagParser& flags, const std::string& name) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(flags.get(name), ',')) {
    int64_t v = 0;
    ACTLAB_CHECK(parse_int(item, &v), "--", name, ": '", item, "' is not a whole number");
    out.push_back(v);
  }
  return out;
}

// "name=GB/s@µs;..." -> links.
std::vector<Link> parse_links(const std::string& spec) {
  std::vector<Link> out;
  for (const auto& item : split_list(spec, ';')) {
    const size_t eq = item.find('='), at = item.find('@');
    ACTLAB_CHECK(eq != std::string::npos && at != std::string::npos && at > eq,
                 "--links: each link is NAME=GB/s@latency-µs, got '", item, "'");
    double gbs = 0, us = 0;
    ACTLAB_CHECK(parse_float(item.substr(eq + 1, at - eq - 1), &gbs) && parse_float(item.substr(at + 1), &us) &&
                     gbs > 0 && us >= 0,
                 "--links: bandwidth must be a number > 0 and latency a number >= 0 in '", item, "'");
    out.push_back({item.substr(0, eq), RingLink{gbs * 1e9, us * 1e-6}});
  }
  ACTLAB_CHECK(!out.empty(), "--links is empty");
  return out;
}

// One configuration of a table: a method at a per-GPU batch with its per-GPU step time.
struct Setting {
  std::string label;
  int64_t batch;
  double step_s;
};

void print_table(const std::string& model, const std::vector<ParamCost>& params, const std::vector<Setting>& settings,
                 const std::vector<int64_t>& ranks, const std::vector<Link>& links) {
  int64_t grad_bytes = 0;
  for (const auto& p : params) grad_bytes += p.bytes;
  const int64_t buckets = predict_step(params, StepInputs{}, 2, links[0].ring).buckets;
  std::printf("\n**%s** (%.1f MiB of fp32 gradients a step in %lld buckets; img/s of the whole job, efficiency "
              "against no communication in brackets)\n\n",
              model.c_str(), static_cast<double>(grad_bytes) / (1 << 20), static_cast<long long>(buckets));
  std::printf("| link | method | batch / GPU | 1 GPU |");
  for (int64_t n : ranks) std::printf(" %lld GPUs |", static_cast<long long>(n));
  std::printf("\n|---|---|---|---|");
  for (size_t i = 0; i < ranks.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const Link& link : links)
    for (const Setting& s : settings) {
      std::printf("| %s | %s | %lld | %.0f |", link.name.c_str(), s.label.c_str(), static_cast<long long>(s.batch),
                  static_cast<double>(s.batch) / s.step_s);
      for (int64_t n : ranks) {
        StepInputs in;
        in.compute_s = s.step_s;
        const StepPrediction p = predict_step(params, in, n, link.ring);
        std::printf(" %.0f (%.0f %%) |", static_cast<double>(n * s.batch) / p.step_s(), 100 * p.efficiency());
      }
      std::printf("\n");
    }
}

// Fixed global batch: Normal at its largest per-GPU batch needs global/b GPUs; DIVISION, fitting twice
// the batch, needs half as many for the same global batch.
void print_fixed_global(const std::string& model, const std::vector<ParamCost>& params,
                        const std::vector<Setting>& settings, const std::vector<int64_t>& globals, const Link& link) {
  std::printf("\n**%s, fixed global batch, %s**\n\n| global batch | method | batch / GPU | GPUs | img/s | img/s per GPU "
              "| efficiency |\n|---|---|---|---|---|---|---|\n",
              model.c_str(), link.name.c_str());
  for (int64_t g : globals)
    for (const Setting& s : settings) {
      if (g % s.batch != 0) continue;
      const int64_t n = g / s.batch;
      StepInputs in;
      in.compute_s = s.step_s;
      const StepPrediction p = predict_step(params, in, n, link.ring);
      const double rate = static_cast<double>(g) / p.step_s();
      std::printf("| %lld | %s | %lld | %lld | %.0f | %.0f | %.0f %% |\n", static_cast<long long>(g), s.label.c_str(),
                  static_cast<long long>(s.batch), static_cast<long long>(n), rate, rate / static_cast<double>(n),
                  100 * p.efficiency());
    }
}

double paper_step_s(const std::string& method, int64_t batch) {
  const double rate = paper_throughput(method, "resnet50_imagenet", batch);
  ACTLAB_CHECK(rate > 0, "no paper throughput for ", method, " at batch ", batch);
  return static_cast<double>(batch) / rate;
}

int measure_link(int64_t reps, const std::vector<int64_t>& sizes_kib) {
  auto comm = make_mpi_communicator(120);
  const int n = comm->world_size();
  ACTLAB_CHECK(n >= 2, "--measure-link needs at least 2 ranks: mpirun -np 2 bench_scale --measure-link");
  std::vector<double> sizes, times;
  if (comm->rank() == 0)
    std::printf("all-reduce through actlab's MPI communicator, %d ranks, median of %lld\n| MiB | ms |\n|---|---|\n", n,
                static_cast<long long>(reps));
  for (const int64_t kib : sizes_kib) {
    Tensor t = Tensor::zeros({kib * 256});
    std::vector<double> ts;
    for (int64_t r = 0; r < reps + 1; ++r) {
      std::vector<double> sync = {0};
      comm->allreduce(sync, ReduceOp::Sum);  // start together
      const auto start = std::chrono::steady_clock::now();
      comm->allreduce_sum_async(t)->wait();
      if (r > 0) ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(ts.begin(), ts.end());
    std::vector<double> med = {ts[ts.size() / 2]};
    comm->allreduce(med, ReduceOp::Max);  // the slowest rank's median: what a step waits for
    sizes.push_back(static_cast<double>(kib) * 1024);
    times.push_back(med[0]);
    if (comm->rank() == 0) std::printf("| %.3f | %.3f |\n", static_cast<double>(kib) / 1024, 1e3 * med[0]);
  }
  // Read through the ring model t = a + b·bytes, a = 2(N−1)·latency, b = 2(N−1)/N / bandwidth: a is the
  // smallest message's time, b the least-squares slope over the messages of 1 MiB and more (where the
  // bytes, not the per-message cost, set the time).
  double sx = 0, sy = 0, sxx = 0, sxy = 0, k = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < (1 << 20)) continue;
    sx += sizes[i], sy += times[i], sxx += sizes[i] * sizes[i], sxy += sizes[i] * times[i], k += 1;
  }
  const double b = (k * sxy - sx * sy) / (k * sxx - sx * sx), a = times[0];
  const double steps = 2.0 * (n - 1);
  if (comm->rank() == 0)
    std::printf("fit: bandwidth %.2f GB/s, latency %.1f µs per ring step (--link-gbs %.2f --latency-us %.1f)\n",
                steps / n / b / 1e9, std::max(0.0, a / steps) * 1e6, steps / n / b / 1e9, std::max(0.0, a / steps) * 1e6);
  return 0;
}

int check(const FlagParser& flags) {
  ACTLAB_CHECK(flags.given("compute-ms") && flags.given("link-gbs"),
               "--check needs --compute-ms (one rank's step, measured) and --link-gbs (from --measure-link)");
  // bench/bench_dist.sh's input: --dataset synthetic, 1×28×28 images, 10 classes.
  const std::vector<ParamCost> params = param_costs("resnet18", 1, 10, 28);
  const RingLink link{flags.get_float("link-gbs") * 1e9, flags.get_float("latency-us") * 1e-6};
  const int64_t batch = flags.get_int("check-batch");
  ACTLAB_CHECK(batch >= 1, "--check-batch must be >= 1, got ", batch);
  std::printf("ResNet-18 (1×28×28 synthetic images, as bench/bench_dist.sh), 2 ranks of batch %lld, one rank's step %.1f ms, link %.2f GB/s + %.1f µs\n"
              "| buckets: cap / tail MiB | buckets | all-reduce ms a step | exposed ms | predicted job img/s |\n"
              "|---|---|---|---|---|\n",
              static_cast<long long>(batch), flags.get_float("compute-ms"), flags.get_float("link-gbs"),
              flags.get_float("latency-us"));
  for (const auto& [cap, tail] : std::vector<std::pair<int64_t, int64_t>>{{25, 0}, {25, 1}, {1, 0}}) {
    StepInputs in;
    in.compute_s = flags.get_float("compute-ms") * 1e-3;
    in.bucket_cap_bytes = cap << 20;
    in.bucket_tail_bytes = tail << 20;
    const StepPrediction p = predict_step(params, in, 2, link);
    std::printf("| %lld / %lld | %lld | %.1f | %.1f | %.1f |\n", static_cast<long long>(cap), static_cast<long long>(tail),
                static_cast<long long>(p.buckets), 1e3 * p.comm_s, 1e3 * p.exposed_s,
                2.0 * static_cast<double>(batch) / p.step_s());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("bench_scale",
                   "Predicted data-parallel throughput on many GPUs from a step-time model (dist/scale_model.h, "
                   "docs/scale-out.md), and its checks against this machine.");
  flags.add("ranks", "string", "8,64,512", "comma-separated GPU counts of the tables");
  flags.add("links", "string", "25GbE=3.125@25;100Gb-IB=12.5@5;400Gb=50@3",
            "ring links, ';'-separated NAME=GB/s@latency-µs (per GPU, per ring step)");
  flags.add("swin-ratio", "float", "0.51",
            "Swin-T's throughput over ResNet-50's at 224² (0.51: Swin-T's per-image step takes 1/0.51 of "
            "ResNet-50's, measured on this project's CPU: docs/scale-out.md)");
  flags.add("global-batches", "string", "4096,32768", "comma-separated global batches of the fixed-global-batch table");
  flags.add("gpu-speedup", "float", "1",
            "divide every per-GPU step time by this: a GPU that many times the paper's RTX 3090 (the codec's "
            "share of the step assumed unchanged)");
  flags.add("measure-link", "bool", "false", "under mpirun -np N: time all-reduces and fit the ring model");
  flags.add("reps", "int", "20", "--measure-link: all-reduces per size");
  flags.add("sizes-kib", "string", "4,64,1024,4096,16384",
            "--measure-link: comma-separated message sizes, KiB, smallest first (the smallest gives the latency)");
  flags.add("check", "bool", "false", "predict the 2-rank ResNet-18 run of bench/bench_dist.sh");
  flags.add("compute-ms", "float", "0", "--check: one rank's step without communication, ms");
  flags.add("check-batch", "int", "64", "--check: batch per rank");
  flags.add("link-gbs", "float", "0", "--check: link bandwidth, GB/s");
  flags.add("latency-us", "float", "0", "--check: latency per ring step, µs");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    if (flags.get_bool("measure-link")) {
      const std::vector<int64_t> sizes = int_list(flags, "sizes-kib");
      ACTLAB_CHECK(sizes.size() >= 3 && std::is_sorted(sizes.begin(), sizes.end()) && sizes.front() >= 1,
                   "--sizes-kib: at least three sizes >= 1, smallest first");
      return measure_link(flags.get_int("reps"), sizes);
    }
    if (flags.get_bool("check")) return check(flags);
    const std::vector<int64_t> ranks = int_list(flags, "ranks"), globals = int_list(flags, "global-batches");
    ACTLAB_CHECK(!ranks.empty() && !globals.empty(), "--ranks and --global-batches each need one or more counts");
    for (int64_t n : ranks) ACTLAB_CHECK(n >= 1, "--ranks must be >= 1, got ", n);
    // Every method's per-GPU batch (128, 256, 512 below) must divide each global batch, or its rows would be
    // left out of the table without a word.
    for (int64_t g : globals)
      ACTLAB_CHECK(g >= 512 && g % 512 == 0, "--global-batches: each must be a multiple of 512 (the per-GPU batches "
                   "128, 256 and 512 must divide it), got ", g);
    const std::vector<Link> links = parse_links(flags.get("links"));
    const double swin_ratio = flags.get_float("swin-ratio"), speedup = flags.get_float("gpu-speedup");
    ACTLAB_CHECK(swin_ratio > 0 && speedup > 0, "--swin-ratio and --gpu-speedup must be > 0");
    // Per-GPU step times. ResNet-50: the paper's RTX 3090 (24 GB) logs under AMP; Normal runs out of
    // memory at 512, DIVISION does not. Swin-T: ResNet-50's times scaled by the measured per-image ratio,
    // DIVISION's overhead taken as ResNet-50's at the same batch; Normal's largest batch is 128 on 24 GB
    // (its measured 13.8 GiB at 128 doubles to 27.5 GiB at 256), DIVISION fits 512 (2.1 GiB at 128).
    const std::vector<Setting> r50 = {{"Normal", 256, paper_step_s("Normal", 256) / speedup},
                                      {"DIVISION", 256, paper_step_s("DIVISION", 256) / speedup},
                                      {"DIVISION", 512, paper_step_s("DIVISION", 512) / speedup}};
    const std::vector<Setting> swin = {{"Normal", 128, paper_step_s("Normal", 128) / swin_ratio / speedup},
                                       {"DIVISION", 128, paper_step_s("DIVISION", 128) / swin_ratio / speedup},
                                       {"DIVISION", 512, paper_step_s("DIVISION", 512) / swin_ratio / speedup}};
    std::printf("per-GPU step times: the paper's RTX 3090 (AMP) for ResNet-50%s; Swin-T's per image %.3f× as fast "
                "(--swin-ratio)\n",
                speedup == 1 ? "" : (" divided by " + md_number(speedup, 3) + " (--gpu-speedup)").c_str(),
                swin_ratio);
    const std::vector<ParamCost> r50_params = param_costs("resnet50_imagenet", 3, 1000, 224);
    const std::vector<ParamCost> swin_params = param_costs("swin_t", 3, 1000, 224);
    print_table("ResNet-50", r50_params, r50, ranks, links);
    print_table("Swin-T", swin_params, swin, ranks, links);
    for (const Link& link : links) print_fixed_global("ResNet-50", r50_params, {r50[0], r50[2]}, globals, link);
    for (const Link& link : links) print_fixed_global("Swin-T", swin_params, {swin[0], swin[2]}, globals, link);
    return 0;
  } catch (const std::exception& e) {
    return report_error("bench_scale", e);
  }
}
