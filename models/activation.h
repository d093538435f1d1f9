// The activations of the transformers' MLPs: the rotary decoders' gates (LlamaConfig::gate) and
// T5's feed-forward (T5Config::act), one enum so that configs read them and builders apply them alike.
#pragma once

#include <cstdint>
#include <string>

#include "memplan/graph/builder.h"

namespace memplan::models {

enum class Activation : std::uint8_t { silu, gelu, relu };

// act(x) as one op named `name` (GELU in its erf form).
TensorId apply_activation(graph::Builder& b, Activation act, TensorId x, const std::string& name);
// "SiLU", "GELU", "ReLU": how descriptions name it.
const char* activation_title(Activation act);

}  // namespace memplan::models
