#include "memplan/planner/minimalloc_csv.h"

#include <array>
#include <charconv>
#include <cstdio>
#include <sstream>
#include <unordered_set>

#include "memplan/common/input_file.h"

namespace memplan::planner {

namespace {

// Column slots in a row; the header maps names to positions.
enum Column { kId, kLower, kUpper, kSize, kOffset, kColumnCount };
constexpr std::array<std::string_view, kColumnCount> kColumnNames = {"id", "lower", "upper", "size",
                                                                     "offset"};

// The same limit check_problem() applies, so a file that parses also passes it.
constexpr std::int64_t kMaxSize = std::int64_t{1} << 60;
constexpr std::int64_t kMaxTotalSize = std::int64_t{1} << 62;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      fields.push_back(trim(line.substr(start)));
      return fields;
    }
    fields.push_back(trim(line.substr(start, comma - start)));
    start = comma + 1;
  }
}

class LineError {
 public:
  LineError(std::string_view source, std::size_t line) : source_(source), line_(line) {}
  Error operator()(const std::string& what) const {
    return Error{std::string(source_) + ":" + std::to_string(line_) + ": " + what};
  }

 private:
  std::string_view source_;
  std::size_t line_;
};

// A whole-field signed 64-bit integer: no sign-only, no fraction, no "nan", no overflow.
Result<std::int64_t> parse_int(std::string_view field, std::string_view column, const LineError& error) {
  if (field.empty()) return error("column '" + std::string(column) + "' is empty");
  std::int64_t value = 0;
  const char* begin = field.data();
  const char* end = field.data() + field.size();
  if (*begin == '+') ++begin;  // from_chars rejects a leading '+', which is still a number
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range) {
    return error("column '" + std::string(column) + "' value '" + std::string(field) +
                 "' does not fit in 64 bits");
  }
  if (ec != std::errc() || ptr != end) {
    return error("column '" + std::string(column) + "' value '" + std::string(field) +
                 "' is not an integer");
  }
  return value;
}

// Control bytes other than tab, or bytes >= 0x80 that are not well-formed UTF-8: this is
// not a text file (ids may still be UTF-8 names).
bool has_binary_bytes(std::string_view line) {
  for (std::size_t i = 0; i < line.size(); ++i) {
    const auto u = static_cast<unsigned char>(line[i]);
    if ((u < 0x20 && u != '\t') || u == 0x7f) return true;
    if (u < 0x80) continue;
    const std::size_t continuation = (u & 0xe0) == 0xc0 ? 1 : (u & 0xf0) == 0xe0 ? 2 : (u & 0xf8) == 0xf0 ? 3 : 0;
    if (continuation == 0 || i + continuation >= line.size()) return true;
    for (std::size_t k = 1; k <= continuation; ++k) {
      if ((static_cast<unsigned char>(line[i + k]) & 0xc0) != 0x80) return true;
    }
    i += continuation;
  }
  return false;
}

}  // namespace

namespace {

// Builds the problem one line at a time, so a file is checked as it is read and the first bad
// line stops the reading.
class CsvBuilder {
 public:
  explicit CsvBuilder(std::string_view source) : source_(source) { position.fill(-1); }

