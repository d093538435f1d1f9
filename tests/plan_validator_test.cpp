// planner::validate_plan, rule by rule (as tests/validator_test.cpp does for packings): each test
// starts from a valid plan built by hand, breaks exactly one rule, and checks that the message
// names the rule and the buffer(s) that broke it.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "memplan/graph/training_step.h"
#include "memplan/models/mlp.h"
#include "memplan/planner/memory_plan.h"

namespace memplan::planner {
namespace {

constexpr Bytes A = kArenaAlignment;

PlannedBuffer buffer(std::string name, Offset offset, Bytes size, OpIndex first, OpIndex last, bool persistent) {
  PlannedBuffer b;
  b.name = std::move(name);
  b.offset = offset;
  b.size_bytes = size;
  b.first_op = first;
  b.last_op = last;
  b.persistent = persistent;
  b.role = persistent ? graph::Role::parameter : graph::Role::activation;
  return b;
}

// Five ops; every buffer is followed by at least 64 free bytes, so the plan is valid with guard
// bytes 0 or 64.
//   persistent region [0, 6A): 'w' [0, 2A-64), 'm' [2A, 3A-64), the kernel workspace [4A, 6A)
//   transient region [6A, 9A): 'act' ops 0..2 [6A, 7A+100) and 'tmp' ops 3..4 [6A, 7A-64)
//                              share bytes (never live together); 'grad' ops 1..3 [8A, 9A-64)
MemoryPlan valid_plan(Bytes guard = 0) {
  MemoryPlan p;
  p.schedule = {0, 1, 2, 3, 4};
  p.buffers = {buffer("w", 0, 2 * A - 64, 0, 4, true), buffer("m", 2 * A, A - 64, 0, 4, true),
               buffer("act", 6 * A, A + 100, 0, 2, false), buffer("tmp", 6 * A, A - 64, 3, 4, false),
               buffer("grad", 8 * A, A - 64, 1, 3, false)};
  p.guard_bytes = guard;
  p.workspace_offset = 4 * A;
  p.workspace_bytes = 2 * A;
  p.persistent_bytes = 6 * A;
  p.transient_bytes = 3 * A;
  p.arena_bytes = 9 * A;
  return p;
}

std::string error_of(const MemoryPlan& plan) {
  const Status s = validate_plan(plan);
  return s.ok() ? "ok" : s.error().message;
}

PlannedBuffer& named(MemoryPlan& p, const std::string& name) {
  for (PlannedBuffer& b : p.buffers) {
    if (b.name == name) return b;
  }
  throw std::logic_error("no buffer '" + name + "' in the test plan");
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PlanValidator, AcceptsTheHandBuiltPlanWithAndWithoutGuards) {
  EXPECT_EQ(error_of(valid_plan()), "ok");
  EXPECT_EQ(error_of(valid_plan(64)), "ok");
}

TEST(PlanValidator, AcceptsPlansFromThePlanner) {
  graph::Graph g = models::build_mlp(models::MlpConfig{64, {32, 32}, 10}, 8);
  graph::make_training_step(g, graph::OptimizerConfig{});
  for (const Bytes guard : {Bytes{0}, Bytes{64}}) {
    PlanOptions options;
    options.guard_bytes = guard;
    options.workspace_bytes = 1000;
    options.solver = SolverBudget::greedy_only();
    const MemoryPlan plan = plan_memory(g, options).value();
    EXPECT_EQ(error_of(plan), "ok") << "guard bytes " << guard;
  }
}

TEST(PlanValidator, LiveBuffersSharingBytes) {
  MemoryPlan p = valid_plan();
  named(p, "grad").offset = 7 * A;  // [7A, 8A-64) inside 'act' [6A, 7A+100) while both live (ops 1..2)
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "overlap while both are live")) << e;
  EXPECT_TRUE(has(e, "'act' [1536, 1892) ops 0..2")) << e;
  EXPECT_TRUE(has(e, "'grad' [1792, 1984) ops 1..3")) << e;
}

