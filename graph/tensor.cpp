#include "memplan/graph/tensor.h"

#include <sstream>

#include "memplan/common/check.h"

namespace memplan::graph {

Bytes dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
    case DType::i64: return 8;
  }
  MEMPLAN_CHECK(false, "unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  const std::string_view name = enum_name(kDTypeNames, dtype);
  MEMPLAN_CHECK(name != "?", "unknown dtype");
  return name;
}

std::span<const EnumName<DType>> float_dtype_names() {
  static const std::vector<EnumName<DType>> rows = [] {
    std::vector<EnumName<DType>> out;
    for (const EnumName<DType>& row : kDTypeNames) {
      if (is_floating(row.value)) out.push_back(row);
    }
    return out;
  }();
  return rows;
}

Result<DType> parse_float_dtype(std::string_view name) { return parse_enum(float_dtype_names(), name, "dtype"); }

std::string_view role_name(Role role) {
  switch (role) {
    case Role::parameter: return "parameter";
    case Role::optimizer_state: return "optimizer_state";
    case Role::input: return "input";
    case Role::activation: return "activation";
    case Role::gradient: return "gradient";
    case Role::temporary: return "temporary";
    case Role::communication: return "communication";
  }
  MEMPLAN_CHECK(false, "unknown role");
}

void throw_size_overflow(std::int64_t a, std::int64_t b) {
  throw SizeError("sizes " + std::to_string(a) + " x " + std::to_string(b) + " multiply past 2^63");
}

std::int64_t Shape::rows() const {
  std::int64_t n = 1;
  for (std::size_t i = 0; i + 1 < dims.size(); ++i) n = checked_mul(n, dims[i]);
  return n;
}

std::string Shape::to_string() const {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << "]";
  return out.str();
}

}  // namespace memplan::graph