  Status add_line(std::string_view line, std::size_t line_number) {
    const LineError error(source_, line_number);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.size() > kMaxCsvLineBytes) {
    return error("line is longer than " + std::to_string(kMaxCsvLineBytes) + " bytes");
  }
  if (has_binary_bytes(line)) return error("line contains control or binary bytes");
  if (trim(line).empty()) return Status::success();  // blank lines (e.g. a trailing one) carry nothing
  const std::vector<std::string_view> fields = split_fields(line);
  if (!have_header) {
    for (std::size_t i = 0; i < fields.size(); ++i) {
      std::size_t c = 0;
      while (c < kColumnCount && kColumnNames[c] != fields[i]) ++c;
      if (c == kColumnCount) {
        return error("unknown column '" + std::string(fields[i]) +
                     "' in header (expected id,lower,upper,size[,offset])");
      }
      if (position[c] >= 0) return error("column '" + std::string(fields[i]) + "' appears twice in header");
      position[c] = int(i);
    }
    for (std::size_t c = 0; c < kOffset; ++c) {
      if (position[c] < 0) {
        return error("header lacks column '" + std::string(kColumnNames[c]) +
                     "' (expected id,lower,upper,size[,offset])");
      }
    }
    columns = fields.size();
    have_header = true;
    return Status::success();
  }
  if (fields.size() != columns) {
    return error("expected " + std::to_string(columns) + " fields, found " + std::to_string(fields.size()));
  }
  BufferSpec buffer;
  buffer.id = std::string(fields[std::size_t(position[kId])]);
  if (buffer.id.empty()) return error("column 'id' is empty");
  std::array<std::int64_t, kColumnCount> value{};
  for (std::size_t c = kLower; c < kColumnCount; ++c) {
    if (position[c] < 0) continue;
    Result<std::int64_t> parsed = parse_int(fields[std::size_t(position[c])], kColumnNames[c], error);
    if (!parsed) return parsed.error();
    value[c] = parsed.value();
  }
  if (value[kSize] <= 0) return error("size " + std::to_string(value[kSize]) + " must be positive");
  if (value[kSize] > kMaxSize) return error("size " + std::to_string(value[kSize]) + " exceeds 2^60");
  total_size += value[kSize];  // each at most 2^60 and the total at most 2^62 so far: no overflow
  if (total_size > kMaxTotalSize) return error("the sizes up to here add up to more than 2^62 bytes");
  if (value[kUpper] <= value[kLower]) {
    return error("upper " + std::to_string(value[kUpper]) + " must be greater than lower " +
                 std::to_string(value[kLower]) + " (lifetimes are [lower, upper))");
  }
  if (position[kOffset] >= 0 && (value[kOffset] < 0 || value[kOffset] > kMaxSize)) {
    return error("offset " + std::to_string(value[kOffset]) + " is out of range [0, 2^60]");
  }
  if (!ids.insert(buffer.id).second) return error("duplicate id '" + buffer.id + "'");
  buffer.first_op = value[kLower];
  buffer.end_op = value[kUpper];
  buffer.size_bytes = value[kSize];
  csv.problem.buffers.push_back(std::move(buffer));
  offsets.push_back(value[kOffset]);
    return Status::success();
  }

  Result<MinimallocCsv> finish() {
    if (!have_header) {
      return Error{std::string(source_) + ":1: missing header (expected id,lower,upper,size[,offset])"};
    }
    if (position[kOffset] >= 0) csv.offsets = std::move(offsets);
    return std::move(csv);
  }

 private:
  std::string_view source_;
  MinimallocCsv csv;
  std::array<int, kColumnCount> position;
  std::size_t columns = 0;
  bool have_header = false;
  std::unordered_set<std::string> ids;
  std::vector<Offset> offsets;
  std::int64_t total_size = 0;
};

}  // namespace

Result<MinimallocCsv> parse_minimalloc_csv(std::string_view text, std::string_view source) {
  CsvBuilder builder(source);
  std::size_t line_number = 0;
  std::size_t cursor = 0;
  while (cursor < text.size()) {
    std::size_t newline = text.find('\n', cursor);
    if (newline == std::string_view::npos) newline = text.size();
    const std::string_view line = text.substr(cursor, newline - cursor);
    cursor = newline + 1;
    if (Status s = builder.add_line(line, ++line_number); !s) return s.error();
  }
  return builder.finish();
}

Result<MinimallocCsv> read_minimalloc_csv(const std::string& path) {
  Result<InputFile> file = InputFile::open(path, kMaxCsvFileBytes, "MiniMalloc CSV file");
  if (!file) return file.error();
  InputFile& in = file.value();
  CsvBuilder builder(path);
  for (;;) {
    Result<std::optional<std::string>> line = in.read_line(kMaxCsvLineBytes);
    if (!line) return line.error();
    if (!line.value()) break;
    if (Status s = builder.add_line(*line.value(), in.line_number()); !s) return s.error();
  }
  return builder.finish();
}

Result<std::string> format_minimalloc_csv(const AllocationProblem& problem,
                                          const std::vector<Offset>& offsets) {
  if (offsets.size() != problem.buffers.size()) {
    return Error{"cannot write " + std::to_string(offsets.size()) + " offsets for " +
                 std::to_string(problem.buffers.size()) + " buffers"};
  }
  std::ostringstream out;
  out << "id,lower,upper,size,offset\n";
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    const BufferSpec& b = problem.buffers[i];
    if (b.id.find_first_of(",\"\r\n") != std::string::npos) {
      return Error{"buffer id '" + b.id + "' contains a character CSV cannot hold"};
    }
    out << b.id << ',' << b.first_op << ',' << b.end_op << ',' << b.size_bytes << ',' << offsets[i] << '\n';
  }
  return out.str();
}

}  // namespace memplan::planner
