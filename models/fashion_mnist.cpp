#include "memplan/models/fashion_mnist.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "memplan/common/input_file.h"

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

namespace {

// zlib over a file InputFile opened (so only a regular file of bounded size is read). gzread
// reads plain files transparently, so one path serves both forms.
class GzReader {
 public:
  static Result<GzReader> open(const std::string& path, Bytes max_file_bytes) {
    Result<InputFile> file = InputFile::open(path, max_file_bytes, "IDX file");
    if (!file) return file.error();
    const int fd = ::dup(file.value().fd());
    gzFile gz = fd < 0 ? nullptr : gzdopen(fd, "rb");
    if (gz == nullptr) {
      if (fd >= 0) ::close(fd);
      return Error{"cannot open '" + path + "'"};
    }
    return GzReader(path, gz);
  }
  GzReader(GzReader&& other) noexcept : path_(std::move(other.path_)), gz_(std::exchange(other.gz_, nullptr)) {}
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;
  GzReader& operator=(GzReader&&) = delete;
  ~GzReader() {
    if (gz_ != nullptr) gzclose(gz_);
  }

  // Appends up to `n` bytes to `out`; fewer only at the end of the stream.
  Status read(std::size_t n, std::vector<std::uint8_t>& out) {
    while (n > 0) {
      const std::size_t start = out.size();
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n, std::size_t{1} << 20));
      out.resize(start + chunk);
      const int got = gzread(gz_, out.data() + start, chunk);
      if (got < 0) {
        int code = 0;
        const std::string message = gzerror(gz_, &code);
        out.resize(start);
        return Error{"'" + path_ + "' is corrupt: " + message};
      }
      out.resize(start + static_cast<std::size_t>(got));
      if (got == 0) break;
      n -= static_cast<std::size_t>(got);
    }
    return Status::success();
  }

  // A truncated gzip stream ends without an error from gzread on some zlib versions; gzclose
  // reports it.
  Status close() {
    const int status = gzclose(std::exchange(gz_, nullptr));
    if (status != Z_OK) return Error{"'" + path_ + "' is truncated or corrupt (gzip stream did not end cleanly)"};
    return Status::success();
  }

 private:
  GzReader(std::string path, gzFile gz) : path_(std::move(path)), gz_(gz) {}
  std::string path_;
  gzFile gz_ = nullptr;
};

}  // namespace

Result<std::vector<std::uint8_t>> read_idx_file(const std::string& path, std::uint32_t magic) {
  Result<GzReader> opened = GzReader::open(path, kMaxIdxFileBytes);
  if (!opened) return opened.error();
  GzReader& reader = opened.value();
  // The header (magic, then one big-endian count per dimension) announces the size; nothing
  // more than that is read, and the stream must end there.
  const std::size_t dims = magic & 0xff;
  const std::size_t header_bytes = 4 + 4 * dims;
  std::vector<std::uint8_t> data;
  if (Status s = reader.read(header_bytes, data); !s) return s.error();
  const std::string kind = magic == kImagesMagic ? "image" : "label";
  if (data.size() < header_bytes) {
    return Error{"'" + path + "' is too short for an IDX " + kind + " header (" + std::to_string(data.size()) +
                 " bytes, need " + std::to_string(header_bytes) + ")"};
  }
  if (read_be32(data.data()) != magic) return Error{"'" + path + "' is not an IDX " + kind + " file (bad magic number)"};
  std::uint64_t payload = 1;
  for (std::size_t d = 0; d < dims; ++d) {
    // Each extent is below 2^32 and the product so far at most kMaxIdxFileBytes: no overflow.
    payload *= read_be32(data.data() + 4 + 4 * d);
    if (payload > static_cast<std::uint64_t>(kMaxIdxFileBytes)) {
      return Error{"'" + path + "': its header announces more than " + describe_bytes(kMaxIdxFileBytes) +
                   " of data, more than an IDX file may hold"};
    }
  }
  const std::uint64_t announced = header_bytes + payload;
  // Read one byte past what was announced, so trailing data shows (parse_idx_pair names it).
  if (Status s = reader.read(static_cast<std::size_t>(announced) + 1 - header_bytes, data); !s) return s.error();
  if (Status s = reader.close(); !s) return s.error();
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
      // Any entry by that name: the reader refuses what is not a regular file, and says so.
      if (fs::exists(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
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
  auto images = read_idx_file(images_path, kImagesMagic);
  if (!images) return images.error();
  auto labels = read_idx_file(labels_path, kLabelsMagic);
  if (!labels) return labels.error();
  return parse_idx_pair(images.value(), labels.value(), images_path, labels_path);
}

void resample_gray(const float* image, std::int64_t rows, std::int64_t cols, std::int64_t channels, std::int64_t height,
                   std::int64_t width, float* out) {
  // Source coordinate of output index i along a side of `in` pixels resampled to `n`.
  auto source = [](std::int64_t i, std::int64_t in, std::int64_t n, std::int64_t& i0, std::int64_t& i1, float& t) {
    const float scale = static_cast<float>(in) / static_cast<float>(n);
    const float x = std::max(0.0f, (static_cast<float>(i) + 0.5f) * scale - 0.5f);
    i0 = std::min(static_cast<std::int64_t>(x), in - 1);
    i1 = std::min(i0 + 1, in - 1);
    t = x - static_cast<float>(i0);
  };
  float* plane = out;
  for (std::int64_t y = 0; y < height; ++y) {
    std::int64_t r0 = 0, r1 = 0;
    float ty = 0.0f;
    source(y, rows, height, r0, r1, ty);
    for (std::int64_t x = 0; x < width; ++x) {
      std::int64_t c0 = 0, c1 = 0;
      float tx = 0.0f;
      source(x, cols, width, c0, c1, tx);
      const float top = image[r0 * cols + c0] * (1.0f - tx) + image[r0 * cols + c1] * tx;
      const float bottom = image[r1 * cols + c0] * (1.0f - tx) + image[r1 * cols + c1] * tx;
      plane[y * width + x] = top * (1.0f - ty) + bottom * ty;
    }
  }
  for (std::int64_t c = 1; c < channels; ++c) std::copy(plane, plane + height * width, out + c * height * width);
}

}  // namespace memplan::models
