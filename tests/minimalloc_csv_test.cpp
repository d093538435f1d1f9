// planner/minimalloc_csv: round trips, and every kind of hostile input gives an Error with
// the right line number (never an exception or a crash).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "memplan/common/atomic_file.h"
#include "memplan/planner/minimalloc_csv.h"

namespace memplan::planner {
namespace {

std::string error_of(std::string_view text) {
  const Result<MinimallocCsv> r = parse_minimalloc_csv(text, "in.csv");
  return r.ok() ? "ok" : r.error().message;
}

TEST(MinimallocCsv, SizesAddingUpPast2To62AreRefusedWithTheLine) {
  std::string text = "id,lower,upper,size\n";
  for (int i = 0; i < 4; ++i) text += "b" + std::to_string(i) + ",0,2,1152921504606846976\n";
  ASSERT_EQ(error_of(text), "ok");
  EXPECT_EQ(error_of(text + "x,0,2,1\n"), "in.csv:6: the sizes up to here add up to more than 2^62 bytes");
}

TEST(MinimallocCsv, ParsesTheReadmeExample) {
  const Result<MinimallocCsv> r = parse_minimalloc_csv("id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\n", "x");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const AllocationProblem& p = r.value().problem;
  ASSERT_EQ(p.buffers.size(), 2u);
  EXPECT_EQ(p.buffers[1].id, "b2");
  EXPECT_EQ(p.buffers[1].first_op, 3);
  EXPECT_EQ(p.buffers[1].end_op, 9);
  EXPECT_EQ(p.buffers[1].size_bytes, 4);
  EXPECT_EQ(p.buffers[1].alignment, 1);
  EXPECT_FALSE(r.value().offsets.has_value());
}

TEST(MinimallocCsv, ColumnsInAnyOrderCrlfAndBlankLines) {
  const Result<MinimallocCsv> r = parse_minimalloc_csv("size, id ,upper,lower\r\n8,a,5,2\r\n\r\n", "x");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().problem.buffers[0].size_bytes, 8);
  EXPECT_EQ(r.value().problem.buffers[0].first_op, 2);
}

TEST(MinimallocCsv, RoundTripWithOffsets) {
  AllocationProblem p;
  p.buffers = {{"x", 5, 1, 0, 2, std::nullopt}, {"y", 7, 1, 1, 4, std::nullopt}};
  const Result<std::string> text = format_minimalloc_csv(p, {0, 5});
  ASSERT_TRUE(text.ok());
  const Result<MinimallocCsv> back = parse_minimalloc_csv(text.value(), "x");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().problem.buffers[1].id, "y");
  EXPECT_EQ(back.value().offsets, (std::vector<Offset>{0, 5}));
}

TEST(MinimallocCsv, HostileInputsNameTheLine) {
  const std::string header = "id,lower,upper,size\n";
  struct Case {
    std::string text;
    std::string expected;  // a fragment of the message, which starts with "in.csv:LINE:"
  };
  const std::vector<Case> cases = {
      {"", "in.csv:1: missing header"},
      {"\n\n", "in.csv:1: missing header"},
      {"id,lower,size\n", "in.csv:1: header lacks column 'upper'"},
      {"id,lower,upper,size,colour\n", "in.csv:1: unknown column 'colour'"},
      {"id,lower,upper,size,size\n", "in.csv:1: column 'size' appears twice"},
      {header + "a,0,1,4\nb,0,x,4\n", "in.csv:3: column 'upper' value 'x' is not an integer"},
      {header + "a,0,1,nan\n", "in.csv:2: column 'size' value 'nan' is not an integer"},
      {header + "a,0,1,NaN\n", "in.csv:2: column 'size' value 'NaN' is not an integer"},
      {header + "a,0,1,2.5\n", "in.csv:2: column 'size' value '2.5' is not an integer"},
      {header + "a,0,1,\n", "in.csv:2: column 'size' is empty"},
      {header + "a,0,1,-4\n", "in.csv:2: size -4 must be positive"},
      {header + "a,0,1,0\n", "in.csv:2: size 0 must be positive"},
      {header + "a,5,5,4\n", "in.csv:2: upper 5 must be greater than lower 5"},
      {header + "a,6,5,4\n", "in.csv:2: upper 5 must be greater than lower 6"},
      {header + "a,0,1,4\nb,0,1,4\na,2,3,4\n", "in.csv:4: duplicate id 'a'"},
      {header + "a,0,99999999999999999999,4\n", "in.csv:2: column 'upper' value '99999999999999999999' does not fit in 64 bits"},
      {header + "a,0,1,9223372036854775808\n", "in.csv:2: column 'size' value '9223372036854775808' does not fit"},
      {header + "a,0,1,4611686018427387904\n", "in.csv:2: size 4611686018427387904 exceeds 2^60"},
      {header + "a,0,1\n", "in.csv:2: expected 4 fields, found 3"},
      {header + "a,0,1,4,5\n", "in.csv:2: expected 4 fields, found 5"},
      {header + ",0,1,4\n", "in.csv:2: column 'id' is empty"},
      {header + "a,0,1,4\n" + std::string("b,0,\x01\xff\x00,4\n", 10), "in.csv:3: line contains control or binary bytes"},
      {header + "a,0,1,4\n" + std::string(5000, 'z') + "\n", "in.csv:3: line is longer than 4096 bytes"},
      {std::string("\x89PNG\r\n\x1a\n\0\0", 10), "in.csv:1: line contains control or binary bytes"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(c.text);
    EXPECT_NE(e.find(c.expected), std::string::npos) << "input: " << c.text.substr(0, 60) << "\nerror: " << e;
  }
}

TEST(MinimallocCsv, ReadingAMissingFileIsAnError) {
  const Result<MinimallocCsv> r = read_minimalloc_csv("/nonexistent/dir/in.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("/nonexistent/dir/in.csv"), std::string::npos);
}

TEST(MinimallocCsv, IdsCsvCannotHoldAreRejectedOnWrite) {
  AllocationProblem p;
  p.buffers = {{"a,b", 5, 1, 0, 2, std::nullopt}};
  EXPECT_FALSE(format_minimalloc_csv(p, {0}).ok());
  EXPECT_FALSE(format_minimalloc_csv(p, {}).ok());
}

TEST(WriteFileAtomically, WritesWholeFileAndLeavesNoTemporaries) {
  const auto dir = std::filesystem::temp_directory_path() / ("memplan_csv_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "out.csv";
  ASSERT_TRUE(write_file_atomically(path.string(), "hello\n").ok());
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "hello");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  EXPECT_FALSE(write_file_atomically((dir / "missing" / "out.csv").string(), "x").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace memplan::planner
