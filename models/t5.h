// T5, the encoder-decoder (transformers' T5ForConditionalGeneration): a shared token embedding;
// an encoder of bidirectional self-attention and MLP blocks; a decoder of causal self-attention,
// cross-attention over the encoder's output and MLP blocks; pre-norm RMSNorm without bias (T5's
// layer norm); unscaled attention scores plus a relative position bias (one table of buckets per
// stack, in its first block, shared by all its blocks); the head tied to the embedding (the
// decoder's output scaled by width^-1/2 first) or its own. T5 v1.0 (ReLU MLP), v1.1 and Flan-T5
// (gated GELU, untied head) are settings.
#pragma once

#include <cstdint>

#include "memplan/graph/graph.h"
#include "memplan/models/activation.h"

namespace memplan::models {

struct T5Config {
  std::int64_t vocab = 32128;         // vocab_size
  std::int64_t width = 512;           // d_model
  std::int64_t heads = 8;             // num_heads
  std::int64_t head_size = 64;        // d_kv (independent of the width)
  std::int64_t ffn = 2048;            // d_ff
  std::int64_t layers = 6;            // num_layers: encoder blocks
  std::int64_t decoder_layers = 6;    // num_decoder_layers
  std::int64_t buckets = 32;          // relative_attention_num_buckets
  std::int64_t max_distance = 128;    // relative_attention_max_distance
  // The MLP: act(wi x) (T5 v1.0's ReLU), or gated act(wi_0 x) * wi_1 x (v1.1's "gated-gelu").
  Activation act = Activation::relu;
  bool gated = false;
  bool tied_head = true;              // tie_word_embeddings
  float dropout = 0.1f;               // dropout_rate: embeddings, probabilities, sublayer outputs, MLP hidden
  float norm_eps = 1e-6f;             // layer_norm_epsilon
  std::int64_t seq = 512;             // encoder tokens per sample
  std::int64_t target_seq = 512;      // decoder tokens per sample
  graph::DType dtype = graph::DType::f32;
};

// Inputs "x" [B, seq] (the encoder's tokens), "decoder_x" [B, target_seq] (the decoder's, the
// targets shifted right behind a start token) and "labels" [B * target_seq], all i32; output
// "logits" [B * target_seq, vocab]; loss "loss" (mean cross-entropy over the target positions).
// Attention is materialized ([B, H, Tq, Tk] scores, as transformers computes T5's): the relative
// bias adds onto the scores. Parameter names follow transformers'. Throws graph::GraphError.
graph::Graph build_t5(const T5Config& config, std::int64_t batch);

}  // namespace memplan::models