TEST(PlanValidator, LifetimesAreInclusive) {
  MemoryPlan p = valid_plan();
  named(p, "tmp").first_op = 2;  // 'act' still reads its bytes at op 2
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "overlap while both are live")) << e;
  EXPECT_TRUE(has(e, "'act'")) << e;
  EXPECT_TRUE(has(e, "'tmp' [1536, 1728) ops 2..4")) << e;
}

TEST(PlanValidator, PersistentBufferSharingBytesWithATransientOneLiveAtOtherTimes) {
  MemoryPlan p = valid_plan();
  named(p, "tmp").offset = 0;  // ops 3..4 only
  // A persistent buffer holds its value across steps: its bytes are never free, whatever its
  // lifetime fields say.
  named(p, "w").last_op = 1;
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "'w' [0, 448) (persistent, live for the whole step)")) << e;
  EXPECT_TRUE(has(e, "'tmp' [0, 192) ops 3..4")) << e;
  EXPECT_TRUE(has(e, "overlap")) << e;
}

TEST(PlanValidator, PersistentBuffersSharingBytes) {
  MemoryPlan p = valid_plan();
  named(p, "m").offset = A;  // [A, 2A-64) inside 'w'
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "'w' [0, 448) (persistent")) << e;
  EXPECT_TRUE(has(e, "'m' [256, 448) (persistent")) << e;
  EXPECT_TRUE(has(e, "overlap")) << e;
}

TEST(PlanValidator, BufferEndingPastTheArena) {
  MemoryPlan p = valid_plan();
  named(p, "grad").size_bytes = A + 1;
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'grad' [2048, 2305) ends past the arena's 2304 bytes")) << e;
}

TEST(PlanValidator, GuardBytesEndingPastTheArena) {
  MemoryPlan p = valid_plan(64);
  named(p, "grad").size_bytes = A - 63;  // the buffer fits; its guard bytes do not
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'grad' [2048, 2241) (with its 64 guard bytes) ends past the arena's 2304 bytes")) << e;
  p.guard_bytes = 0;
  EXPECT_EQ(error_of(p), "ok");
}

TEST(PlanValidator, MisalignedOffset) {
  MemoryPlan p = valid_plan();
  named(p, "grad").offset = 7 * A + A / 2;  // [1920, 2112): overlaps nothing, inside the arena
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'grad' has offset 1920, not a non-negative multiple of 256")) << e;
}

TEST(PlanValidator, NegativeOffset) {
  MemoryPlan p = valid_plan();
  named(p, "tmp").offset = -A;
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'tmp' has offset -256, not a non-negative multiple of 256")) << e;
}

TEST(PlanValidator, LifetimeOutsideTheSchedule) {
  MemoryPlan p = valid_plan();
  named(p, "grad").last_op = 5;  // the schedule has ops 0..4
  std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'grad' has lifetime ops 1..5, not a non-empty range of the schedule's 5 ops")) << e;

  p = valid_plan();
  named(p, "act").first_op = -1;
  e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'act' has lifetime ops -1..2")) << e;
}

// An inverted lifetime is live at no op, so the overlap rule would wave it through.
TEST(PlanValidator, InvertedLifetime) {
  MemoryPlan p = valid_plan();
  PlannedBuffer& grad = named(p, "grad");
  grad.first_op = 3;
  grad.last_op = 1;
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'grad' has lifetime ops 3..1, not a non-empty range")) << e;
}

TEST(PlanValidator, PersistentBufferOutsideThePersistentRegion) {
  MemoryPlan p = valid_plan();
  p.workspace_bytes = 0;
  p.persistent_bytes = 2 * A + 128;  // 'm' [2A, 3A-64) sticks out by 64 bytes
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "persistent buffer 'm' [512, 704) lies outside the persistent region [0, 640)")) << e;
}

TEST(PlanValidator, PersistentGuardBytesOutsideThePersistentRegion) {
  MemoryPlan p = valid_plan(64);
  p.workspace_bytes = 0;
  p.persistent_bytes = 3 * A - 32;  // 'm' fits; its guard bytes do not
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "persistent buffer 'm' [512, 704) (with its 64 guard bytes) lies outside the persistent region [0, 736)"))
      << e;
  p.guard_bytes = 0;
  EXPECT_EQ(error_of(p), "ok");
}

