#include "memplan/import/onnx_wire.h"

#include <cstdint>

namespace memplan::import {

namespace {

struct WireField {
  std::uint64_t number = 0;
  int type = 0;
  std::string_view payload;  // length-delimited fields
  std::string_view whole;    // tag and value as in the input
};

bool read_varint(std::string_view& in, std::uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in.empty()) return false;
    const auto b = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    v |= std::uint64_t(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// The next field of `in`, or false at the end or on anything this reader does not take
// (malformed bytes, groups): the caller then lets protobuf parse everything and say what is wrong.
bool next_field(std::string_view& in, WireField& f) {
  const char* start = in.data();
  std::uint64_t tag = 0;
  if (!read_varint(in, tag)) return false;
  f.number = tag >> 3;
  f.type = static_cast<int>(tag & 7);
  std::uint64_t v = 0;
  switch (f.type) {
    case 0:
      if (!read_varint(in, v)) return false;
      break;
    case 1:
    case 5: {
      const std::size_t n = f.type == 1 ? 8 : 4;
      if (in.size() < n) return false;
      in.remove_prefix(n);
      break;
    }
    case 2:
      if (!read_varint(in, v) || v > in.size()) return false;
      f.payload = in.substr(0, static_cast<std::size_t>(v));
      in.remove_prefix(static_cast<std::size_t>(v));
      break;
    default:
      return false;
  }
  f.whole = std::string_view(start, static_cast<std::size_t>(in.data() - start));
  return true;
}

void put_message(std::string& out, std::uint64_t number, std::string_view body) {
  put_varint(out, number << 3 | 2);
  put_varint(out, body.size());
  out.append(body);
}

// Copies a message, rewriting the length-delimited fields numbered `field` with `inner`.
template <typename Inner>
bool rewrite(std::string_view in, std::uint64_t field, std::string& out, Inner inner) {
  WireField f;
  while (!in.empty()) {
    if (!next_field(in, f)) return false;
    if (f.number == field && f.type == 2) {
      std::string body;
      if (!inner(f.payload, body)) return false;
      put_message(out, field, body);
    } else {
      out.append(f.whole);
    }
  }
  return true;
}

}  // namespace

bool strip_initializer_data(std::string_view bytes, std::string& stripped, std::vector<std::string_view>& raw) {
  return rewrite(bytes, 7, stripped, [&](std::string_view graph, std::string& graph_out) {
    return rewrite(graph, 5, graph_out, [&](std::string_view tensor, std::string& tensor_out) {
      std::string_view data;
      WireField f;
      while (!tensor.empty()) {
        if (!next_field(tensor, f)) return false;
        if (f.number == 9 && f.type == 2) {
          data = f.payload;  // the last occurrence wins, as in protobuf
        } else {
          tensor_out.append(f.whole);
        }
      }
      raw.push_back(data);
      return true;
    });
  });
}

}  // namespace memplan::import
