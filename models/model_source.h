// The registry's models and Hugging Face configs as model sources (graph/model_source.h): what the
// planner builds and searches without knowing models/. Each declares the sizes a user chooses
// (sequence length, image size, widths, layer counts) as knobs, with the model's defaults.
#pragma once

#include <cstdint>

#include "memplan/common/result.h"
#include "memplan/graph/model_source.h"
#include "memplan/models/registry.h"

namespace memplan::models {

// The model `options` describe, as a source: sizes left at 0 (ZooOptions) are resolved to the
// model's defaults in its knobs. An unknown name gives a source whose builds throw, naming the
// models there are.
graph::ModelSource registry_source(ModelOptions options);

// Sets the sizes of `options` that `memplan train` takes from the model's training data, so that
// planning without the data plans the model train runs: the GPT's vocabulary (decoder configs
// train on bytes too, but plan with their own vocabulary) is `vocab` when given (> 0), else the
// one train builds from its default text (models/text_dataset.h). An Error says why the default
// text could not be read.
Status set_data_sizes(ModelOptions& options, std::int64_t vocab);

}  // namespace memplan::models
