#include "memplan/import/onnx_tensor.h"

#include <cstring>
#include <string>
#include <utility>

#include <onnx/onnx_pb.h>

#include "memplan/graph/tensor.h"

namespace memplan::import {

std::int64_t Constant::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n = graph::checked_mul(n, d);
  return n;
}

Result<Constant> read_tensor_proto(const onnx::TensorProto& t, std::string_view raw, bool with_data) {
  Constant c;
  for (std::int64_t d : t.dims()) {
    if (d < 0) return Error{"tensor '" + t.name() + "' has a negative dimension " + std::to_string(d)};
    c.dims.push_back(d);
  }
  std::int64_t n = 0;
  try {
    n = c.numel();
  } catch (const graph::SizeError&) {
    return Error{"tensor '" + t.name() + "' has dimensions whose product overflows"};
  }
  if (t.data_location() == onnx::TensorProto::EXTERNAL && raw.empty() && n > 0) {
    // OnnxModel::load maps external files beside the model; bytes parsed alone have none.
    return Error{"tensor '" + t.name() + "' keeps its data in an external file, which memplan reads only when it "
                 "loads the model from its file (OnnxModel::load, --onnx PATH)"};
  }
  auto size_error = [&](std::size_t have) {
    return Error{"tensor '" + t.name() + "' declares " + std::to_string(n) + " elements but holds " + std::to_string(have)};
  };
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT: {
      c.is_float = true;
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * 4) return size_error(raw.size() / 4);
        if (!with_data) return c;
        c.floats.resize(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          float f;
          std::memcpy(&f, raw.data() + i * 4, 4);
          c.floats[static_cast<std::size_t>(i)] = f;
        }
      } else {
        if (t.float_data_size() != n) return size_error(static_cast<std::size_t>(t.float_data_size()));
        if (!with_data) return c;
        c.floats.assign(t.float_data().begin(), t.float_data().end());
      }
      return c;
    }
    case onnx::TensorProto::DOUBLE: {
      c.is_float = true;
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * 8) return size_error(raw.size() / 8);
        c.floats.resize(static_cast<std::size_t>(n));
        std::memcpy(c.floats.data(), raw.data(), raw.size());
      } else {
        if (t.double_data_size() != n) return size_error(static_cast<std::size_t>(t.double_data_size()));
        c.floats.assign(t.double_data().begin(), t.double_data().end());
      }
      return c;
    }
    case onnx::TensorProto::INT64: {
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * 8) return size_error(raw.size() / 8);
        c.ints.resize(static_cast<std::size_t>(n));
        std::memcpy(c.ints.data(), raw.data(), raw.size());
      } else {
        if (t.int64_data_size() != n) return size_error(static_cast<std::size_t>(t.int64_data_size()));
        c.ints.assign(t.int64_data().begin(), t.int64_data().end());
      }
      return c;
    }
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::BOOL: {
      const std::size_t width = t.data_type() == onnx::TensorProto::BOOL ? 1 : 4;
      c.ints.resize(static_cast<std::size_t>(n));
      if (!raw.empty()) {
        if (raw.size() != static_cast<std::size_t>(n) * width) return size_error(raw.size() / width);
        for (std::int64_t i = 0; i < n; ++i) {
          std::int32_t v = 0;
          if (width == 1) {
            v = static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]);
          } else {
            std::memcpy(&v, raw.data() + i * 4, 4);
          }
          c.ints[static_cast<std::size_t>(i)] = v;
        }
      } else {
        if (t.int32_data_size() != n) return size_error(static_cast<std::size_t>(t.int32_data_size()));
        for (std::int64_t i = 0; i < n; ++i) c.ints[static_cast<std::size_t>(i)] = t.int32_data(static_cast<int>(i));
      }
      return c;
    }
    default:
      return Error{"tensor '" + t.name() + "' has ONNX data type " + std::to_string(t.data_type()) +
                   "; memplan reads float, double, int64, int32 and bool tensors"};
  }
}

std::vector<float> float_values(const onnx::TensorProto& t, std::string_view raw) {
  if (t.data_type() != onnx::TensorProto::FLOAT) {
    auto c = read_tensor_proto(t, raw);
    return c ? std::vector<float>(c.value().floats.begin(), c.value().floats.end()) : std::vector<float>{};
  }
  if (raw.empty()) return {t.float_data().begin(), t.float_data().end()};
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

Constant int_list(std::vector<std::int64_t> values) {
  Constant c;
  c.dims = {static_cast<std::int64_t>(values.size())};
  c.ints = std::move(values);
  return c;
}

}  // namespace memplan::import
