// The convolutional reference model: a small ResNet for 28x28 grey images (Fashion-MNIST).
// conv3x3-BN-ReLU stem, residual stages (two conv3x3-BN per block, a 1x1 conv-BN shortcut where
// the shape changes; every stage after the first halves the resolution), global average pooling,
// one linear layer, softmax cross-entropy. Not a model zoo entry: it trains here, on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "memplan/graph/graph.h"

namespace memplan::models {

struct CnnConfig {
  std::int64_t in_channels = 1;
  std::int64_t image = 28;                        // height = width
  std::vector<std::int64_t> widths = {16, 32, 64};  // channels per stage; the stem has widths[0]
  std::int64_t blocks_per_stage = 1;
  std::int64_t classes = 10;
  float bn_momentum = 0.1f;
};

// Forward graph for one batch: inputs "x" [B, in_channels*image*image] f32 (viewed as NCHW
// inside) and "labels" [B] i32; output "logits" [B, classes]; loss "loss". Parameters follow
// PyTorch's names and initialisation (conv/linear U(+-1/sqrt(fan_in)), BN weight 1, bias 0);
// BN running statistics "*.running_mean"/"*.running_var" are persistent non-parameter state.
// `training` false builds the evaluation graph: BN uses the running statistics.
graph::Graph build_cnn(const CnnConfig& config, std::int64_t batch, bool training = true);

}  // namespace memplan::models
