// JSON export of traces and snapshots. Kept apart from allocation_trace.cpp so that only this
// file needs nlohmann-json.
#include <nlohmann/json.hpp>

#include <bit>
#include <cstring>
#include <limits>

#include "memplan/common/check.h"
#include "memplan/runtime/allocation_trace.h"

namespace memplan::runtime {
namespace {

using nlohmann::json;

json label_json(const AllocationTrace& trace, std::int32_t label) {
  return label == kNoLabel ? json(nullptr) : json(std::string(trace.label(label)));
}

// The caller's step and op label, as the one stack frame PyTorch's viewers show on hover.
json frames_json(const AllocationTrace& trace, const TraceEvent& e) {
  json frame = {{"filename", "step " + std::to_string(e.step)},
                {"line", e.step},
                {"name", e.label == kNoLabel ? std::string("?") : std::string(trace.label(e.label))}};
  return json::array({frame});
}

}  // namespace

std::string trace_to_json(const AllocationTrace& trace, int indent) {
  json events = json::array();
  for (const TraceEvent& e : trace.events()) {
    events.push_back({{"action", trace_action_name(e.action)},
                      {"address", e.address},
                      {"size", e.size},
                      {"step", e.step},
                      {"label", label_json(trace, e.label)},
                      {"sequence", e.sequence}});
  }
  return json{{"events", std::move(events)}}.dump(indent);
}

namespace {

// Pickle opcodes (protocol 2), only those the memory viewer's JavaScript unpickler also reads.
constexpr char kProto = '\x80';
constexpr char kEmptyDict = '}';
constexpr char kEmptyList = ']';
constexpr char kMark = '(';
constexpr char kSetItems = 'u';
constexpr char kAppends = 'e';
constexpr char kBinUnicode = 'X';
constexpr char kBinInt1 = 'K';
constexpr char kBinInt = 'J';
constexpr char kLong1 = '\x8a';
constexpr char kBinFloat = 'G';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kNone = 'N';
constexpr char kStop = '.';

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void pickle_string(std::string& out, const std::string& s) {
  out.push_back(kBinUnicode);
  put_le(out, s.size(), 4);
  out += s;
}

void pickle_value(std::string& out, const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      out.push_back(kEmptyDict);
      out.push_back(kMark);
      for (const auto& [key, item] : v.items()) {
        pickle_string(out, key);
        pickle_value(out, item);
      }
      out.push_back(kSetItems);
      return;
    case json::value_t::array:
      out.push_back(kEmptyList);
      out.push_back(kMark);
      for (const json& item : v) pickle_value(out, item);
      out.push_back(kAppends);
      return;
    case json::value_t::string:
      pickle_string(out, v.get<std::string>());
      return;
    case json::value_t::boolean:
      out.push_back(v.get<bool>() ? kNewTrue : kNewFalse);
      return;
    case json::value_t::null:
      out.push_back(kNone);
      return;
    case json::value_t::number_float: {
      out.push_back(kBinFloat);
      const auto bits = std::bit_cast<std::uint64_t>(v.get<double>());
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));  // big-endian
      return;
    }
    case json::value_t::number_unsigned:
      if (v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        out.push_back(kLong1);  // two's complement needs a ninth, zero byte
        out.push_back(9);
        put_le(out, v.get<std::uint64_t>(), 8);
        out.push_back(0);
        return;
      }
      [[fallthrough]];
    case json::value_t::number_integer: {
      const std::int64_t i = v.get<std::int64_t>();
      if (i >= 0 && i <= 0xff) {
        out.push_back(kBinInt1);
        out.push_back(static_cast<char>(i));
      } else if (i >= std::numeric_limits<std::int32_t>::min() && i <= std::numeric_limits<std::int32_t>::max()) {
        out.push_back(kBinInt);
        put_le(out, static_cast<std::uint64_t>(i), 4);
      } else {
        out.push_back(kLong1);
        out.push_back(8);
        put_le(out, static_cast<std::uint64_t>(i), 8);
      }
      return;
    }
    default:
      MEMPLAN_CHECK(false, "JSON value of this type has no pickle form");
  }
}

std::string pickle_document(const json& document) {
  std::string out{kProto, '\x02'};
  pickle_value(out, document);
  out.push_back(kStop);
  return out;
}

json snapshot_document(const AllocatorSnapshot& snapshot, const AllocationTrace* trace) {
  json segments = json::array();
  for (const SegmentSnapshot& s : snapshot.segments) {
    json blocks = json::array();
    for (const BlockSnapshot& b : s.blocks) {
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested_size", b.requested_size},
                        {"state", block_state_name(b.state)},
                        {"frames", json::array()}});
    }
    segments.push_back({{"device", 0},
                        {"address", s.address},
                        {"total_size", s.total_size},
                        {"allocated_size", s.allocated_size},
                        {"active_size", s.active_size},
                        {"requested_size", s.requested_size},
                        {"stream", 0},
                        {"segment_type", s.large_pool ? "large" : "small"},
                        {"segment_pool_id", json::array({0, 0})},
                        {"is_expandable", s.is_expandable},
                        {"frames", json::array()},
                        {"blocks", std::move(blocks)}});
  }

  json device_trace = json::array();
  if (trace != nullptr) {
    for (const TraceEvent& e : trace->events()) {
      json entry = {{"action", trace_action_name(e.action)}};
      entry[e.action == TraceAction::oom ? "device_free" : "addr"] = e.address;
      entry["size"] = e.size;
      entry["stream"] = 0;
      entry["time_us"] = e.sequence;
      entry["frames"] = frames_json(*trace, e);
      device_trace.push_back(std::move(entry));
    }
  }

  json divisions = json::object();
  for (std::size_t i = 0; i < snapshot.settings.roundup_power2_divisions.size(); ++i) {
    divisions[std::to_string(std::int64_t{1} << i)] = snapshot.settings.roundup_power2_divisions[i];
  }
  json settings = {{"PYTORCH_CUDA_ALLOC_CONF", snapshot.settings.config},
                   {"max_split_size", snapshot.settings.max_split_size},
                   {"garbage_collection_threshold", snapshot.settings.garbage_collection_threshold},
                   {"expandable_segments", snapshot.settings.expandable_segments},
                   {"roundup_power2_divisions", std::move(divisions)}};

  json out = {{"segments", std::move(segments)},
              {"device_traces", json::array({std::move(device_trace)})},
              {"allocator_settings", std::move(settings)},
              {"external_annotations", json::array()}};
  return out;
}

}  // namespace

std::string memory_snapshot_json(const AllocatorSnapshot& snapshot, const AllocationTrace* trace, int indent) {
  return snapshot_document(snapshot, trace).dump(indent);
}

std::string memory_snapshot_pickle(const AllocatorSnapshot& snapshot, const AllocationTrace* trace) {
  return pickle_document(snapshot_document(snapshot, trace));
}

std::string pickle_from_json(std::string_view json_text) { return pickle_document(json::parse(json_text)); }

}  // namespace memplan::runtime
