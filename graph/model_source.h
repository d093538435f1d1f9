// A model source: what the planner needs of a model without knowing where it comes from (the
// registry and Hugging Face configs in models/, ONNX files in import/). It builds the forward
// graph at any batch and declares the sizes a user chose (sequence length, image size, ...), so
// size checks and batch searches work on any source alike. Not a model: a recipe for graphs.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "memplan/graph/graph.h"

namespace memplan::graph {

// A size of the model, other than the batch, that decides how large its tensors or its graph are.
struct SizeKnob {
  // Names the knob to whoever renders messages (tools/ maps it to a flag): "seq", "image_size",
  // "width", "layers", "hidden", "hidden_count", "num_hidden_layers".
  std::string key;
  std::string quantity;  // how the planner's messages name it: "the sequence length"
  std::int64_t value = 1;  // as asked
  std::int64_t usual = 1;  // a value at which the model is valid (a default): searches start there
  std::int64_t granule = 1;  // valid values are multiples of it (patch size, heads); the smallest
  int position = 0;        // 1-based among several knobs of one key (the MLP's widths); 0 alone
  std::string unit;        // what a layer count counts, in messages: "layers", "widths"
  // The knob counts repeated blocks: the op count grows linearly with it, so it is checked from
  // builds at 1 and 2 with every other knob at its smallest, before anything large is built.
  bool layers = false;
  // false: never brought down in a search for the largest value that works (a count fixed by a
  // file or by another knob's list), only checked as a layer count.
  bool searched = true;
};

struct ModelSource {
  // Names the model in build errors ("model 'gpt': ..."); empty when the builder's own errors
  // name what failed (an imported file's node).
  std::string name;
  bool training = true;  // the forward graph becomes a training step; false: evaluation as it is
  std::int64_t default_batch = 1;  // the batch a command uses when none is asked
  // The tensor-parallel ranks each graph this source builds is one slice of (graph/tensor_parallel.h);
  // every rank's slice has the same shapes, so one rank's graph plans them all.
  int tensor_parallel = 1;
  std::vector<SizeKnob> knobs;
  // The forward graph (with its loss) at `batch`, with knob i at sizes[i] (sizes.size() ==
  // knobs.size()). Throws GraphError when the model is inconsistent, SizeError when the sizes
  // cannot be represented.
  std::function<Graph(std::int64_t batch, std::span<const std::int64_t> sizes)> build;

  std::vector<std::int64_t> sizes() const;      // every knob's value
  Graph forward(std::int64_t batch) const;      // build at the knobs' values
};

}  // namespace memplan::graph
