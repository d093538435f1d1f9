#include "memplan/models/fashion_mnist.h"

#include <zlib.h>

#include <filesystem>

namespace memplan::models {
namespace {

std::uint32_t read_be32(const std::uint8_t* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}

constexpr std::uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr std::uint32_t kMaxItems = 10'000'000;
constexpr std::uint32_t kMaxSide = 4096;

}  // namespace

Result<std::vector<std::uint8_t>> read_maybe_gzipped(const std::string& path) {
  // gzread reads plain files transparently, so one path serves both forms.
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return Error{"cannot open '" + path + "'"};
  std::vector<std::uint8_t> data;
  std::uint8_t chunk[1 << 16];
  for (;;) {
    const int n = gzread(file, chunk, sizeof(chunk));
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(file, &code);
      gzclose(file);
      return Error{"'" + path + "' is corrupt: " + message};
    }
    if (n == 0) break;
    data.insert(data.end(), chunk, chunk + n);
  }
  // A truncated gzip stream ends without an error from gzread on some zlib versions; gzclose
  // reports it.
  const int close_status = gzclose(file);
  if (close_status != Z_OK) {
    return Error{"'" + path + "' is truncated or corrupt (gzip stream did not end cleanly)"};
  }
  return data;
}

Result<ImageDataset> parse_idx_pair(const std::vector<std::uint8_t>& images,
                                    const std::vector<std::uint8_t>& labels,
                                    const std::string& images_name, const std::string& labels_name) {
  if (images.size() < 16) {
    return Error{"'" + images_name + "' is too short for an IDX image header (" +
                 std::to_string(images.size()) + " bytes, need 16)"};
  }
  if (labels.size() < 8) {
    return Error{"'" + labels_name + "' is too short for an IDX label header (" +
                 std::to_string(labels.size()) + " bytes, need 8)"};
  }
  if (read_be32(images.data()) != kImagesMagic) {
    return Error{"'" + images_name + "' is not an IDX image file (bad magic number)"};
  }
  if (read_be32(labels.data()) != kLabelsMagic) {
    return Error{"'" + labels_name + "' is not an IDX label file (bad magic number)"};
  }
  const std::uint32_t count = read_be32(images.data() + 4);
  const std::uint32_t rows = read_be32(images.data() + 8);
  const std::uint32_t cols = read_be32(images.data() + 12);
  const std::uint32_t label_count = read_be32(labels.data() + 4);
  if (count == 0 || count > kMaxItems || rows == 0 || rows > kMaxSide || cols == 0 || cols > kMaxSide) {
    return Error{"'" + images_name + "' has an implausible header: " + std::to_string(count) +
                 " images of " + std::to_string(rows) + "x" + std::to_string(cols)};
  }
  if (label_count != count) {
    return Error{"'" + labels_name + "' has " + std::to_string(label_count) + " labels but '" +
                 images_name + "' has " + std::to_string(count) + " images"};
  }
  const std::uint64_t pixels = std::uint64_t(count) * rows * cols;
  if (images.size() != 16 + pixels) {
    return Error{"'" + images_name + "' should hold " + std::to_string(16 + pixels) +
                 " bytes for its header, but has " + std::to_string(images.size()) +
                 (images.size() < 16 + pixels ? " (truncated)" : " (trailing data)")};
  }
  if (labels.size() != 8 + std::uint64_t(count)) {
    return Error{"'" + labels_name + "' should hold " + std::to_string(8 + std::uint64_t(count)) +
                 " bytes for its header, but has " + std::to_string(labels.size()) +
                 (labels.size() < 8 + std::uint64_t(count) ? " (truncated)" : " (trailing data)")};
  }
  ImageDataset ds;
  ds.count = count;
  ds.rows = rows;
  ds.cols = cols;
  ds.images.resize(pixels);
  for (std::uint64_t i = 0; i < pixels; ++i) ds.images[i] = float(images[16 + i]) / 255.0f;
  ds.labels.resize(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint8_t label = labels[8 + i];
    if (label >= ds.classes) {
      return Error{"'" + labels_name + "' item " + std::to_string(i) + " has label " +
                   std::to_string(label) + ", expected 0.." + std::to_string(ds.classes - 1)};
    }
    ds.labels[i] = label;
  }
  return ds;
}

Result<ImageDataset> load_fashion_mnist(const std::string& dir, Split split) {
  namespace fs = std::filesystem;
  const std::string prefix = split == Split::train ? "train" : "t10k";
  auto locate = [&](const std::string& base) -> std::string {
    for (const std::string& name : {base + ".gz", base}) {
      std::error_code ec;
      if (fs::is_regular_file(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
    }
    return {};
  };
  const std::string images_path = locate(prefix + "-images-idx3-ubyte");
  const std::string labels_path = locate(prefix + "-labels-idx1-ubyte");
  if (images_path.empty() || labels_path.empty()) {
    return Error{"Fashion-MNIST not found in '" + dir + "' (need " + prefix +
                 "-images-idx3-ubyte[.gz] and " + prefix +
                 "-labels-idx1-ubyte[.gz]). Install it with 'apt-get install dataset-fashion-mnist' "
                 "or point --data at a folder holding the IDX files."};
  }
  auto images = read_maybe_gzipped(images_path);
  if (!images) return images.error();
  auto labels = read_maybe_gzipped(labels_path);
  if (!labels) return labels.error();
  return parse_idx_pair(images.value(), labels.value(), images_path, labels_path);
}

}  // namespace memplan::models
