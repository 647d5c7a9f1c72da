// MLP: construction and forward.
#include "actlab/models/mlp.h"

namespace actlab {

Mlp::Mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t num_classes, float dropout)
    : in_features_(in_features), hidden_(hidden) {
  ACTLAB_CHECK(in_features > 0 && num_classes > 0, "Mlp: bad sizes ", in_features, " features, ", num_classes,
               " classes");
  register_module("flatten", std::make_shared<Flatten>());
  int64_t width = in_features;
  for (size_t i = 0; i < hidden.size(); ++i) {
    ACTLAB_CHECK(hidden[i] > 0, "Mlp: hidden layer ", i + 1, " has width ", hidden[i]);
    const std::string k = std::to_string(i + 1);
    register_module("fc" + k, std::make_shared<Linear>(width, hidden[i]));
    register_module("relu" + k, std::make_shared<ReLU>());
    if (dropout > 0.f) register_module("dropout" + k, std::make_shared<Dropout>(dropout));
    width = hidden[i];
  }
  register_module("fc", std::make_shared<Linear>(width, num_classes));
}

Variable Mlp::forward(const Variable& x) {
  ACTLAB_CHECK(x.dim() >= 2 && x.data().numel() == x.size(0) * in_features_, "Mlp: input ",
               shape_str(x.shape()), " does not hold ", in_features_, " features per sample");
  Variable h = x;
  for (const auto& c : children()) h = (*c.second)(h);
  return h;
}

std::string Mlp::describe() const {
  std::string widths;
  for (int64_t w : hidden_) widths += (widths.empty() ? "" : ",") + std::to_string(w);
  return detail::concat("Mlp(in=", in_features_, ", hidden=", widths.empty() ? "none" : widths, ")");
}

}  // namespace actlab
