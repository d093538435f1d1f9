// The transformer reference model: a GPT-2-style character-level decoder. Token + position
// embeddings, L blocks of pre-LN causal self-attention and a GELU MLP (each a residual branch),
// a final layer norm and a head tied to the token embedding (or its own weight).
#pragma once

#include <cstdint>

#include "memplan/graph/graph.h"
#include "memplan/graph/tensor_parallel.h"
#include "memplan/models/attention.h"

namespace memplan::models {

struct GptConfig {
  std::int64_t vocab = 96;    // V
  std::int64_t context = 64;  // T: tokens per sequence
  std::int64_t layers = 2;    // L
  std::int64_t heads = 4;     // NH; width must divide evenly
  std::int64_t width = 128;   // C
  float dropout = 0.0f;       // after attention probabilities and on each residual branch
  bool tied_head = true;      // logits = h wte^T (GPT-2) instead of a separate lm_head.weight
  std::int64_t max_positions = 0;  // rows of wpe (GPT-2: 1024); 0 = context. The first T are used.
  graph::DType dtype = graph::DType::f32;  // parameters and activations (16-bit: planning only)
  AttentionKind attention = AttentionKind::fused;  // models/attention.h
  std::int64_t mlp = 0;  // hidden width of the MLP (GPT-2's n_inner); 0 = 4 * width
  // Build rank `rank` of `degree` tensor-parallel ranks' slice (graph/tensor_parallel.h): heads,
  // the MLP's hidden width and the vocabulary split between them.
  graph::TensorParallel tensor_parallel;
};

// Forward graph for `batch` sequences: inputs "x" [B, T] i32 token ids and "labels" [B*T] i32
// (the next token at every position); output "logits" [B*T, V]; loss "loss" (mean cross-entropy
// over all positions). Parameters as GPT-2 names them (wte, wpe, h.N.ln_1, h.N.attn.{q,k,v},
// h.N.attn.proj, h.N.ln_2, h.N.mlp.fc, h.N.mlp.proj, ln_f), initialised N(0, 0.02), projections
// into the residual stream N(0, 0.02/sqrt(2L)), biases 0, layer norms 1/0. `training` false
// drops the dropout ops. Under tensor parallelism the output is this rank's vocabulary columns
// of the logits, and attention dropout draws each rank's masks for its own heads.
graph::Graph build_gpt(const GptConfig& config, std::int64_t batch, bool training = true);

}  // namespace memplan::models
