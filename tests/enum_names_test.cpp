// Name tables (common/enum_names.h): every user-facing enum's names come from one table, its
// name function and parser are derived from it, and the CLI flags that take it accept exactly its
// names. Per table: every value round-trips name -> parse -> value, every row (aliases too)
// parses to its value, no name is listed twice, and an unknown name fails with a message listing
// every valid name.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cli_util.h"
#include "memplan/common/enum_names.h"
#include "memplan/graph/optimizer.h"
#include "memplan/graph/tensor.h"
#include "memplan/kernels/kernel.h"
#include "memplan/planner/checkpoint.h"
#include "memplan/planner/schedule.h"
#include "memplan/runtime/devices.h"
#include "memplan/runtime/executor.h"

namespace memplan {
namespace {

// Checks one table against its derived functions. `values` is every enumerator the table must
// name; `name_of` and `parse` are the enum's own functions.
template <class Table, class E = enum_of_table<Table>>
void check_table(const Table& table, const std::vector<E>& values, const std::function<std::string_view(E)>& name_of,
                 const std::function<Result<E>(std::string_view)>& parse) {
  for (E value : values) {
    const std::string_view name = name_of(value);
    EXPECT_NE(name, "?") << "value " << static_cast<int>(value) << " has no row";
    EXPECT_EQ(name, enum_name(table, value));
    const Result<E> back = parse(name);
    ASSERT_TRUE(back.ok()) << name << ": " << back.error().message;
    EXPECT_EQ(back.value(), value) << name;
  }
  std::set<std::string_view> seen;
  for (const auto& row : table) {
    EXPECT_TRUE(seen.insert(row.name).second) << "'" << row.name << "' is listed twice";
    const Result<E> parsed = parse(row.name);
    ASSERT_TRUE(parsed.ok()) << row.name << ": " << parsed.error().message;
    EXPECT_EQ(parsed.value(), row.value) << row.name;
  }
  for (const char* unknown : {"", "nonsense", "ADAMW", " sgd"}) {
    const Result<E> bad = parse(unknown);
    ASSERT_FALSE(bad.ok()) << "'" << unknown << "' parsed";
    const std::string& message = bad.error().message;
    EXPECT_NE(message.find("'" + std::string(unknown) + "'"), std::string::npos) << message;
    for (const auto& row : table) {
      EXPECT_NE(message.find(std::string(row.name)), std::string::npos) << message << " does not list " << row.name;
    }
    EXPECT_NE(message.find(enum_name_list(table)), std::string::npos) << message;
  }
}

TEST(EnumNames, OptimizerKind) {
  using graph::OptimizerKind;
  check_table<decltype(graph::kOptimizerNames), OptimizerKind>(
      graph::kOptimizerNames,
      {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adamw, OptimizerKind::adamw8bit, OptimizerKind::paged_adamw8bit},
      graph::optimizer_name,
      graph::parse_optimizer_kind);
  EXPECT_EQ(graph::parse_optimizer_kind("adam").error().message, "unknown optimizer 'adam' (expected sgd, momentum, adamw, adamw8bit or paged_adamw8bit)");
}

TEST(EnumNames, FloatDTypesWithAliases) {
  using graph::DType;
  const auto floats = graph::float_dtype_names();
  check_table<decltype(floats), DType>(floats, {DType::f32, DType::bf16, DType::f16}, graph::dtype_name,
                                       graph::parse_float_dtype);
  // The aliases are rows of the one table; the first row of a value is its name.
  EXPECT_EQ(graph::parse_float_dtype("f32").value(), DType::f32);
  EXPECT_EQ(graph::parse_float_dtype("f16").value(), DType::f16);
  EXPECT_EQ(graph::dtype_name(DType::f32), "fp32");
  EXPECT_EQ(graph::dtype_name(DType::f16), "fp16");
  // Integer dtypes have names but are not what --dtype takes.
  EXPECT_EQ(graph::dtype_name(DType::i32), "i32");
  EXPECT_EQ(graph::dtype_name(DType::i64), "i64");
  const auto integer = graph::parse_float_dtype("i32");
  ASSERT_FALSE(integer.ok());
  EXPECT_EQ(integer.error().message, "unknown dtype 'i32' (expected fp32, f32, bf16, fp16 or f16)");
  std::size_t float_rows = 0;
  for (const auto& row : graph::kDTypeNames) float_rows += graph::is_floating(row.value) ? 1 : 0;
  EXPECT_EQ(floats.size(), float_rows);
}

TEST(EnumNames, ScheduleKind) {
  using planner::ScheduleKind;
  check_table<decltype(planner::kScheduleNames), ScheduleKind>(
      planner::kScheduleNames, {ScheduleKind::program, ScheduleKind::memory_aware}, planner::schedule_name,
      planner::parse_schedule_kind);
}

TEST(EnumNames, CheckpointStrategy) {
  using planner::CheckpointStrategy;
  check_table<decltype(planner::kCheckpointStrategyNames), CheckpointStrategy>(
      planner::kCheckpointStrategyNames,
      {CheckpointStrategy::kNone, CheckpointStrategy::kSqrt, CheckpointStrategy::kOptimal, CheckpointStrategy::kAuto},
      planner::checkpoint_strategy_name, planner::parse_checkpoint_strategy);
}

TEST(EnumNames, ExecutionMode) {
  using runtime::ExecutionMode;
  check_table<decltype(runtime::kExecutionModeNames), ExecutionMode>(
      runtime::kExecutionModeNames, {ExecutionMode::planned, ExecutionMode::naive, ExecutionMode::dynamic},
      runtime::mode_name, runtime::parse_mode);
}

TEST(EnumNames, DeviceKindAndAuto) {
  using kernels::DeviceKind;
  check_table<decltype(kernels::kDeviceKindNames), DeviceKind>(
      kernels::kDeviceKindNames, {DeviceKind::cpu, DeviceKind::cuda}, kernels::device_kind_name, kernels::parse_device_kind);
  // train's --device also takes "auto"; its error lists the table's names and auto.
  EXPECT_EQ(runtime::resolve_device_kind("auto").value(), runtime::auto_device_kind());
  EXPECT_EQ(runtime::resolve_device_kind("cuda").value(), DeviceKind::cuda);
  const auto bad = runtime::resolve_device_kind("gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "unknown device 'gpu' (expected cpu, cuda or auto)");
}

TEST(EnumNames, HelperEdgeCases) {
  enum class Tiny { a, b, unnamed };
  constexpr EnumName<Tiny> one[] = {{"a", Tiny::a}};
  constexpr EnumName<Tiny> table[] = {{"a", Tiny::a}, {"alias", Tiny::a}, {"b", Tiny::b}};
  static_assert(enum_name(table, Tiny::a) == "a");  // usable at compile time
  EXPECT_EQ(enum_name(table, Tiny::b), "b");
  EXPECT_EQ(enum_name(table, Tiny::unnamed), "?");
  EXPECT_EQ(enum_name_list(one), "a");
  EXPECT_EQ(enum_name_list(table), "a, alias or b");
  EXPECT_EQ(parse_enum(table, "alias", "tiny").value(), Tiny::a);
  EXPECT_EQ(parse_enum(table, "c", "tiny").error().message, "unknown tiny 'c' (expected a, alias or b)");
}

// --- the CLI flags bound to the tables ---------------------------------------------------

struct FlagCase {
  const char* command;  // a command line without the flag's value
  const char* flag;
  std::vector<std::string> names;  // what --help and the error must list, in order
};

std::vector<std::string> names_of(const auto& table) {
  std::vector<std::string> out;
  for (const auto& row : table) out.emplace_back(row.name);
  return out;
}

std::vector<FlagCase> flag_cases() {
  auto with_auto = [](std::vector<std::string> names) {
    names.emplace_back("auto");
    return names;
  };
  return {
      {"plan", "--optimizer", names_of(graph::kOptimizerNames)},
      {"fit --device-memory 1GiB", "--optimizer", names_of(graph::kOptimizerNames)},
      {"compare", "--optimizer", names_of(graph::kOptimizerNames)},
      {"train", "--optimizer", names_of(graph::kOptimizerNames)},
      {"plan", "--dtype", names_of(graph::float_dtype_names())},
      {"fit --device-memory 1GiB", "--dtype", names_of(graph::float_dtype_names())},
      {"plan", "--checkpoint", names_of(planner::kCheckpointStrategyNames)},
      {"fit --device-memory 1GiB", "--checkpoint", names_of(planner::kCheckpointStrategyNames)},
      {"train", "--checkpoint", names_of(planner::kCheckpointStrategyNames)},
      {"plan", "--schedule", with_auto(names_of(planner::kScheduleNames))},
      {"train", "--mode", names_of(runtime::kExecutionModeNames)},
      {"plan", "--device", names_of(kernels::kDeviceKindNames)},
      {"fit --device-memory 1GiB", "--device", names_of(kernels::kDeviceKindNames)},
      {"train", "--device", with_auto(names_of(kernels::kDeviceKindNames))},
  };
}

std::string set_of(const std::vector<std::string>& names) {
  std::string set = "{";
  for (const std::string& n : names) set += n + ",";
  set.back() = '}';
  return set;
}

TEST(EnumNamesCli, HelpListsTheTableNames) {
  for (const FlagCase& c : flag_cases()) {
    const std::string subcommand = std::string(c.command).substr(0, std::string(c.command).find(' '));
    const auto r = testing::run_cli(subcommand + " --help");
    ASSERT_EQ(r.exit_code, 0) << subcommand;
    const auto at = r.output.find("\n  " + std::string(c.flag) + " ");  // the option's own line
    ASSERT_NE(at, std::string::npos) << c.flag << " in\n" << r.output;
    const std::string line = r.output.substr(at + 1, r.output.find('\n', at + 1) - at - 1);
    EXPECT_NE(line.find(set_of(c.names)), std::string::npos) << subcommand << " " << line;
  }
}

TEST(EnumNamesCli, UnknownNamesAreUsageErrorsListingTheNames) {
  for (const FlagCase& c : flag_cases()) {
    const std::string args = std::string(c.command) + " " + c.flag + " nonsense";
    const auto r = testing::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.flag), std::string::npos) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("nonsense not in " + set_of(c.names)), std::string::npos) << args << "\n" << r.output;
    // The enum's integer is not a name.
    const auto integer = testing::run_cli(std::string(c.command) + " " + c.flag + " 1");
    EXPECT_EQ(integer.exit_code, 2) << args << " 1\n" << integer.output;
  }
}

