// The safetensors file format, as the Hugging Face ecosystem reads and writes it: an 8-byte
// little-endian header length N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets"}},
// plus "__metadata__": string -> string), then the raw little-endian tensor bytes.
// Encoding and parsing only; runtime/weights.h moves tensors between files and executors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/graph/tensor.h"

namespace memplan::runtime {

struct SafetensorsEntry {
  std::string name;
  graph::DType dtype = graph::DType::f32;
  std::vector<std::int64_t> shape;
  std::string_view data;  // exactly numel * dtype size bytes
};

struct SafetensorsView {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> tensors;  // in data order; views into the parsed bytes
  const SafetensorsEntry* find(std::string_view name) const;
};

// The file bytes for `tensors` (written in the given order, 8-byte aligned header). Names must
// be unique and not "__metadata__".
Result<std::string> encode_safetensors(const std::vector<SafetensorsEntry>& tensors,
                                       const std::map<std::string, std::string>& metadata);
// The same file's first part, the length and the JSON header: the file is this followed by
// every tensor's data in order (for a writer that does not join them in memory).
Result<std::string> encode_safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// Parses and checks a whole file held in `bytes` (the views point into it): header length,
// JSON, dtypes, shapes, offsets inside the data and matching the shape, no overlaps, no bytes
// left unaccounted. `source` names the input in messages.
Result<SafetensorsView> parse_safetensors(std::string_view bytes, std::string_view source);

// The safetensors format's own limit on the JSON header (as its reference implementation sets it).
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = std::uint64_t{100} << 20;

// The data bytes a header announces (the largest end of its tensors' data_offsets), from the
// header's JSON alone: a reader refuses a file whose size disagrees before reading its data. An
// Error when the header is not a JSON object; every other check is parse_safetensors'.
Result<std::uint64_t> safetensors_announced_data_bytes(std::string_view header_json, std::string_view source);

// safetensors' dtype names: F32, F16, BF16, I32, I64.
std::string_view safetensors_dtype_name(graph::DType dtype);

}  // namespace memplan::runtime
