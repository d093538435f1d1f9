// The multilayer perceptron reference model: Linear -> ReLU -> ... -> Linear, softmax
// cross-entropy on integer labels. Default 784-256-256-10 for Fashion-MNIST.
#pragma once

#include <cstdint>
#include <vector>

#include "memplan/graph/graph.h"

namespace memplan::models {

struct MlpConfig {
  std::int64_t inputs = 784;
  std::vector<std::int64_t> hidden = {256, 256};
  std::int64_t classes = 10;
};

// Forward graph for one batch: inputs "x" [B, inputs] f32 and "labels" [B] i32; output
// "logits" [B, classes]; loss "loss" (mean cross-entropy). Parameters "fcN.weight" [out, in]
// and "fcN.bias" [out], initialised as PyTorch's nn.Linear (U(±1/sqrt(in))).
graph::Graph build_mlp(const MlpConfig& config, std::int64_t batch);

}  // namespace memplan::models
