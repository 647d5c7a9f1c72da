// The paper's Table 1(a) figures, its accuracy and throughput figures and method names (train/paper_reference.h).
#include "actlab/train/paper_reference.h"

#include <limits>

namespace actlab {
namespace {

// ResNet-50 and WRN-50-2 at batch 64/128/256/512; -1: OOM in the paper.
const PaperMemory kTable1a[] = {
    {"Normal", "resnet50_imagenet", 64, 5.46, 5.14},       {"Normal", "resnet50_imagenet", 128, 10.62, 10.25},
    {"Normal", "resnet50_imagenet", 256, 20.92, 20.48},    {"Normal", "resnet50_imagenet", 512, -1, -1},
    {"Checkpoint", "resnet50_imagenet", 64, 2.57, 2.24},   {"Checkpoint", "resnet50_imagenet", 128, 4.84, 4.48},
    {"Checkpoint", "resnet50_imagenet", 256, 9.39, 8.95},  {"Checkpoint", "resnet50_imagenet", 512, 18.49, 17.90},
    {"BLPA", "resnet50_imagenet", 64, 1.15, 0.82},         {"BLPA", "resnet50_imagenet", 128, 2.01, 1.64},
    {"BLPA", "resnet50_imagenet", 256, 3.72, 3.28},        {"BLPA", "resnet50_imagenet", 512, 7.14, 6.56},
    {"AC-GC", "resnet50_imagenet", 64, 1.80, 1.47},        {"AC-GC", "resnet50_imagenet", 128, 3.31, 2.94},
    {"AC-GC", "resnet50_imagenet", 256, 6.31, 5.88},       {"AC-GC", "resnet50_imagenet", 512, 12.33, 11.75},
    {"ActNN", "resnet50_imagenet", 64, 0.81, 0.49},        {"ActNN", "resnet50_imagenet", 128, 1.34, 0.97},
    {"ActNN", "resnet50_imagenet", 256, 2.39, 1.94},       {"ActNN", "resnet50_imagenet", 512, 4.47, 3.89},
    {"DIVISION", "resnet50_imagenet", 64, 0.82, 0.49},     {"DIVISION", "resnet50_imagenet", 128, 1.35, 0.99},
    {"DIVISION", "resnet50_imagenet", 256, 2.41, 1.97},    {"DIVISION", "resnet50_imagenet", 512, 4.52, 3.94},
    {"Normal", "wrn50_2_imagenet", 64, 7.52, 6.70},        {"Normal", "wrn50_2_imagenet", 128, 14.23, 13.38},
    {"Normal", "wrn50_2_imagenet", 256, 27.68, 26.75},     {"Normal", "wrn50_2_imagenet", 512, -1, -1},
    {"Checkpoint", "wrn50_2_imagenet", 64, 3.05, 2.24},    {"Checkpoint", "wrn50_2_imagenet", 128, 5.33, 4.48},
    {"Checkpoint", "wrn50_2_imagenet", 256, 9.88, 8.95},   {"Checkpoint", "wrn50_2_imagenet", 512, -1, -1},
    {"BLPA", "wrn50_2_imagenet", 64, 1.87, 1.06},          {"BLPA", "wrn50_2_imagenet", 128, 2.96, 2.11},
    {"BLPA", "wrn50_2_imagenet", 256, 5.15, 4.22},         {"BLPA", "wrn50_2_imagenet", 512, 9.51, 8.44},
    {"AC-GC", "wrn50_2_imagenet", 64, 2.72, 1.91},         {"AC-GC", "wrn50_2_imagenet", 128, 4.66, 3.81},
    {"AC-GC", "wrn50_2_imagenet", 256, 8.53, 7.61},        {"AC-GC", "wrn50_2_imagenet", 512, 16.27, 15.20},
    {"ActNN", "wrn50_2_imagenet", 64, 1.44, 0.62},         {"ActNN", "wrn50_2_imagenet", 128, 2.09, 1.25},
    {"ActNN", "wrn50_2_imagenet", 256, 3.41, 2.49},        {"ActNN", "wrn50_2_imagenet", 512, 6.03, 4.97},
    {"DIVISION", "wrn50_2_imagenet", 64, 1.45, 0.64},      {"DIVISION", "wrn50_2_imagenet", 128, 2.12, 1.27},
    {"DIVISION", "wrn50_2_imagenet", 256, 3.44, 2.52},     {"DIVISION", "wrn50_2_imagenet", 512, 6.08, 5.02},
};

// §7.2's accuracy plot, CIFAR rows. The ImageNet rows are left out: actlab reads ImageNet as an image
// folder ("folder"), a name that does not say which data set it holds.
struct PaperAccuracy {
  const char* method;
  const char* model;
  const char* dataset;
  double top1;
};
const PaperAccuracy kAccuracy[] = {
    {"Normal", "resnet18", "cifar10", 94.89},           {"DIVISION", "resnet18", "cifar10", 94.72},
    {"ActNN", "resnet18", "cifar10", 94.84},            {"AC-GC", "resnet18", "cifar10", 90.43},
    {"Normal", "preact_resnet164", "cifar10", 94.90},   {"DIVISION", "preact_resnet164", "cifar10", 94.50},
    {"BLPA", "preact_resnet164", "cifar10", 94.51},     {"Normal", "preact_resnet164", "cifar100", 77.30},
    {"DIVISION", "preact_resnet164", "cifar100", 76.9}, {"BLPA", "preact_resnet164", "cifar100", 76.42},
    {"AC-GC", "preact_resnet164", "cifar100", 73.37},   {"Normal", "densenet121", "cifar100", 79.75},
    {"DIVISION", "densenet121", "cifar100", 79.47},     {"ActNN", "densenet121", "cifar100", 78.95},
};

// §7.3: img/s at batch 64/128/256/512 (-1: OOM; NaN: no figure).
struct PaperSpeed {
  const char* method;
  const char* model;
  double at[4];
};
constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
const PaperSpeed kThroughput[] = {
    {"DIVISION", "resnet50_imagenet", {369.82, 378.87, 380.72, 380.78}},
    {"ActNN", "resnet50_imagenet", {266.15, 296.25, 308.33, 315.55}},
    {"Checkpoint", "resnet50_imagenet", {118.03, 120.74, 122.14, 122.87}},
    {"Normal", "resnet50_imagenet", {444.2, 463.51, 469.05, -1}},
    {"SWAP", "resnet50_imagenet", {50.81, 45.47, kNone, kNone}},
    {"DIVISION", "wrn50_2_imagenet", {239.07, 250.78, 252.66, 253.39}},
    {"ActNN", "wrn50_2_imagenet", {191.35, 206.51, 212.31, 215.93}},
    {"Checkpoint", "wrn50_2_imagenet", {84.91, 87.69, 88.25, kNone}},
    {"Normal", "wrn50_2_imagenet", {286.89, 301.25, 303.24, -1}},
    {"SWAP", "wrn50_2_imagenet", {45.24, 34.99, kNone, kNone}},
};

std::string single_name(const std::string& policy) {
  const std::string name = policy.substr(0, policy.find(':'));
  if (name == "exact") return "Normal";
  if (name == "checkpoint") return "Checkpoint";
  if (name == "division") return "DIVISION";
  if (name == "mesa") return "Mesa";
  if (name == "actnn") return "ActNN";
  if (name == "blpa") return "BLPA";
  if (name == "acgc") return "AC-GC";
  if (name == "swap") return "SWAP";
  return policy;
}

}  // namespace

const PaperMemory* paper_table_1a(const std::string& method, const std::string& model, int64_t batch) {
  for (const PaperMemory& p : kTable1a)
    if (method == p.method && model == p.model && batch == p.batch) return &p;
  return nullptr;
}

double paper_throughput(const std::string& method, const std::string& model, int64_t batch) {
  const int64_t batches[] = {64, 128, 256, 512};
  for (const PaperSpeed& p : kThroughput)
    if (method == p.method && model == p.model)
      for (int i = 0; i < 4; ++i)
        if (batches[i] == batch) return p.at[i];
  return kNone;
}

double paper_accuracy(const std::string& method, const std::string& model, const std::string& dataset) {
  for (const PaperAccuracy& a : kAccuracy)
    if (method == a.method && model == a.model && dataset == a.dataset) return a.top1;
  return std::numeric_limits<double>::quiet_NaN();
}

std::string paper_method_name(const std::string& policy) {
  if (policy.find('|') != std::string::npos) return policy;  // per-module rules: none of the paper's methods
  const size_t plus = policy.find('+');
  if (plus == std::string::npos) return single_name(policy);
  if (policy.substr(plus + 1) == "exact") return single_name(policy.substr(0, plus));  // exact saves: no second method
  return single_name(policy.substr(0, plus)) + "+" + single_name(policy.substr(plus + 1));
}

}  // namespace actlab
