// The paper's Table 1(a) figures and method names (train/paper_reference.h).
#include "actlab/train/paper_reference.h"

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

std::string paper_method_name(const std::string& policy) {
  const size_t plus = policy.find('+');
  if (plus == std::string::npos) return single_name(policy);
  return single_name(policy.substr(0, plus)) + "+" + single_name(policy.substr(plus + 1));
}

}  // namespace actlab
