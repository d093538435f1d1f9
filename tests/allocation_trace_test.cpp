// runtime/allocation_trace: the events a caching allocator records (with the caller's step and
// op label), and their export as plain JSON and in PyTorch's memory-snapshot layout.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "allocator_test_util.h"
#include "memplan/runtime/allocation_trace.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/simulated_device.h"

namespace memplan::runtime {
namespace {

using test_support::MiB;
using nlohmann::json;

using test_support::addr;

std::vector<TraceAction> actions(const AllocationTrace& t) {
  std::vector<TraceAction> out;
  for (const TraceEvent& e : t.events()) out.push_back(e.action);
  return out;
}

TEST(AllocationTrace, RecordsEventsWithTheCallersStepAndLabel) {
  SimulatedDevice device(1024 * MiB);
  CachingAllocator a(device);
  AllocationTrace trace;
  a.set_trace(&trace);
  trace.set_step(3);
  trace.set_label("matmul");
  void* p = a.allocate(1).value();
  trace.set_label("relu");
  a.free(p);
  trace.clear_label();
  trace.set_step(4);
  a.empty_cache();

  using A = TraceAction;
  ASSERT_EQ(actions(trace), (std::vector<A>{A::segment_alloc, A::alloc, A::free_requested, A::free_completed,
                                            A::segment_free}));
  const auto& e = trace.events();
  EXPECT_EQ(e[0].address, addr(p));
  EXPECT_EQ(e[0].size, 2 * MiB);  // segment size
  EXPECT_EQ(e[1].size, 1);        // the request, not the 512-byte block
  EXPECT_EQ(e[2].size, 1);
  EXPECT_EQ(e[4].size, 2 * MiB);
  EXPECT_EQ(trace.label(e[1].label), "matmul");
  EXPECT_EQ(trace.label(e[2].label), "relu");
  EXPECT_EQ(e[4].label, kNoLabel);
  EXPECT_EQ(e[1].step, 3);
  EXPECT_EQ(e[4].step, 4);
  for (std::size_t i = 0; i < e.size(); ++i) EXPECT_EQ(e[i].sequence, static_cast<std::int64_t>(i));
  trace.set_label("matmul");  // labels are interned
  EXPECT_EQ(trace.events()[1].label, 0);
}

TEST(AllocationTrace, OutOfMemoryRecordsDeviceFreeAndTheRoundedRequest) {
  SimulatedDevice device(20 * MiB);
  CachingAllocator a(device);
  AllocationTrace trace;
  a.set_trace(&trace);
  void* p = a.allocate(12 * MiB).value();  // 12 MiB segment; 8 MiB left on the device
  ASSERT_FALSE(a.allocate(9 * MiB + 1).ok());
  const TraceEvent& oom = trace.events().back();
  EXPECT_EQ(oom.action, TraceAction::oom);
  EXPECT_EQ(oom.address, static_cast<DeviceAddress>(8 * MiB));
  EXPECT_EQ(oom.size, 9 * MiB + 512);
  a.free(p);
}

TEST(AllocationTrace, ExpandableSegmentsMapAndUnmap) {
  SimulatedDevice device(1024 * MiB);
  CachingAllocatorOptions o;
  o.expandable_segments = true;
  CachingAllocator a(device, o);
  AllocationTrace trace;
  a.set_trace(&trace);
  void* p = a.allocate(30 * MiB).value();
  a.free(p);
  a.empty_cache();
  using A = TraceAction;
  ASSERT_EQ(actions(trace),
            (std::vector<A>{A::segment_map, A::alloc, A::free_requested, A::free_completed, A::segment_unmap}));
  EXPECT_EQ(trace.events()[0].size, 40 * MiB);
  EXPECT_EQ(trace.events()[4].size, 40 * MiB);
  EXPECT_EQ(trace.events()[4].address, addr(p));
}

TEST(AllocationTrace, PlainJson) {
  AllocationTrace trace;
  trace.set_step(7);
  trace.set_label("conv");
  trace.record(TraceAction::alloc, 4096, 100);
  trace.clear_label();
  trace.record(TraceAction::segment_free, 8192, 2 * MiB);
  const json j = json::parse(trace_to_json(trace));
  ASSERT_EQ(j.at("events").size(), 2u);
  const json& first = j["events"][0];
  EXPECT_EQ(first.at("action"), "alloc");
  EXPECT_EQ(first.at("address"), 4096);
  EXPECT_EQ(first.at("size"), 100);
  EXPECT_EQ(first.at("step"), 7);
  EXPECT_EQ(first.at("label"), "conv");
  EXPECT_EQ(first.at("sequence"), 0);
  EXPECT_TRUE(j["events"][1].at("label").is_null());
  EXPECT_EQ(j["events"][1].at("action"), "segment_free");
}

TEST(AllocationTrace, MemorySnapshotHasPyTorchsLayout) {
  SimulatedDevice device(1024 * MiB);
  CachingAllocator a(device, CachingAllocatorOptions::parse("max_split_size_mb:200").value());
  AllocationTrace trace;
  a.set_trace(&trace);
  trace.set_step(1);
  trace.set_label("fc1");
  void* p = a.allocate(3 * MiB).value();  // 20 MiB segment: 3 MiB live, 17 MiB free
  void* q = a.allocate(1000).value();     // 2 MiB small segment
  a.free(q);

  const json j = json::parse(memory_snapshot_json(a.snapshot(), &trace));
  ASSERT_EQ(j.at("segments").size(), 2u);
  const json& large = j["segments"][0].at("segment_type") == "large" ? j["segments"][0] : j["segments"][1];
  const json& small = j["segments"][0].at("segment_type") == "large" ? j["segments"][1] : j["segments"][0];
  EXPECT_EQ(large.at("address"), addr(p));
  EXPECT_EQ(large.at("total_size"), 20 * MiB);
  EXPECT_EQ(large.at("allocated_size"), 3 * MiB);
  EXPECT_EQ(large.at("active_size"), 3 * MiB);
  EXPECT_EQ(large.at("requested_size"), 3 * MiB);
  EXPECT_EQ(large.at("device"), 0);
  EXPECT_EQ(large.at("stream"), 0);
  EXPECT_EQ(large.at("is_expandable"), false);
  EXPECT_EQ(large.at("segment_pool_id"), json::array({0, 0}));
  ASSERT_EQ(large.at("blocks").size(), 2u);
  EXPECT_EQ(large["blocks"][0].at("state"), "active_allocated");
  EXPECT_EQ(large["blocks"][0].at("size"), 3 * MiB);
  EXPECT_EQ(large["blocks"][1].at("state"), "inactive");
  EXPECT_EQ(large["blocks"][1].at("address"), addr(p) + 3 * MiB);
  EXPECT_EQ(large["blocks"][1].at("size"), 17 * MiB);
  EXPECT_EQ(small.at("allocated_size"), 0);
  ASSERT_EQ(small.at("blocks").size(), 1u);

  ASSERT_EQ(j.at("device_traces").size(), 1u);
  const json& events = j["device_traces"][0];
  ASSERT_EQ(events.size(), 6u);  // segment_alloc, alloc, segment_alloc, alloc, free_requested, free_completed
  EXPECT_EQ(events[1].at("action"), "alloc");
  EXPECT_EQ(events[1].at("addr"), addr(p));
  EXPECT_EQ(events[1].at("size"), 3 * MiB);
  EXPECT_EQ(events[1].at("stream"), 0);
  EXPECT_EQ(events[1].at("time_us"), 1);
  EXPECT_EQ(events[1].at("frames")[0].at("name"), "fc1");
  EXPECT_EQ(events[1].at("frames")[0].at("filename"), "step 1");
  EXPECT_EQ(events[5].at("action"), "free_completed");

  const json& settings = j.at("allocator_settings");
  EXPECT_EQ(settings.at("PYTORCH_CUDA_ALLOC_CONF"), "max_split_size_mb:200");
  EXPECT_EQ(settings.at("max_split_size"), 200 * MiB);
  EXPECT_EQ(settings.at("expandable_segments"), false);
  EXPECT_EQ(settings.at("roundup_power2_divisions").size(), 16u);
  EXPECT_EQ(settings.at("roundup_power2_divisions").at("32768"), 0);
  EXPECT_TRUE(j.at("external_annotations").is_array());
}

TEST(AllocationTrace, OomEntryUsesDeviceFreeInTheSnapshot) {
  AllocationTrace trace;
  trace.record(TraceAction::oom, 123, 2 * MiB);
  const json j = json::parse(memory_snapshot_json(AllocatorSnapshot{}, &trace));
  const json& e = j.at("device_traces")[0][0];
  EXPECT_EQ(e.at("action"), "oom");
  EXPECT_EQ(e.at("device_free"), 123);
  EXPECT_FALSE(e.contains("addr"));
  EXPECT_EQ(e.at("frames")[0].at("name"), "?");
  EXPECT_EQ(j.at("allocator_settings").at("max_split_size"), -1);
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

TEST(AllocationTrace, PickleWritesProtocol2Opcodes) {
  // Worked by hand from the pickle opcode table, and checked once with Python's pickle.loads,
  // which returns {'a': [1, -2, 300, 'x', True, None, 1.5, 1099511627776], 'b': {}}.
  const std::string bytes = pickle_from_json(R"({"a":[1,-2,300,"x",true,null,1.5,1099511627776],"b":{}})");
  EXPECT_EQ(hex(bytes),
            "8002"                  // PROTO 2
            "7d28"                  // EMPTY_DICT MARK
            "580100000061"          // BINUNICODE "a"
            "5d28"                  // EMPTY_LIST MARK
            "4b01"                  // BININT1 1
            "4afeffffff"            // BININT -2
            "4a2c010000"            // BININT 300
            "580100000078"          // BINUNICODE "x"
            "88"                    // NEWTRUE
            "4e"                    // NONE
            "473ff8000000000000"    // BINFLOAT 1.5, big-endian
            "8a080000000000010000"  // LONG1 8 bytes: 2^40
            "65"                    // APPENDS
            "580100000062"          // BINUNICODE "b"
            "7d2875"                // EMPTY_DICT MARK SETITEMS
            "75"                    // SETITEMS
            "2e");                  // STOP
}

TEST(AllocationTrace, SnapshotPickleIsTheSnapshotDict) {
  SimulatedDevice device(1024 * MiB);
  CachingAllocator a(device);
  AllocationTrace trace;
  a.set_trace(&trace);
  void* p = a.allocate(3 * MiB).value();
  a.free(p);
  const AllocatorSnapshot snap = a.snapshot();
  const std::string bytes = memory_snapshot_pickle(snap, &trace);
  EXPECT_EQ(bytes, pickle_from_json(memory_snapshot_json(snap, &trace)));
  ASSERT_GT(bytes.size(), 3u);
  EXPECT_EQ(hex(bytes.substr(0, 4)), "80027d28");
  EXPECT_EQ(bytes.back(), '.');
}

}  // namespace
}  // namespace memplan::runtime
