// PyTorch memory snapshots: the whitelisting unpickler, the schema reader, the start state and the
// replay. The fixtures in tests/data/snapshots/ are written by tests/golden/make_snapshots.py with
// CPython's pickler; the expected numbers below are worked out by hand from PyTorch's allocator
// rules (docs/caching_allocator.md) and the scenarios' comments in that script.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/simulated_device.h"
#include "memplan/trace/memory_snapshot.h"
#include "memplan/trace/pickle.h"
#include "memplan/trace/snapshot_replay.h"
#include "tests/cli_util.h"

namespace memplan::trace {
namespace {

constexpr Bytes MiB = Bytes{1} << 20;

// The bytes of a string literal, embedded NULs included (not its terminating one).
template <std::size_t N>
std::string B(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

std::string fixture(const std::string& name) { return std::string(MEMPLAN_TEST_DATA_DIR) + "/snapshots/" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

SnapshotReplay replay_fixture(const std::string& name, SnapshotReplayRequest request = {}) {
  auto snapshot = read_memory_snapshot(fixture(name));
  EXPECT_TRUE(snapshot.ok()) << (snapshot.ok() ? "" : snapshot.error().message);
  auto replay = replay_snapshot(snapshot.value(), request);
  EXPECT_TRUE(replay.ok()) << (replay.ok() ? "" : replay.error().message);
  return replay.value();
}

// ---- The unpickler ----

TEST(Pickle, ReadsScalarsContainersAndMemo) {
  // {'a': [1, -2, 300, -70000, 2**40, -1, 1.5, True, None, 'x'], 'b': <memo of that list>}
  // hand-assembled in protocol 2 opcodes.
  const std::string p = B("\x80\x02}q\x00(X\x01\x00\x00\x00" "aq\x01]q\x02(K\x01J\xfe\xff\xff\xffM\x2c\x01J\x90\xee\xfe\xff"
                            "\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x01\xffG\x3f\xf8\x00\x00\x00\x00\x00\x00\x88NX\x01\x00\x00\x00"
                            "xeX\x01\x00\x00\x00" "bh\x02u.");
  auto doc = parse_pickle(p);
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  const PickleDocument& d = doc.value();
  const PyValue* a = d.find(d.root(), "a");
  const PyValue* b = d.find(d.root(), "b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->bits, b->bits) << "the memo shares one list";
  const auto items = d.items(*a);
  ASSERT_EQ(items.size(), 10u);
  EXPECT_EQ(d.integer(items[0]), 1);
  EXPECT_EQ(d.integer(items[1]), -2);
  EXPECT_EQ(d.integer(items[2]), 300);
  EXPECT_EQ(d.integer(items[3]), -70000);
  EXPECT_EQ(d.integer(items[4]), std::int64_t{1} << 40);
  EXPECT_EQ(d.integer(items[5]), -1);
  EXPECT_DOUBLE_EQ(d.floating(items[6]), 1.5);
  EXPECT_EQ(items[7].kind(), PyKind::boolean);
  EXPECT_EQ(items[8].kind(), PyKind::none);
  EXPECT_EQ(d.text(items[9]), "x");
}

void expect_refused(const std::string& bytes, const std::string& needle) {
  auto doc = parse_pickle(bytes);
  ASSERT_FALSE(doc.ok()) << "accepted a pickle that should be refused (" << needle << ")";
  EXPECT_NE(doc.error().message.find(needle), std::string::npos) << doc.error().message;
}

TEST(Pickle, RefusesEveryOpcodeThatLoadsOrCalls) {
  expect_refused(B("\x80\x02" "cos\nsystem\n"), "byte 2: opcode GLOBAL");
  expect_refused(B("\x80\x04\x8c\x02os\x8c\x06system\x93"), "STACK_GLOBAL");
  expect_refused(B("\x80\x02NN\x85R."), "REDUCE");
  expect_refused(B("\x80\x02}Nb."), "BUILD");
  expect_refused(B("\x80\x02(ios\nsystem\n"), "INST");
  expect_refused(B("\x80\x02(o."), "OBJ");
  expect_refused(B("\x80\x02N)\x81."), "NEWOBJ");
  expect_refused(B("\x80\x02\x82\x01."), "EXT1");
  expect_refused(B("\x80\x02P1\n."), "PERSID");
  expect_refused(B("\x80\x02NQ."), "BINPERSID");
}

TEST(Pickle, RefusesMalformedInput) {
  expect_refused(B("\x80\x02]q\x00(K\x01"), "truncated");
  expect_refused(B("\x80\x09N."), "protocol 9");
  expect_refused(B("\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x10"), "bytes are left");
  expect_refused(B("\x80\x02h\x07."), "never stored");
  expect_refused(B("\x80\x02r\xff\xff\xff\x7fN."), "memo store with an empty stack");
  expect_refused(B("\x80\x02Nr\xff\xff\xff\x7f."), "out of range");
  expect_refused(B("\x80\x02K\x01K\x02s."), "SETITEM");
  expect_refused(B("\x80\x02" "e."), "without a MARK");
  expect_refused(B("\x80\x02\xff."), "not a pickle opcode");
  expect_refused(B("."), "empty stack");
  // Deep nesting: 200,000 empty lists on the stack, never closed.
  expect_refused(std::string("\x80\x02", 2) + std::string(200000, ']') + ".", "nesting too deep");
  std::string marks = std::string("\x80\x02", 2) + std::string(5000, '(');
  expect_refused(marks + ".", "nested MARKs");
}

// ---- The schema ----

TEST(MemorySnapshot, ProtocolsTwoFourAndFiveReadTheSame) {
  auto p2 = read_memory_snapshot(fixture("fresh_protocol2.pickle"));
  auto p4 = read_memory_snapshot(fixture("fresh_protocol4.pickle"));
  auto p5 = read_memory_snapshot(fixture("fresh_protocol5.pickle"));
  ASSERT_TRUE(p2.ok() && p4.ok() && p5.ok());
  for (const auto* s : {&p4.value(), &p5.value()}) {
    ASSERT_EQ(s->device_traces.size(), 1u);
    ASSERT_EQ(s->device_traces[0].size(), p2.value().device_traces[0].size());
    for (std::size_t i = 0; i < s->device_traces[0].size(); ++i) {
      EXPECT_EQ(s->device_traces[0][i].address, p2.value().device_traces[0][i].address);
      EXPECT_EQ(s->device_traces[0][i].size, p2.value().device_traces[0][i].size);
      EXPECT_EQ(s->device_traces[0][i].action, p2.value().device_traces[0][i].action);
    }
    EXPECT_EQ(s->sites, p2.value().sites);
  }
  const MemorySnapshot& s = p4.value();
  ASSERT_EQ(s.device_traces[0].size(), 17u);
  EXPECT_EQ(s.device_traces[0][0].action, SnapshotAction::segment_alloc);
  EXPECT_EQ(s.device_traces[0][1].size, 1000000);
  ASSERT_EQ(s.segments.size(), 3u);
  EXPECT_FALSE(s.segments[0].large_pool);
  EXPECT_EQ(s.segments[0].blocks.size(), 4u);
  EXPECT_EQ(s.segments[0].blocks[0].state, runtime::BlockState::active_allocated);
  // The innermost user frame skips the allocator's C++ frames and the installed torch module.
  ASSERT_EQ(s.sites.size(), 2u);
  EXPECT_EQ(s.sites[static_cast<std::size_t>(s.device_traces[0][1].site)], "/home/user/model.py:10 forward");
}

TEST(MemorySnapshot, UserFrameIsTheInnermostOutsideLibraries) {
  std::vector<StackFrame> frames = {{"??", 0, "malloc"},
                                    {"/usr/lib/python3/dist-packages/torch/nn/modules/module.py", 1, "_call_impl"},
                                    {"/home/u/model.py", 5, "forward"},
                                    {"/home/u/train.py", 9, "<module>"}};
  EXPECT_EQ(user_frame_index(frames), std::optional<std::size_t>(2));
  frames.erase(frames.begin() + 2, frames.end());
  EXPECT_EQ(user_frame_index(frames), std::optional<std::size_t>(1)) << "falls back to any Python frame";
  frames.pop_back();
  EXPECT_EQ(user_frame_index(frames), std::nullopt);
}

// A snapshot dict built in protocol-2 opcodes from JSON-like pieces: the pickle the memplan
// compare command writes uses the same subset.
std::string pickled(const std::string& json_text) { return runtime::pickle_from_json(json_text); }

void expect_schema_error(const std::string& json_text, const std::string& needle) {
  auto s = parse_memory_snapshot(pickled(json_text), "x.pickle");
  ASSERT_FALSE(s.ok()) << "accepted: " << json_text;
  EXPECT_NE(s.error().message.find("x.pickle"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find(needle), std::string::npos) << s.error().message;
}

TEST(MemorySnapshot, NamesTheFieldThatIsWrong) {
  expect_schema_error("[1, 2]", "not the dict");
  expect_schema_error(R"({"device_traces": []})", "'segments'");
  expect_schema_error(R"({"segments": []})", "'device_traces'");
  expect_schema_error(R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": "big"}]]})",
                      "device_traces[0][0]: 'size' is a str");
  expect_schema_error(R"({"segments": [], "device_traces": [[{"action": "alloc", "size": 4}]]})",
                      "device_traces[0][0]: the required field 'addr' is missing");
  expect_schema_error(R"({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": -4}]]})", "'size' is -4");
  expect_schema_error(R"({"segments": [{"address": 0, "total_size": 512}], "device_traces": []})", "'blocks'");
  expect_schema_error(
      R"({"segments": [{"address": 0, "total_size": 512, "blocks": [{"size": 1024, "state": "inactive"}]}], "device_traces": []})",
      "more than the segment's total_size");
  expect_schema_error(
      R"({"segments": [{"address": 0, "total_size": 512, "blocks": [{"size": 512, "state": "busy"}]}], "device_traces": []})",
      "state 'busy'");
}

TEST(MemorySnapshot, RefusesStreamsDirectoriesAndMissingFiles) {
  for (const std::string path : {"/dev/zero", "/tmp", "/nonexistent/run.pickle"}) {
    auto s = read_memory_snapshot(path);
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_NE(s.error().message.find(path), std::string::npos) << s.error().message;
  }
  SnapshotReadLimits tiny;
  tiny.max_file_bytes = 100;
  auto s = read_memory_snapshot(fixture("fresh_protocol4.pickle"), tiny);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("at most 100 bytes"), std::string::npos) << s.error().message;
}

TEST(MemorySnapshot, TruncatedFileIsRefusedAtEveryLength) {
  const std::string bytes = read_bytes(fixture("fresh_protocol4.pickle"));
  ASSERT_GT(bytes.size(), 1000u);
  for (std::size_t n = 0; n < bytes.size(); n += 97) {
    auto s = parse_memory_snapshot(std::string_view(bytes).substr(0, n), "cut.pickle");
    EXPECT_FALSE(s.ok()) << "accepted the first " << n << " bytes";
  }
}

// ---- Start state and replay ----

TEST(SnapshotReplay, FreshRunMatchesTheRecordingExactly) {
  const SnapshotReplay r = replay_fixture("fresh_protocol4.pickle");
  EXPECT_EQ(r.events, 17);
  EXPECT_EQ(r.allocs, 8);
  EXPECT_EQ(r.frees, 3);
  EXPECT_TRUE(r.start.segments.empty());
  const std::vector<Bytes> segments = {2 * MiB, 20 * MiB, 20 * MiB};
  EXPECT_EQ(r.recorded.segment_sizes, segments);
  EXPECT_EQ(r.simulated.segment_sizes, segments);
  EXPECT_TRUE(r.fidelity.segment_sizes_match);
  EXPECT_EQ(r.recorded.reserved_peak_bytes, 42 * MiB);
  EXPECT_EQ(r.simulated.reserved_peak_bytes, 42 * MiB);
  EXPECT_EQ(r.fidelity.placements_compared, 8);
  EXPECT_EQ(r.fidelity.placements_matched, 8);
  EXPECT_FALSE(r.fidelity.first_divergence.has_value());
  // Live peak, events 11-12: 512 + 3 + 5 MiB + 1024 + 12 MiB + 3 MiB (sizes rounded to 512 B).
  EXPECT_EQ(r.live_peak_bytes, 23 * MiB + 1536);
  EXPECT_EQ(r.planned_arena_bytes, r.live_peak_bytes);
  ASSERT_FALSE(r.top_sites.empty());
  EXPECT_EQ(r.top_sites[0].site, "/home/user/model.py:20 backward");
}

TEST(SnapshotReplay, LateStartRebuildsTheCacheBeforeTheFirstEvent) {
  auto snapshot = read_memory_snapshot(fixture("late_start.pickle"));
  ASSERT_TRUE(snapshot.ok());
  auto start = reconstruct_start_state(snapshot.value(), 0, {});
  ASSERT_TRUE(start.ok()) << start.error().message;
  const StartState& s = start.value();
  ASSERT_EQ(s.segments.size(), 3u);
  EXPECT_EQ(s.reserved_bytes, 104 * MiB);
  EXPECT_EQ(s.live_blocks, 4);
  EXPECT_EQ(s.live_bytes, 53 * MiB);
  // P: the 4 MiB block still allocated at the end (size stated) and the 6 MiB one freed in the trace.
  ASSERT_EQ(s.segments[0].live.size(), 2u);
  EXPECT_TRUE(s.segments[0].live[0].size_known);
  EXPECT_EQ(s.segments[0].live[1].size, 6 * MiB);
  // Q: the 4 MiB request holds 5 MiB: the first allocation after it lands 1 MiB later.
  ASSERT_EQ(s.segments[1].live.size(), 2u);
  EXPECT_EQ(s.segments[1].live[0].size, 39 * MiB);
  EXPECT_EQ(s.segments[1].live[1].size, 5 * MiB);
  EXPECT_TRUE(s.segments[2].live.empty());

  const SnapshotReplay r = replay_fixture("late_start.pickle");
  EXPECT_EQ(r.fidelity.placements_compared, 3);
  EXPECT_EQ(r.fidelity.placements_matched, 3) << (r.fidelity.first_divergence ? r.fidelity.first_divergence->what : "");
  EXPECT_EQ(r.recorded.reserved_peak_bytes, 104 * MiB);
  EXPECT_EQ(r.simulated.reserved_peak_bytes, 104 * MiB);
  EXPECT_TRUE(r.recorded.segment_sizes.empty());
  EXPECT_TRUE(r.simulated.segment_sizes.empty());
}

TEST(SnapshotReplay, OutOfMemoryEventsAreJudgedUnderEachAlternative) {
  const SnapshotReplay r = replay_fixture("oom.pickle");
  EXPECT_EQ(r.simulated.config, "max_split_size_mb:64") << "allocator_settings are applied";
  ASSERT_EQ(r.ooms.size(), 1u);
  const OomAnalysis& o = r.ooms[0];
  EXPECT_EQ(o.event, 2);
  EXPECT_EQ(o.requested_bytes, 50 * MiB);
  EXPECT_EQ(o.device_free_bytes, 30 * MiB);
  EXPECT_EQ(o.capacity_bytes, 70 * MiB);  // 40 MiB reserved + 30 MiB free
  EXPECT_EQ(o.largest_free_block_bytes, 0);
  EXPECT_FALSE(o.fits_cached);
  EXPECT_FALSE(o.fits_expandable);   // 40 + 50 MiB > 70 MiB
  EXPECT_FALSE(o.fits_static_plan);  // 40 and 50 MiB live together
}

TEST(SnapshotReplay, EachStreamHasItsOwnCachedBlocks) {
  const SnapshotReplay r = replay_fixture("two_streams.pickle");
  EXPECT_EQ(r.streams, 2);
  const std::vector<Bytes> segments = {20 * MiB, 20 * MiB};
  EXPECT_EQ(r.simulated.segment_sizes, segments) << "stream 7 must not take stream 0's free block";
  EXPECT_EQ(r.fidelity.placements_compared, 3);
  EXPECT_EQ(r.fidelity.placements_matched, 3);
  EXPECT_EQ(r.simulated.reserved_peak_bytes, 40 * MiB);
}

TEST(SnapshotReplay, InconsistentTracesFailWithTheEvent) {
  // A free of an address that lies in no segment and was never allocated.
  auto s = parse_memory_snapshot(pickled(R"({"segments": [], "device_traces": [[
      {"action": "free_completed", "addr": 4096, "size": 512}]]})"),
                                 "x.pickle");
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto r = replay_snapshot(s.value(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("event 0 frees 0x1000"), std::string::npos) << r.error().message;
  // The same address allocated twice.
  s = parse_memory_snapshot(pickled(R"({"segments": [], "device_traces": [[
      {"action": "segment_alloc", "addr": 0, "size": 2097152},
      {"action": "alloc", "addr": 0, "size": 512}, {"action": "alloc", "addr": 0, "size": 512}]]})"),
                            "x.pickle");
  ASSERT_TRUE(s.ok());
  r = replay_snapshot(s.value(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("event 2"), std::string::npos) << r.error().message;
  // No trace for the device asked for.
  SnapshotReplayRequest other;
  other.device = 3;
  r = replay_snapshot(s.value(), other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("device 3"), std::string::npos);
}

