// 'memplan compare' end to end: the static plan never reserves more than the caching allocator
// on the same step, the JSON carries the numbers, pictures and snapshots are written, and bad
// input is a usage error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memplan {
namespace {

using testing::run_cli;

TEST(CompareCli, StaticPlanReservesNoMoreThanTheCachingAllocator) {
  const auto r = run_cli("compare --batch 1024 --hidden 1024,1024 --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  const auto arena = j["planned_arena_bytes"].get<std::int64_t>();
  const auto caching = j["caching"]["reserved_peak_bytes"].get<std::int64_t>();
  const auto expandable = j["expandable"]["reserved_peak_bytes"].get<std::int64_t>();
  EXPECT_GT(arena, 0);
  EXPECT_GE(arena, j["lower_bound_bytes"].get<std::int64_t>());
  EXPECT_LE(arena, caching);
  EXPECT_LE(arena, expandable);
  EXPECT_GE(j["caching"]["fragmentation_bytes"].get<std::int64_t>(), 0);
  EXPECT_GE(j["caching"]["allocated_peak_bytes"].get<std::int64_t>(), j["lower_bound_bytes"].get<std::int64_t>() / 2);
  EXPECT_EQ(j["caching"]["device_allocs_per_step"].get<std::int64_t>(), 0);
  EXPECT_TRUE(j["expandable"].contains("maps"));
  // Once warm, the caching allocator stops asking the device.
  const auto& steps = j["caching"]["per_step"];
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_GT(steps[0]["device_allocations"].get<int>(), 0);
  EXPECT_EQ(steps[2]["device_allocations"].get<int>(), 0);
}

TEST(CompareCli, ABudgetThePlanFitsMakesTheCachingAllocatorRunOutWithPyTorchsMessage) {
  // A budget of exactly the planned arena: the plan needs no slack, the caching allocator does.
  const auto probe = nlohmann::json::parse(run_cli("compare --batch 1024 --hidden 1024,1024 --json", false).output);
  const auto arena = probe["planned_arena_bytes"].get<std::int64_t>();
  const auto r = run_cli("compare --batch 1024 --hidden 1024,1024 --json --budget " + std::to_string(arena), false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j["planned"]["fits"].get<bool>());
  ASSERT_TRUE(j["caching"]["out_of_memory"].get<bool>());
  const std::string message = j["caching"]["oom_message"].get<std::string>();
  EXPECT_NE(message.find("Tried to allocate"), std::string::npos) << message;
  EXPECT_NE(message.find("reserved by PyTorch but unallocated"), std::string::npos) << message;
  EXPECT_FALSE(j["caching"]["oom_op"].get<std::string>().empty());
}

TEST(CompareCli, WritesThePictureAndThePyTorchSnapshot) {
  const auto dir = std::filesystem::temp_directory_path() / ("memplan_compare_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto svg = dir / "layout.svg", snap = dir / "snapshot.pickle", trace = dir / "trace.json";
  const auto r = run_cli("compare --batch 256 --svg " + svg.string() + " --snapshot " + snap.string() +
                         " --trace-json " + trace.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("memplan static plan"), std::string::npos);
  EXPECT_NE(text.find("expandable segments"), std::string::npos);
  ASSERT_TRUE(std::filesystem::exists(snap));
  std::ifstream pickle(snap, std::ios::binary);
  char header[2] = {};
  pickle.read(header, 2);
  EXPECT_EQ(static_cast<unsigned char>(header[0]), 0x80) << "a pickle starts with the PROTO opcode";
  std::ifstream trace_in(trace);
  const auto events = nlohmann::json::parse(trace_in);
  ASSERT_TRUE(events.contains("events"));
  EXPECT_GT(events["events"].size(), 10u);
  std::filesystem::remove_all(dir);
}

TEST(CompareCli, BadCapacityAndAllocatorOptionsAreUsageErrors) {
  for (const char* args : {"compare --budget 0", "compare --budget -3GiB", "compare --budget 12parsecs",
                           "compare --alloc-conf frobnicate:1", "compare --steps 0"}) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace memplan
