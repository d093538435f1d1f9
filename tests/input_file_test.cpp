// common/input_file: only regular files are read, and never more than the caller's limit or a
// line longer than asked; refusals name the file and the limit. Opening a pipe nobody writes to
// returns at once (the test would hang otherwise).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "memplan/common/input_file.h"

namespace memplan {
namespace {

namespace fs = std::filesystem;

class InputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("memplan_input_file_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path.string();
  }
  fs::path dir_;
};

TEST_F(InputFileTest, ReadsARegularFileWhole) {
  const std::string path = write("a.txt", "hello\nworld");
  auto bytes = read_regular_file(path, 100, "text file");
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  EXPECT_EQ(bytes.value(), "hello\nworld");
}

TEST_F(InputFileTest, RefusesWhatIsNotARegularFileAndNamesIt) {
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    std::string path;
    std::string says;
  } cases[] = {
      {fifo.string(), "named pipe"},
      {"/dev/zero", "character device"},
      {dir_.string(), "directory"},
      {(dir_ / "missing").string(), "cannot open"},
  };
  for (const auto& c : cases) {
    auto r = InputFile::open(c.path, 1 << 20, "CSV file");
    ASSERT_FALSE(r.ok()) << c.path;
    EXPECT_NE(r.error().message.find(c.path), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(c.says), std::string::npos) << r.error().message;
  }
}

TEST_F(InputFileTest, RefusesAFileOverTheLimitBeforeReadingIt) {
  const std::string path = write("big", "");
  fs::resize_file(path, std::uintmax_t{40} << 30);  // sparse: no disk used
  auto r = read_regular_file(path, 1 << 20, "weights file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("40.0 GiB"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("at most 1.0 MiB"), std::string::npos) << r.error().message;
  EXPECT_TRUE(read_regular_file(write("exact", std::string(10, 'x')), 10, "file").ok());
  EXPECT_FALSE(read_regular_file(write("over", std::string(11, 'x')), 10, "file").ok());
}

TEST_F(InputFileTest, ReadsLinesAndStopsAtALineOverTheLimit) {
  const std::string path = write("lines", "one\r\ntwo\n\nthree");
  auto file = InputFile::open(path, 1000, "text file");
  ASSERT_TRUE(file.ok());
  std::vector<std::string> lines;
  for (;;) {
    auto line = file.value().read_line(10);
    ASSERT_TRUE(line.ok()) << line.error().message;
    if (!line.value()) break;
    lines.push_back(*line.value());
  }
  EXPECT_EQ(lines, (std::vector<std::string>{"one\r", "two", "", "three"}));
  EXPECT_EQ(file.value().line_number(), 4u);

  const std::string longer = write("long", "ok\n" + std::string(200000, '0'));
  auto long_file = InputFile::open(longer, 1 << 20, "CSV file");
  ASSERT_TRUE(long_file.ok());
  ASSERT_TRUE(long_file.value().read_line(100).ok());
  auto refused = long_file.value().read_line(100);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, longer + ":2: line is longer than 100 bytes");
  // Refused after one chunk, not after the whole line.
  EXPECT_LT(long_file.value().bytes_read(), 200000);
}

TEST_F(InputFileTest, ReadExactSaysWhenTheFileEndsEarly) {
  const std::string path = write("short", "abc");
  auto file = InputFile::open(path, 100, "weights file");
  ASSERT_TRUE(file.ok());
  std::string out;
  EXPECT_TRUE(file.value().read_exact(2, out).ok());
  const Status s = file.value().read_exact(5, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("truncated"), std::string::npos) << s.error().message;
}

TEST(DescribeBytes, SmallExactLargeWithUnit) {
  EXPECT_EQ(describe_bytes(1023), "1023 bytes");
  EXPECT_EQ(describe_bytes(4095), "4.0 KiB (4095 bytes)");
  EXPECT_EQ(describe_bytes(Bytes{3} << 29), "1.5 GiB (1610612736 bytes)");
}

}  // namespace
}  // namespace memplan