// ---- The allocator's start-state primitives ----

TEST(CachingAllocatorStartState, RestoredSegmentServesAndReleasesLikeAnyOther) {
  runtime::SimulatedDevice device(Bytes{1} << 34);
  runtime::CachingAllocator a(device);
  auto base = a.restore_segment(true, {{4 * MiB, 4 * MiB, true}, {16 * MiB, 0, false}});
  ASSERT_TRUE(base.ok()) << base.error().message;
  const auto all = static_cast<std::size_t>(runtime::StatPool::all);
  EXPECT_EQ(a.stats().reserved_bytes[all].current, 20 * MiB);
  EXPECT_EQ(a.stats().allocated_bytes[all].current, 4 * MiB);
  EXPECT_EQ(a.stats().num_device_alloc, 0) << "the segment existed before; it is not a device allocation";
  EXPECT_EQ(a.largest_free_block(), 16 * MiB);
  auto p = a.allocate(10 * MiB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(reinterpret_cast<runtime::DeviceAddress>(p.value()), base.value() + 4 * MiB);
  EXPECT_FALSE(a.release_segment(base.value())) << "blocks are still allocated in it";
  a.free(p.value());
  a.free(reinterpret_cast<void*>(base.value()));
  EXPECT_TRUE(a.release_segment(base.value()));
  EXPECT_EQ(a.stats().reserved_bytes[all].current, 0);
  EXPECT_FALSE(a.restore_segment(true, {{1000, 1000, true}}).ok()) << "block sizes are multiples of 512";
  EXPECT_FALSE(a.restore_segment(true, {{512, 0, false}, {512, 0, false}}).ok()) << "free neighbours would have merged";
}

TEST(CachingAllocatorStartState, StreamsDoNotShareCachedBlocks) {
  runtime::SimulatedDevice device(Bytes{1} << 34);
  runtime::CachingAllocator a(device);
  auto p0 = a.allocate(4 * MiB, 0);
  ASSERT_TRUE(p0.ok());
  a.free(p0.value());
  auto p1 = a.allocate(4 * MiB, 1);
  ASSERT_TRUE(p1.ok());
  EXPECT_NE(p1.value(), p0.value());
  EXPECT_EQ(a.stats().num_device_alloc, 2) << "a second segment for the second stream";
  auto p2 = a.allocate(4 * MiB, 0);
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(p2.value(), p0.value()) << "stream 0 reuses its own cached block";
  a.free(p1.value());
  a.free(p2.value());
}

// ---- The command ----

TEST(ReplayCli, JsonHasTheDocumentedKeys) {
  const auto r = memplan::testing::run_cli("replay " + fixture("fresh_protocol4.pickle") + " --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["events"], 17);
  EXPECT_EQ(j["allocs"], 8);
  EXPECT_EQ(j["recorded"]["segment_allocs"], 3);
  EXPECT_EQ(j["recorded"]["reserved_peak_bytes"], 42 * MiB);
  EXPECT_EQ(j["simulated"]["segment_allocs"], 3);
  EXPECT_EQ(j["simulated"]["reserved_peak_bytes"], 42 * MiB);
  EXPECT_EQ(j["fidelity"]["segment_sizes_match"], true);
  EXPECT_EQ(j["fidelity"]["placement_match_ratio"], 1.0);
  EXPECT_TRUE(j["fidelity"]["first_divergence"].is_null());
  EXPECT_EQ(j["live_peak_bytes"], 23 * MiB + 1536);
  EXPECT_EQ(j["planned_arena_bytes"], 23 * MiB + 1536);
  EXPECT_TRUE(j["expandable"]["reserved_peak_bytes"].is_number());
  EXPECT_TRUE(j["top_sites"].is_array());
}

TEST(ReplayCli, HostileFilesExitTwoNamingTheFile) {
  const std::string dir = ::testing::TempDir();
  const std::string evil = dir + "/evil.pickle";
  std::ofstream(evil, std::ios::binary) << B("\x80\x02" "cos\nsystem\n(S'true'\ntR.");
  auto r = memplan::testing::run_cli("replay " + evil);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("evil.pickle"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GLOBAL"), std::string::npos) << r.output;
  r = memplan::testing::run_cli("replay /dev/zero");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/dev/zero"), std::string::npos) << r.output;
  r = memplan::testing::run_cli("replay " + fixture("fresh_protocol4.pickle") + " --alloc-conf bogus:1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bogus"), std::string::npos) << r.output;
}

TEST(ReplayCli, AllocConfWhatIfAndHtmlReport) {
  const std::string html = ::testing::TempDir() + "/replay.html";
  const auto r = memplan::testing::run_cli("replay " + fixture("fresh_protocol4.pickle") +
                                           " --alloc-conf expandable_segments:True --html " + html);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expandable_segments:True"), std::string::npos) << r.output;
  const std::string page = read_bytes(html);
  EXPECT_NE(page.find("<table id=\"summary\">"), std::string::npos);
  EXPECT_NE(page.find("<svg"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos) << "self-contained, no script";
}

TEST(ReplayCli, ReadsBackMemplansOwnCompareSnapshot) {
  // compare --snapshot writes the caching allocator's run in PyTorch's format: replaying it must
  // reproduce that run exactly.
  const std::string snap = ::testing::TempDir() + "/compare.pickle";
  auto c = memplan::testing::run_cli("compare --model mlp --batch 64 --steps 2 --snapshot " + snap);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const auto r = memplan::testing::run_cli("replay " + snap + " --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_GT(j["allocs"].get<int>(), 10);
  EXPECT_EQ(j["fidelity"]["segment_sizes_match"], true);
  EXPECT_EQ(j["fidelity"]["placement_match_ratio"], 1.0);
  EXPECT_EQ(j["simulated"]["reserved_peak_bytes"], j["recorded"]["reserved_peak_bytes"]);
}

// The self-test of the start state: a recording replayed from every point inside it (its first K
// events cut away, the dumped state kept) must still land every allocation at the recorded segment
// and offset, with the recorded segment sizes and reserved peak. Most users' recordings start
// mid-run like this. The fixtures, and a longer run memplan's own caching allocator recorded
// (a GPT's training steps: 1,100 events, 15 segments).
void expect_every_cut_reproduces(const MemorySnapshot& snapshot, const std::string& name, std::size_t stride) {
  const std::size_t events = snapshot.device_traces.empty() ? 0 : snapshot.device_traces.front().size();
  int cuts = 0;
  SnapshotReplayRequest request;
  request.solver_nodes = 0;  // the static plan is not what is checked
  for (std::size_t first = 0; first <= events; first += stride) {
    auto replay = replay_snapshot(cut_snapshot(snapshot, 0, first), request);
    ASSERT_TRUE(replay.ok()) << name << " from event " << first << ": " << replay.error().message;
    const ReplayFidelity& f = replay.value().fidelity;
    EXPECT_EQ(f.placements_matched, f.placements_compared) << name << " from event " << first << ": first divergence at "
                                                           << (f.first_divergence ? f.first_divergence->what : "-");
    EXPECT_TRUE(f.segment_sizes_match) << name << " from event " << first;
    EXPECT_TRUE(f.reserved_peak_matches) << name << " from event " << first;
    ++cuts;
  }
  EXPECT_GT(cuts, 0);
}

TEST(SnapshotReplay, EveryCutOfARecordingStillReproducesIt) {
  for (const char* name : {"fresh_protocol4.pickle", "late_start.pickle", "oom.pickle", "two_streams.pickle"}) {
    auto snapshot = read_memory_snapshot(fixture(name));
    ASSERT_TRUE(snapshot.ok()) << snapshot.error().message;
    expect_every_cut_reproduces(snapshot.value(), name, 1);
  }
  const std::string snap = ::testing::TempDir() + "/cut_gpt.pickle";
  auto c = memplan::testing::run_cli("compare --model gpt --steps 3 --device-memory 1GiB --snapshot " + snap);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  auto snapshot = read_memory_snapshot(snap);
  ASSERT_TRUE(snapshot.ok()) << snapshot.error().message;
  ASSERT_GT(snapshot.value().device_traces.front().size(), 1000u);
  expect_every_cut_reproduces(snapshot.value(), "compare --model gpt", memplan::testing::kSanitized ? 97 : 13);
}

}  // namespace
}  // namespace memplan::trace
