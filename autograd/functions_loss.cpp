// Softmax cross-entropy (saves its probabilities) and top-1 counting.
#include "actlab/autograd/functions.h"
#include "actlab/core/ops.h"

namespace actlab {
namespace {

// saves: probabilities (N,K) and labels (N), exact.
class CrossEntropyNode final : public Node {
 public:
  explicit CrossEntropyNode(float smoothing) : smoothing_(smoothing) {}
  const char* name() const override { return "cross_entropy"; }
  const SlotList& slots() const override {
    static const SlotList s = {"probs", "labels"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const float dloss = g[0].item();
    return {ops::cross_entropy_backward(load("probs"), load("labels"), smoothing_, dloss)};
  }
 private:
  float smoothing_;
};

}  // namespace

Variable cross_entropy(const Variable& logits, const Tensor& labels, float label_smoothing) {
  Tensor probs;
  Tensor loss = ops::cross_entropy_forward(logits.data().contiguous(), labels, label_smoothing, &probs);
  auto node = make_node<CrossEntropyNode>({&logits}, label_smoothing);
  if (node) {
    node->save_exact("probs", probs);
    node->save_exact("labels", labels);
  }
  return make_output(std::move(loss), node);
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) { return ops::count_correct(logits, labels); }

}  // namespace actlab
