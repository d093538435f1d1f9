// Fashion-MNIST from the IDX files Debian's dataset-fashion-mnist installs (gzipped or not).
// Every malformed file is an Error naming the file and what was wrong; nothing is trusted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"

namespace memplan::models {

inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

struct ImageDataset {
  std::int64_t count = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int32_t classes = 10;
  std::vector<float> images;          // [count, rows*cols], pixel / 255
  std::vector<std::int32_t> labels;   // [count], in [0, classes)
  std::int64_t features() const { return rows * cols; }
};

enum class Split { train, test };

// One gray image [rows, cols] as a model of [channels, height, width] inputs takes it, as
// torchvision's Grayscale(num_output_channels) and Resize prepare it: resampled bilinearly
// (PyTorch's interpolate with align_corners=False, no antialiasing) and the gray value repeated in
// every channel; `out` holds channels * height * width values.
void resample_gray(const float* image, std::int64_t rows, std::int64_t cols, std::int64_t channels, std::int64_t height,
                   std::int64_t width, float* out);

Result<ImageDataset> load_fashion_mnist(const std::string& dir, Split split);

// An IDX file (plain or gzipped, decompressed) may hold at most this: Fashion-MNIST's largest is
// 47 MB.
inline constexpr Bytes kMaxIdxFileBytes = Bytes{1} << 30;

// Low-level readers, exposed for tests and fuzzing.
// The decompressed bytes of the IDX file `path` (plain or gzipped; a regular file only,
// common/input_file.h) whose magic number must be `magic`: the header is read first, and no more
// than the size it announces (plus one byte, so parse_idx_pair sees trailing data).
Result<std::vector<std::uint8_t>> read_idx_file(const std::string& path, std::uint32_t magic);
Result<ImageDataset> parse_idx_pair(const std::vector<std::uint8_t>& images,
                                    const std::vector<std::uint8_t>& labels,
                                    const std::string& images_name, const std::string& labels_name);

}  // namespace memplan::models
