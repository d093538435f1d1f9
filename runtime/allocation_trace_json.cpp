// JSON export of traces and snapshots. Kept apart from allocation_trace.cpp so that only this
// file needs nlohmann-json.
#include <nlohmann/json.hpp>

#include "runtime/allocation_trace.h"

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

std::string memory_snapshot_json(const AllocatorSnapshot& snapshot, const AllocationTrace* trace, int indent) {
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
  return out.dump(indent);
}

}  // namespace memplan::runtime
