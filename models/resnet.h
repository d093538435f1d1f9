// ResNet-50 (torchvision's layout, stride on the 3x3 convolution) for planning at real scale:
// a 7x7 stem, bottleneck blocks 3-4-6-3 with widths 64-128-256-512 (x4 expansion), batch norm,
// global average pooling and a linear classifier. Convolutions run as im2col + GEMM, so every
// convolution's columns are a tensor of the graph (a 1x1 stride-1 one copies its input).
#pragma once

#include <cstdint>
#include <vector>

#include "memplan/graph/graph.h"

namespace memplan::models {

struct ResnetConfig {
  std::vector<std::int64_t> blocks = {3, 4, 6, 3};
  std::int64_t image = 224;
  std::int64_t channels = 3;
  std::int64_t classes = 1000;
  graph::DType dtype = graph::DType::f32;
};

// Input "x" [B, channels*image*image] (NCHW), "labels" [B] i32; output "logits" [B, classes].
graph::Graph build_resnet(const ResnetConfig& config, std::int64_t batch);

}  // namespace memplan::models
