// Transformer encoders for planning at real scale: BERT (post-LN, masked-language-model head
// tied to the word embeddings) and ViT (pre-LN, 16x16 patches as a strided convolution, a class
// token, a linear classifier on it). Bidirectional attention, fused or materialized (EncoderConfig::attention).
#pragma once

#include <cstdint>

#include "memplan/graph/graph.h"
#include "memplan/models/attention.h"

namespace memplan::models {

struct EncoderConfig {
  std::int64_t layers = 12;  // L
  std::int64_t width = 768;  // C
  std::int64_t heads = 12;   // NH
  std::int64_t mlp = 3072;   // hidden width of the GELU MLP
  float dropout = 0.1f;      // after attention probabilities and on each residual branch
  graph::DType dtype = graph::DType::f32;
  AttentionKind attention = AttentionKind::fused;  // models/attention.h
};

struct BertConfig {
  EncoderConfig encoder;
  std::int64_t vocab = 30522;
  std::int64_t max_positions = 512;
  std::int64_t token_types = 2;
  std::int64_t seq = 512;  // T
};

// Inputs "x" [B, T] and "token_type" [B, T] i32, "labels" [B*T] i32; output "logits" [B*T, V];
// loss "loss" (cross-entropy at every position). Names follow Hugging Face's BertForMaskedLM.
graph::Graph build_bert(const BertConfig& config, std::int64_t batch);

struct VitConfig {
  EncoderConfig encoder;
  std::int64_t image = 224;  // height = width, a multiple of patch
  std::int64_t patch = 16;
  std::int64_t channels = 3;
  std::int64_t classes = 1000;
};

// Input "x" [B, channels*image*image] (NCHW), "labels" [B] i32; output "logits" [B, classes].
// Names follow timm's vit_base_patch16_224.
graph::Graph build_vit(const VitConfig& config, std::int64_t batch);

}  // namespace memplan::models
