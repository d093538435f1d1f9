// An ONNX model as a model source (graph/model_source.h): the file fixes every size but the batch,
// so it declares no knobs; the planner builds it at any batch through this.
#pragma once

#include <memory>

#include "memplan/graph/model_source.h"
#include "memplan/import/onnx_import.h"

namespace memplan::import {

// Builds `model` with `options` (loss, output, dtype; options.training decides the training step
// or evaluation) at each batch asked; initializer values are never copied (planning reads shapes).
graph::ModelSource onnx_source(std::shared_ptr<const OnnxModel> model, ImportOptions options);

}  // namespace memplan::import
