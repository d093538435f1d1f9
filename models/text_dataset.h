// Character-level text for the GPT model: Debian's fortune cookies (package `fortunes`), or any
// folder of plain-text files. Bytes are the characters; the vocabulary is the sorted set of bytes
// that occur. Files are read in name order and entries ('%' lines separate them) joined by blank
// lines, so the corpus, vocabulary and split are the same on every machine with the same package.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/common/types.h"

namespace memplan::models {

inline constexpr const char* kFortunesDefaultDir = "/usr/share/games/fortunes";
// The most text read as a corpus (fortunes are 5 MB); every byte becomes a 4-byte token id.
inline constexpr Bytes kMaxTextBytes = Bytes{256} << 20;

struct TextDataset {
  std::vector<unsigned char> vocab;  // id -> byte, ascending
  std::vector<std::int32_t> train;   // token ids, the first 90% of the corpus
  std::vector<std::int32_t> val;     // the last 10%
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(vocab.size()); }
  std::string decode(const std::vector<std::int32_t>& ids) const;
};

// Builds the dataset from `text`: vocabulary, encoding, 90/10 split. Error if it is too short
// for one sequence of `min_tokens` in each split.
Result<TextDataset> make_text_dataset(const std::string& text, std::int64_t min_tokens);

// Reads every regular file in `dir` that is not a strfile index (*.dat) or a UTF-8 copy (*.u8),
// in name order, dropping the '%' separator lines. Error naming the folder if nothing is there.
Result<std::string> read_fortunes(const std::string& dir);

// The text at `path`: a folder is read as fortunes (above), a regular file as it is; anything
// else (a pipe, a device) and more than kMaxTextBytes are refused.
Result<std::string> read_text(const std::string& path);

// The vocabulary size make_text_dataset builds from the text at `path` (read as read_text does):
// the distinct bytes in it.
Result<std::int64_t> text_vocabulary(const std::string& path);

// Fills x [batch, T] and labels [batch*T] (x shifted by one) from windows of `tokens` starting at
// positions drawn from (seed, step): deterministic for a run.
void sample_text_batch(const std::vector<std::int32_t>& tokens, std::int64_t batch, std::int64_t context,
                       std::uint64_t seed, std::int64_t step, std::vector<std::int32_t>& x,
                       std::vector<std::int32_t>& labels);

}  // namespace memplan::models
