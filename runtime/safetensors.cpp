#include "memplan/runtime/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

namespace memplan::runtime {
namespace {

// Anything larger is not a header a writer produced; refuse it before parsing.

Result<graph::DType> parse_dtype(const std::string& name) {
  if (name == "F32") return graph::DType::f32;
  if (name == "F16") return graph::DType::f16;
  if (name == "BF16") return graph::DType::bf16;
  if (name == "I32") return graph::DType::i32;
  if (name == "I64") return graph::DType::i64;
  if (name == "U8") return graph::DType::u8;
  return Error{"dtype '" + name + "' is not one memplan uses (F32, F16, BF16, I32, I64, U8)"};
}

}  // namespace

std::string_view safetensors_dtype_name(graph::DType dtype) {
  switch (dtype) {
    case graph::DType::f32: return "F32";
    case graph::DType::f16: return "F16";
    case graph::DType::bf16: return "BF16";
    case graph::DType::i32: return "I32";
    case graph::DType::u8: return "U8";
    case graph::DType::i64: return "I64";
  }
  return "?";
}

const SafetensorsEntry* SafetensorsView::find(std::string_view name) const {
  for (const SafetensorsEntry& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<std::string> encode_safetensors(const std::vector<SafetensorsEntry>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  auto out = encode_safetensors_header(tensors, metadata);
  if (!out) return out;
  std::size_t data = 0;
  for (const SafetensorsEntry& t : tensors) data += t.data.size();
  out.value().reserve(out.value().size() + data);
  for (const SafetensorsEntry& t : tensors) out.value().append(t.data);
  return out;
}

Result<std::string> encode_safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  std::set<std::string> names;
  for (const SafetensorsEntry& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return Error{"tensor name '" + t.name + "' is reserved or used twice"};
    }
    std::int64_t numel = 1;
    for (std::int64_t d : t.shape) numel *= d;
    if (static_cast<std::uint64_t>(numel * graph::dtype_size(t.dtype)) != t.data.size()) {
      return Error{"tensor '" + t.name + "': " + std::to_string(t.data.size()) + " bytes do not match its shape"};
    }
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  return out;
}

Result<SafetensorsView> parse_safetensors(std::string_view bytes, std::string_view source) {
  const std::string where(source);
  auto fail = [&](const std::string& what) { return Error{where + ": not a valid safetensors file: " + what}; };
  if (bytes.size() < 8) return fail("only " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  std::uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= std::uint64_t(static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)])) << (8 * i);
  if (header_len > kMaxSafetensorsHeaderBytes) return fail("header length " + std::to_string(header_len) + " is implausible");
  if (header_len > bytes.size() - 8) {
    return fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
                std::to_string(bytes.size()) + " bytes): truncated?");
  }
  const std::string_view header_text = bytes.substr(8, header_len);
  const std::string_view data = bytes.substr(8 + header_len);
  nlohmann::json header = nlohmann::json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return fail("the header is not a JSON object");

  SafetensorsView view;
  struct Span {
    std::uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return fail("__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) return fail("__metadata__ value '" + m.key() + "' is not a string");
        view.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      return fail(what + " lacks dtype, shape or data_offsets");
    }
    if (!entry["dtype"].is_string()) return fail(what + ": dtype is not a string");
    auto dtype = parse_dtype(entry["dtype"].get<std::string>());
    if (!dtype) return fail(what + ": " + dtype.error().message);
    SafetensorsEntry t;
    t.name = name;
    t.dtype = dtype.value();
    if (!entry["shape"].is_array()) return fail(what + ": shape is not a list");
    std::uint64_t numel = 1;
    for (const nlohmann::json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) return fail(what + ": shape has an entry that is not a non-negative integer");
      const std::uint64_t dim = d.get<std::uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 16 / dim) return fail(what + ": shape overflows");
      numel *= dim;
      t.shape.push_back(static_cast<std::int64_t>(dim));
    }
    const nlohmann::json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return fail(what + ": data_offsets is not [begin, end]");
    }
    const std::uint64_t begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end || end > data.size()) {
      return fail(what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] outside the " + std::to_string(data.size()) + " data bytes (truncated file?)");
    }
    const std::uint64_t expected = numel * static_cast<std::uint64_t>(graph::dtype_size(t.dtype));
    if (end - begin != expected) {
      return fail(what + ": " + std::to_string(end - begin) + " data bytes, but its shape and dtype need " +
                  std::to_string(expected));
    }
    t.data = data.substr(begin, end - begin);
    spans.push_back({begin, end, name});
    view.tensors.push_back(std::move(t));
  }
  // Tensors tile the data exactly: no overlaps, no gaps, nothing after the last.
  std::vector<std::size_t> order(spans.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return spans[a].begin < spans[b].begin; });
  std::uint64_t cursor = 0;
  for (std::size_t i : order) {
    if (spans[i].begin != cursor) {
      return fail(spans[i].begin < cursor ? "tensor '" + spans[i].name + "' overlaps another"
                                          : "a gap in the data before tensor '" + spans[i].name + "'");
    }
    cursor = spans[i].end;
  }
  if (cursor != data.size()) {
    return fail(std::to_string(data.size() - cursor) + " data bytes after the last tensor");
  }
  std::vector<SafetensorsEntry> sorted;
  for (std::size_t i : order) sorted.push_back(std::move(view.tensors[i]));
  view.tensors = std::move(sorted);
  return view;
}

Result<std::uint64_t> safetensors_announced_data_bytes(std::string_view header_json, std::string_view source) {
  const nlohmann::json header = nlohmann::json::parse(header_json, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Error{std::string(source) + ": not a valid safetensors file: the header is not a JSON object"};
  }
  std::uint64_t end = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__" || !it.value().is_object() || !it.value().contains("data_offsets")) continue;
    const nlohmann::json& off = it.value()["data_offsets"];
    if (off.is_array() && off.size() == 2 && off[1].is_number_unsigned()) end = std::max(end, off[1].get<std::uint64_t>());
  }
  return end;
}

}  // namespace memplan::runtime
