// ONNX TensorProto values as the importer reads them: initializers, Constant nodes' tensors and
// attribute tensors, typed fields or raw_data. Internal to import/ (onnx_import.h is the interface).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"

namespace onnx {
class TensorProto;
}

namespace memplan::import {

// A constant known while importing: integer (shapes, indices, axes) or floating (scalars, masks).
struct Constant {
  std::vector<std::int64_t> dims;
  bool is_float = false;
  std::vector<std::int64_t> ints;
  std::vector<double> floats;
  std::int64_t numel() const;
  double at(std::int64_t i) const {
    return is_float ? floats[static_cast<std::size_t>(i)] : static_cast<double>(ints[static_cast<std::size_t>(i)]);
  }
  // Appends element i of `from` (at this constant's type; integers copied exactly).
  void append(const Constant& from, std::int64_t i) {
    if (is_float) {
      floats.push_back(from.at(i));
    } else {
      ints.push_back(from.ints[static_cast<std::size_t>(i)]);
    }
  }
};

// `with_data` false reads a float tensor's dims and checks its size, leaving its values unread.
// `raw` is the tensor's raw_data: t.raw_data(), or the bytes in the file of an initializer whose
// raw_data the loader left out of the parsed message (OnnxModel::Impl::raw).
Result<Constant> read_tensor_proto(const onnx::TensorProto& t, std::string_view raw, bool with_data = true);

// A float tensor's values (its size checked by read_tensor_proto).
std::vector<float> float_values(const onnx::TensorProto& t, std::string_view raw);

// A constant of a list of integers (a shape, axes).
Constant int_list(std::vector<std::int64_t> values);

}  // namespace memplan::import
