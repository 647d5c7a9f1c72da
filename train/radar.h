// The DIVISION paper's Fig. 1 radar — test accuracy, activation-memory saving and training throughput
// per method — joined from three CSVs by canonical policy string (train/grid.h): the ablation grid's
// results.csv (accuracy: mean over finished seeds), actlab-memtable --csv (activation_gib) and
// bench_train --csv (img_per_s), the last two at the grid's batch and input shape. actlab-ablate --radar
// draws it.
// Tested in tests/test_ablate.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actlab/analysis/plot.h"

namespace actlab {

struct RadarInputs {
  std::string results_csv, memory_csv, throughput_csv;
  std::string model;    // empty: the one model of results.csv's rows (Error when it holds several)
  std::string dataset;  // empty: the one data set of that model's rows (Error when it has several)
};

// One method. Memory and throughput are relative to Normal (exact) of the same model and batch, so
// Normal sits at 1 on both and larger is better on every axis.
struct RadarPoint {
  std::string method, policy;   // paper_method_name(policy), canonical_policy(...)
  // Test accuracy %: the mean over the done seeds; for a method run on other seeds than Normal (fewer),
  // Normal's mean plus the method's mean difference from Normal on the seeds both ran (paired_with_normal;
  // mean_difference_at_shared_seeds in train/grid.h).
  double accuracy = 0;
  int seeds = 0;
  bool paired_with_normal = false;
  double memory_saving = 0;     // Normal's activation memory / this method's
  double throughput_ratio = 0;  // this method's img/s / Normal's
};

struct RadarData {
  std::string model, dataset;
  int64_t batch = 0;                 // the grid's, which the memory and throughput rows were taken at
  int64_t image_size = 0, channels = 0;  // the grid's input shape (results.csv's), likewise
  std::vector<RadarPoint> points;    // in results.csv's order
  std::vector<std::string> skipped;  // "SWAP (swap:P=2): not in 'mem.csv'", one per method left out
                                     // (also a method with runs in results.csv but none done)
};

// Reads and joins the three files. results.csv rows: status "done", and those of Fig. 6 when any row
// is listed there (else every row). The memory and throughput files: rows of the same model at the
// batch and input shape (image_size, channels) of those results.csv rows. A method missing from a file
// is left out (RadarData::skipped). Throws Error (one line naming the file) for an unreadable file, a
// missing column (an older tool's file without the input shape included), a done cell with no input shape
// (run before actlab-train recorded it), no rows for the model or none at the grid's batch and input,
// runs at several batches or inputs, no Normal (exact) row to compare with, or several models (data
// sets) without RadarInputs::model (RadarInputs::dataset).
RadarData read_radar_data(const RadarInputs& inputs);

// The chart: one polygon per method; axes test accuracy (%) from below the worst method to a round
// hi, memory saving (×) on a log axis from 0.5× (or below the worst method) with rings a power of 2
// apart, throughput (×) from 0 to a round hi.
plot::RadarChart radar_chart(const RadarData& data);

// [lo, lo + 4·step] covering [lo0, hi0] with a step of 1, 2, 2.5 or 5 × 10^k, so that every ring of
// the radar is a round number. lo0 <= hi0.
std::pair<double, double> radar_range(double lo0, double hi0);

}  // namespace actlab