// Every name (aliases included) is accepted and reported under its table name.
TEST(EnumNamesCli, EveryNameIsAcceptedAndReportedByItsName) {
  for (const auto& row : graph::float_dtype_names()) {
    const auto r = testing::run_cli("fit --model gpt2 --batch 1 --device-memory 80GiB --json --dtype " + std::string(row.name), false);
    ASSERT_EQ(r.exit_code, 0) << row.name << "\n" << r.output;
    EXPECT_NE(r.output.find("\"dtype\": \"" + std::string(graph::dtype_name(row.value)) + "\""), std::string::npos) << r.output;
  }
  for (const auto& row : graph::kOptimizerNames) {
    const auto r = testing::run_cli("plan --model mlp --batch 8 --json --optimizer " + std::string(row.name), false);
    ASSERT_EQ(r.exit_code, 0) << row.name << "\n" << r.output;
    EXPECT_NE(r.output.find("\"optimizer\": \"" + std::string(row.name) + "\""), std::string::npos) << row.name;
  }
  for (const auto& row : planner::kScheduleNames) {
    const auto r = testing::run_cli("plan --model mlp --batch 8 --json --schedule " + std::string(row.name), false);
    ASSERT_EQ(r.exit_code, 0) << row.name << "\n" << r.output;
    EXPECT_NE(r.output.find("\"schedule\": \"" + std::string(row.name) + "\""), std::string::npos) << row.name;
  }
  for (const auto& row : kernels::kDeviceKindNames) {
    const auto r = testing::run_cli("plan --model mlp --batch 8 --json --device " + std::string(row.name), false);
    ASSERT_EQ(r.exit_code, 0) << row.name << "\n" << r.output;
    EXPECT_NE(r.output.find("\"device\": \"" + std::string(row.name) + "\""), std::string::npos) << row.name;
  }
}

}  // namespace
}  // namespace memplan
