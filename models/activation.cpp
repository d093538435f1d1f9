#include "memplan/models/activation.h"

namespace memplan::models {

TensorId apply_activation(graph::Builder& b, Activation act, TensorId x, const std::string& name) {
  switch (act) {
    case Activation::gelu: return b.gelu(x, name);
    case Activation::relu: return b.relu(x, name);
    case Activation::silu: break;
  }
  return b.silu(x, name);
}

const char* activation_title(Activation act) {
  switch (act) {
    case Activation::gelu: return "GELU";
    case Activation::relu: return "ReLU";
    case Activation::silu: break;
  }
  return "SiLU";
}

}  // namespace memplan::models
