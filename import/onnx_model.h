// What a loaded ONNX file holds (OnnxModel::Impl): the parsed ModelProto and, for a file read
// without its initializers' raw_data, where those bytes lie. Internal to import/: the loader
// (onnx_import.cpp) fills it, the importer core (onnx_importer.cpp) reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <onnx/onnx_pb.h>

#include "memplan/import/onnx_import.h"

namespace memplan::import {

struct OnnxModel::Impl {
  onnx::ModelProto model;
  std::string source;
  std::int64_t opset = 0;
  // When not empty: initializer i's raw_data is raw[i], bytes of the file held by `storage`, and
  // left out of `model` (protobuf would copy every weight; an import reads them only if asked).
  std::vector<std::string_view> raw;
  std::shared_ptr<const void> storage;
  // Initializers kept in external files (ONNX's external data, how models over protobuf's 2 GiB
  // are saved): each file mapped once, beside the model; raw[i] points into them.
  std::vector<std::shared_ptr<const void>> external_files;
  std::string_view raw_of(int initializer) const {
    return raw.empty() ? std::string_view(model.graph().initializer(initializer).raw_data())
                       : raw[static_cast<std::size_t>(initializer)];
  }
};

}  // namespace memplan::import
