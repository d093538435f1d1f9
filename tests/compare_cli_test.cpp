// 'memplan compare' end to end: the static plan never reserves more than the caching allocator
// on the same step, the JSON carries the numbers, pictures and snapshots are written, and bad
// input is a usage error.
#include <gtest/gtest.h>

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
  const auto arena = j["static"]["reserved_bytes"].get<std::int64_t>();
  const auto caching = j["caching_allocator"]["reserved_peak_bytes"].get<std::int64_t>();
  const auto expandable = j["expandable_segments"]["reserved_peak_bytes"].get<std::int64_t>();
  EXPECT_GT(arena, 0);
  EXPECT_LE(arena, caching);
  EXPECT_LE(arena, expandable);
  EXPECT_GE(j["caching_allocator"]["fragmentation"].get<double>(), 0.0);
  // Once warm, the caching allocator stops asking the device.
  const auto& steps = j["caching_allocator"]["steps"];
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_GT(steps[0]["device_allocations"].get<int>(), 0);
  EXPECT_EQ(steps[2]["device_allocations"].get<int>(), 0);
}

TEST(CompareCli, SmallCapacityMakesTheCachingAllocatorRunOutWithPyTorchsMessage) {
  // 1.5 x the static arena of this step: enough for the plan, which needs no slack.
  const auto probe = nlohmann::json::parse(run_cli("compare --batch 1024 --hidden 1024,1024 --json", false).output);
  const auto arena = probe["static"]["reserved_bytes"].get<std::int64_t>();
  const auto r = run_cli("compare --batch 1024 --hidden 1024,1024 --json --capacity " + std::to_string(arena), false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j["static"]["fits"].get<bool>());
  ASSERT_TRUE(j["caching_allocator"]["out_of_memory"].get<bool>());
  EXPECT_NE(j["caching_allocator"]["oom_message"].get<std::string>().find("Tried to allocate"), std::string::npos);
}

TEST(CompareCli, WritesThePictureAndThePyTorchSnapshot) {
  const auto dir = std::filesystem::temp_directory_path() / "memplan_compare_test";
  std::filesystem::create_directories(dir);
  const auto svg = dir / "layout.svg", snap = dir / "snapshot.pickle";
  const auto r = run_cli("compare --batch 256 --svg " + svg.string() + " --snapshot " + snap.string());
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
  std::filesystem::remove_all(dir);
}

TEST(CompareCli, BadCapacityAndAllocatorOptionsAreUsageErrors) {
  for (const char* args : {"compare --capacity 0", "compare --capacity -3GiB", "compare --capacity 12parsecs",
                           "compare --alloc-conf frobnicate:1", "compare --steps 0"}) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace memplan
