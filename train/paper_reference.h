// The DIVISION paper's published figures that actlab's tables print beside their own measurements, kept
// in one place (transcribed from the official repository's memory table, accuracy plot and speed logs;
// see ../shared/docs/division-reference.md §7.1 to §7.3), and the paper's name for each of actlab's policy strings.
// Tested in tests/test_step.cpp.
#pragma once
#include <cstdint>
#include <string>

namespace actlab {

// Table 1(a): ImageNet 224x224, total and activation memory in GB per method, network and batch.
// A negative figure: the paper reports OOM. nullptr: the paper has no such cell.
struct PaperMemory {
  const char* method;  // "Normal", "Checkpoint", "BLPA", "AC-GC", "ActNN", "DIVISION"
  const char* model;   // actlab's name: resnet50_imagenet, wrn50_2_imagenet
  int64_t batch;
  double total_gb;
  double activation_gb;
};
const PaperMemory* paper_table_1a(const std::string& method, const std::string& model, int64_t batch);

// Top-1 test accuracy (%) the paper reports for a method ("Normal", "DIVISION", "ActNN", "BLPA", "AC-GC")
// on actlab's model and data set names (resnet18 + cifar10, preact_resnet164 + cifar100, ...); NaN when
// the paper has no such figure.
double paper_accuracy(const std::string& method, const std::string& model, const std::string& dataset);

// Fig. 7: training throughput (img/s) of a method on ImageNet 224x224 at a batch, one RTX 3090 under AMP,
// from the official repository's speed logs (../shared/docs/division-reference.md §7.3; its JSON values:
// the older logs for Normal, Checkpoint and SWAP). NaN when the paper has no such figure, -1 where it
// reports OOM.
double paper_throughput(const std::string& method, const std::string& model, int64_t batch);

// The paper's name for a policy string ("exact" → "Normal", "checkpoint:segments=4" → "Checkpoint",
// "division:B=8,Q=2" → "DIVISION", a combination such as "checkpoint+division:B=8,Q=2" →
// "Checkpoint+DIVISION"; checkpointing with exact saves, "checkpoint:segments=auto+exact", is
// "Checkpoint"); the string itself when the paper has no name for it.
std::string paper_method_name(const std::string& policy);

}  // namespace actlab
