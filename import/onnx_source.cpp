#include "memplan/import/onnx_source.h"

#include <span>
#include <utility>

namespace memplan::import {

graph::ModelSource onnx_source(std::shared_ptr<const OnnxModel> model, ImportOptions options) {
  graph::ModelSource s;  // no name: the importer's errors name the file's node
  s.training = options.training;
  options.keep_values = false;
  s.build = [model = std::move(model), options](std::int64_t batch, std::span<const std::int64_t>) {
    ImportOptions at = options;
    at.batch = batch;
    return model->build(at).graph;
  };
  return s;
}

}  // namespace memplan::import
