// models/fashion_mnist: the IDX reader accepts well-formed files (plain or gzipped) and turns
// every malformed one into an error that names the file and the problem.
#include <gtest/gtest.h>

#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "memplan/models/fashion_mnist.h"

namespace memplan::models {
namespace {

std::vector<std::uint8_t> be32(std::uint32_t v) {
  return {std::uint8_t(v >> 24), std::uint8_t(v >> 16), std::uint8_t(v >> 8), std::uint8_t(v)};
}

std::vector<std::uint8_t> idx_images(std::uint32_t n, std::uint32_t rows, std::uint32_t cols) {
  std::vector<std::uint8_t> out;
  for (std::uint32_t v : {0x803u, n, rows, cols}) {
    auto b = be32(v);
    out.insert(out.end(), b.begin(), b.end());
  }
  for (std::uint32_t i = 0; i < n * rows * cols; ++i) out.push_back(std::uint8_t(i % 256));
  return out;
}

std::vector<std::uint8_t> idx_labels(std::uint32_t n) {
  std::vector<std::uint8_t> out;
  for (std::uint32_t v : {0x801u, n}) {
    auto b = be32(v);
    out.insert(out.end(), b.begin(), b.end());
  }
  for (std::uint32_t i = 0; i < n; ++i) out.push_back(std::uint8_t(i % 10));
  return out;
}

std::string parse_error(const std::vector<std::uint8_t>& images, const std::vector<std::uint8_t>& labels) {
  auto r = parse_idx_pair(images, labels, "imgs", "lbls");
  return r.ok() ? std::string() : r.error().message;
}

// Bilinear resampling as PyTorch's interpolate(align_corners=False): output pixel i samples the
// input at (i + 0.5) * in / out - 0.5, clamped to the edges. A 2 x 2 image to 4 x 4 and 3 channels:
// each row is a, a + (b - a) / 4, a + 3 (b - a) / 4, b; shrinking 4 x 4 to 2 x 2 samples at 0.5 and 2.5.
TEST(ResampleGray, IsBilinearWithAlignCornersFalseAndRepeatsTheGray) {
  const float image[4] = {0.0f, 4.0f, 8.0f, 12.0f};  // [[0, 4], [8, 12]]
  std::vector<float> out(3 * 16);
  resample_gray(image, 2, 2, 3, 4, 4, out.data());
  const std::vector<float> plane = {0, 1, 3, 4, 2, 3, 5, 6, 6, 7, 9, 10, 8, 9, 11, 12};
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(std::vector<float>(out.begin() + c * 16, out.begin() + (c + 1) * 16), plane) << "channel " << c;
  }
  std::vector<float> big(16);
  for (int i = 0; i < 16; ++i) big[static_cast<std::size_t>(i)] = float(i);
  std::vector<float> small(4);
  resample_gray(big.data(), 4, 4, 1, 2, 2, small.data());
  EXPECT_EQ(small, (std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f}));
  std::vector<float> same(16);
  resample_gray(big.data(), 4, 4, 1, 4, 4, same.data());
  EXPECT_EQ(same, big);
}

TEST(Idx, ParsesWellFormedPair) {
  auto r = parse_idx_pair(idx_images(3, 2, 2), idx_labels(3), "imgs", "lbls");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().count, 3);
  EXPECT_EQ(r.value().features(), 4);
  EXPECT_FLOAT_EQ(r.value().images[5], 5.0f / 255.0f);
  EXPECT_EQ(r.value().labels[2], 2);
}

struct Hostile {
  const char* what;
  std::vector<std::uint8_t> images;
  std::vector<std::uint8_t> labels;
  const char* expected;  // a fragment the message must contain
};

TEST(Idx, HostileInputsGiveNamedErrors) {
  const auto good_images = idx_images(3, 2, 2);
  const auto good_labels = idx_labels(3);
  std::vector<Hostile> cases;
  cases.push_back({"empty images", {}, good_labels, "'imgs' is too short"});
  cases.push_back({"empty labels", good_images, {}, "'lbls' is too short"});
  auto bad_magic = good_images;
  bad_magic[3] = 0x01;
  cases.push_back({"bad image magic", bad_magic, good_labels, "not an IDX image file"});
  auto bad_label_magic = good_labels;
  bad_label_magic[3] = 0x03;
  cases.push_back({"bad label magic", good_images, bad_label_magic, "not an IDX label file"});
  auto truncated = good_images;
  truncated.pop_back();
  cases.push_back({"truncated images", truncated, good_labels, "(truncated)"});
  auto trailing = good_labels;
  trailing.push_back(0);
  cases.push_back({"trailing labels", good_images, trailing, "(trailing data)"});
  cases.push_back({"count mismatch", good_images, idx_labels(4), "has 4 labels but"});
  auto bad_label = good_labels;
  bad_label[9] = 200;
  cases.push_back({"label out of range", good_images, bad_label, "item 1 has label 200"});
  auto huge = good_images;
  huge[4] = 0xff;  // count ~ 4 billion
  cases.push_back({"huge count", huge, good_labels, "implausible header"});
  auto zero_rows = idx_images(3, 2, 2);
  zero_rows[11] = 0;
  cases.push_back({"zero rows", zero_rows, good_labels, "implausible header"});
  std::vector<std::uint8_t> garbage(64);
  for (std::size_t i = 0; i < garbage.size(); ++i) garbage[i] = std::uint8_t(i * 37 + 11);
  cases.push_back({"binary garbage", garbage, garbage, "not an IDX"});
  for (const Hostile& c : cases) {
    const std::string message = parse_error(c.images, c.labels);
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.what << ": got '" << message << "'";
  }
}

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("memplan_idx_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write_plain(const std::string& name, const std::vector<std::uint8_t>& data) {
    std::ofstream(dir_ / name, std::ios::binary).write(reinterpret_cast<const char*>(data.data()),
                                                        static_cast<std::streamsize>(data.size()));
  }
  void write_gz(const std::string& name, const std::vector<std::uint8_t>& data) {
    gzFile f = gzopen((dir_ / name).c_str(), "wb");
    gzwrite(f, data.data(), static_cast<unsigned>(data.size()));
    gzclose(f);
  }
  std::filesystem::path dir_;
};

TEST_F(IdxFiles, LoadsGzippedAndPlainFiles) {
  write_gz("t10k-images-idx3-ubyte.gz", idx_images(5, 3, 3));
  write_plain("t10k-labels-idx1-ubyte", idx_labels(5));
  auto r = load_fashion_mnist(dir_.string(), Split::test);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().count, 5);
}

TEST_F(IdxFiles, MissingDatasetNamesThePackageAndTheFlag) {
  auto r = load_fashion_mnist(dir_.string(), Split::train);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("apt-get install dataset-fashion-mnist"), std::string::npos);
  EXPECT_NE(r.error().message.find("--data"), std::string::npos);
}

TEST_F(IdxFiles, TruncatedGzipIsReportedWithTheFileName) {
  write_gz("full.gz", idx_images(50, 8, 8));
  std::ifstream in(dir_ / "full.gz", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes.resize(bytes.size() / 2);
  std::ofstream(dir_ / "train-images-idx3-ubyte.gz", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  write_gz("train-labels-idx1-ubyte.gz", idx_labels(50));
  auto r = load_fashion_mnist(dir_.string(), Split::train);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("train-images-idx3-ubyte.gz"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace memplan::models