TEST(PlanValidator, PersistentRegionLargerThanTheArena) {
  MemoryPlan p = valid_plan();
  p.persistent_bytes = 10 * A;
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "the persistent region [0, 2560) does not fit the arena's 2304 bytes")) << e;
}

TEST(PlanValidator, WorkspaceMisaligned) {
  MemoryPlan p = valid_plan();
  p.workspace_offset = 4 * A + 8;
  p.workspace_bytes = 2 * A - 8;  // still ends at the persistent region's end
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "the kernel workspace [1032, 1536) is not an aligned range inside the persistent region [0, 1536)"))
      << e;
}

TEST(PlanValidator, WorkspaceOutsideThePersistentRegion) {
  MemoryPlan p = valid_plan();
  p.persistent_bytes = 6 * A - 16;  // the workspace [4A, 6A) now ends 16 bytes past it
  std::string e = error_of(p);
  EXPECT_TRUE(has(e, "the kernel workspace [1024, 1536) is not an aligned range inside the persistent region [0, 1520)"))
      << e;

  p = valid_plan();
  p.workspace_offset = -2 * A;
  e = error_of(p);
  EXPECT_TRUE(has(e, "the kernel workspace [-512, 0) is not an aligned range")) << e;
}

TEST(PlanValidator, TransientBufferInTheWorkspace) {
  MemoryPlan p = valid_plan();
  named(p, "tmp").offset = 4 * A;
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'tmp' [1024, 1216) overlaps the kernel workspace [1024, 1536)")) << e;
}

TEST(PlanValidator, PersistentBufferRunningIntoTheWorkspace) {
  MemoryPlan p = valid_plan();
  named(p, "m").size_bytes = 2 * A + 1;  // [2A, 4A+1)
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'm' [512, 1025) overlaps the kernel workspace [1024, 1536)")) << e;
}

TEST(PlanValidator, GuardBytesRunningIntoTheWorkspace) {
  MemoryPlan p = valid_plan(64);
  named(p, "m").size_bytes = 2 * A - 32;  // ends 32 bytes before the workspace
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "buffer 'm' [512, 992) (with its 64 guard bytes) overlaps the kernel workspace [1024, 1536)")) << e;
  p.guard_bytes = 0;
  EXPECT_EQ(error_of(p), "ok");
}

TEST(PlanValidator, LiveBuffersCloserThanTheGuardBytes) {
  MemoryPlan p = valid_plan(64);
  named(p, "act").size_bytes = 2 * A - 32;  // [6A, 8A-32): 32 bytes before 'grad', both live at ops 1..2
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "'act' [1536, 2016) ops 0..2")) << e;
  EXPECT_TRUE(has(e, "'grad' [2048, 2240) ops 1..3")) << e;
  EXPECT_TRUE(has(e, "are live together with fewer than the 64 guard bytes between them")) << e;
  p.guard_bytes = 0;
  EXPECT_EQ(error_of(p), "ok");
}

TEST(PlanValidator, PersistentBuffersCloserThanTheGuardBytes) {
  MemoryPlan p = valid_plan(64);
  named(p, "w").size_bytes = 2 * A - 32;  // 32 bytes before 'm'
  const std::string e = error_of(p);
  EXPECT_TRUE(has(e, "'w' [0, 480) (persistent")) << e;
  EXPECT_TRUE(has(e, "'m' [512, 704) (persistent")) << e;
  EXPECT_TRUE(has(e, "fewer than the 64 guard bytes")) << e;
}

TEST(PlanValidator, ZeroSizeBuffersConflictWithNothing) {
  MemoryPlan p = valid_plan();
  p.buffers.push_back(buffer("empty", 6 * A, 0, 0, 4, false));
  p.buffers.push_back(buffer("empty_state", 0, 0, 0, 4, true));
  EXPECT_EQ(error_of(p), "ok");
}

}  // namespace
}  // namespace memplan::planner
