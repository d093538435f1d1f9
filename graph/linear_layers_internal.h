// Linear layers as the fine-tuning rewrites see them (graph/lora.h, graph/quantize.h): a matmul
// x W^T whose W is a 2-D parameter named "<module>.weight". Internal to graph/.
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "memplan/graph/graph.h"

namespace memplan::graph::linear_layers {

constexpr std::string_view kWeightSuffix = ".weight";

inline bool ends_with(std::string_view text, std::string_view tail) {
  return text.size() >= tail.size() && text.substr(text.size() - tail.size()) == tail;
}

// '*' matches any text (none included); everything else itself.
inline bool glob_match(std::string_view pattern, std::string_view text) {
  if (pattern.empty()) return text.empty();
  if (pattern[0] == '*') {
    for (std::size_t skip = 0; skip <= text.size(); ++skip) {
      if (glob_match(pattern.substr(1), text.substr(skip))) return true;
    }
    return false;
  }
  return !text.empty() && pattern[0] == text[0] && glob_match(pattern.substr(1), text.substr(1));
}

// The weight a linear layer's matmul reads (x W^T, W a 2-D parameter named "<module>.weight"),
// or kNoTensor for any other op.
inline TensorId linear_weight(const Graph& g, const Op& op) {
  if (op.kind != OpKind::matmul || op.attrs.trans_a || !op.attrs.trans_b) return kNoTensor;
  const TensorId w = op.inputs[1];
  const TensorDesc& d = g.tensor(w);
  if (d.role != Role::parameter || d.shape.rank() != 2 || !ends_with(d.name, kWeightSuffix)) return kNoTensor;
  return w;
}

// The output head's weight: the matmul whose product becomes the model's output (through bias
// adds and views) or whose weight an embedding also reads (a tied head). PEFT's all-linear leaves
// it out, and so does every target.
inline std::set<TensorId> head_weights(const Graph& g) {
  std::set<TensorId> heads;
  for (const Op& op : g.ops()) {
    if (op.kind == OpKind::embedding) heads.insert(op.inputs[1]);
  }
  for (TensorId t = g.output; t != kNoTensor;) {
    const int p = g.producer(t);
    if (p < 0) break;
    const Op& op = g.ops()[static_cast<std::size_t>(p)];
    if (const TensorId w = linear_weight(g, op); w != kNoTensor) {
      heads.insert(w);
      break;
    }
    if (op.kind != OpKind::bias_add && op.kind != OpKind::reshape) break;
    t = op.inputs[0];
  }
  return heads;
}

inline std::string module_of(const TensorDesc& weight) { return weight.name.substr(0, weight.name.size() - kWeightSuffix.size()); }

}  // namespace memplan::graph::linear_layers
