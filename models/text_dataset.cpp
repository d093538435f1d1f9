#include "memplan/models/text_dataset.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <optional>
#include <utility>

#include "memplan/common/input_file.h"
#include "memplan/common/rng.h"

namespace memplan::models {

std::string TextDataset::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::int32_t id : ids) out.push_back(static_cast<char>(vocab[static_cast<std::size_t>(id)]));
  return out;
}

Result<std::int64_t> text_vocabulary(const std::string& path) {
  auto text = read_text(path);
  if (!text) return text.error();
  std::array<bool, 256> seen{};
  for (char ch : text.value()) seen[static_cast<unsigned char>(ch)] = true;
  return static_cast<std::int64_t>(std::count(seen.begin(), seen.end(), true));
}

Result<TextDataset> make_text_dataset(const std::string& text, std::int64_t min_tokens) {
  std::array<bool, 256> seen{};
  for (char ch : text) seen[static_cast<unsigned char>(ch)] = true;
  TextDataset data;
  std::array<std::int32_t, 256> id_of{};
  for (int byte = 0; byte < 256; ++byte) {
    if (!seen[static_cast<std::size_t>(byte)]) continue;
    id_of[static_cast<std::size_t>(byte)] = static_cast<std::int32_t>(data.vocab.size());
    data.vocab.push_back(static_cast<unsigned char>(byte));
  }
  const auto n = static_cast<std::int64_t>(text.size());
  const std::int64_t split = n * 9 / 10;
  if (split < min_tokens || n - split < min_tokens) {
    return Error{"the text has " + std::to_string(n) + " characters: too short for sequences of " +
                 std::to_string(min_tokens) + " in both the training and validation split"};
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t id = id_of[static_cast<unsigned char>(text[static_cast<std::size_t>(i)])];
    (i < split ? data.train : data.val).push_back(id);
  }
  return data;
}

Result<std::string> read_fortunes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Error{"no text folder '" + dir + "' (install Debian's fortunes package: apt-get install fortunes)"};
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path& path = entry.path();
    if (!entry.is_regular_file() || path.extension() == ".dat" || path.extension() == ".u8") continue;
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const fs::path& path : files) {
    Result<InputFile> file = InputFile::open(path.string(), kMaxTextBytes, "text file");
    if (!file) return file.error();
    for (;;) {
      // No line is longer than the whole corpus may be; the total is checked as it grows.
      Result<std::optional<std::string>> line = file.value().read_line(static_cast<std::size_t>(kMaxTextBytes));
      if (!line) return line.error();
      if (!line.value()) break;
      text += *line.value() == "%" ? "\n" : *line.value() + "\n";
      if (static_cast<Bytes>(text.size()) > kMaxTextBytes) {
        return Error{"the text files in '" + dir + "' hold more than " + describe_bytes(kMaxTextBytes) +
                     ", the most memplan reads as a corpus"};
      }
    }
  }
  if (text.empty()) return Error{"no text files in '" + dir + "'"};
  return text;
}

Result<std::string> read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return read_fortunes(path);
  if (!fs::exists(path, ec)) {
    return Error{"no text file or folder '" + path + "' (install Debian's fortunes package: apt-get install fortunes, or pass --data FILE)"};
  }
  Result<std::string> read = read_regular_file(path, kMaxTextBytes, "text file");
  if (!read) return read.error();
  std::string text = std::move(read).value();
  if (text.empty()) return Error{"'" + path + "' is empty"};
  return text;
}

void sample_text_batch(const std::vector<std::int32_t>& tokens, std::int64_t batch, std::int64_t context,
                       std::uint64_t seed, std::int64_t step, std::vector<std::int32_t>& x,
                       std::vector<std::int32_t>& labels) {
  const auto positions = static_cast<std::uint64_t>(static_cast<std::int64_t>(tokens.size()) - context);
  Rng rng(seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(step) + 1);
  x.resize(static_cast<std::size_t>(batch * context));
  labels.resize(x.size());
  for (std::int64_t i = 0; i < batch; ++i) {
    const auto start = static_cast<std::size_t>(rng.below(positions));
    for (std::int64_t t = 0; t < context; ++t) {
      x[static_cast<std::size_t>(i * context + t)] = tokens[start + static_cast<std::size_t>(t)];
      labels[static_cast<std::size_t>(i * context + t)] = tokens[start + static_cast<std::size_t>(t) + 1];
    }
  }
}

}  // namespace memplan::models
