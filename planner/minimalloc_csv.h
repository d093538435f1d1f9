// Reads and writes MiniMalloc's CSV format (google/minimalloc): a header naming the columns
// `id,lower,upper,size` (any order; an `offset` column is read back too), one buffer per
// line, lifetime [lower, upper) half-open. Input is untrusted: every defect is an Error
// with the line number, never an exception or a crash. No alignment column: alignment 1.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memplan/common/result.h"
#include "memplan/planner/allocation_problem.h"

namespace memplan::planner {

struct MinimallocCsv {
  AllocationProblem problem;             // no capacity: the caller sets it
  std::optional<std::vector<Offset>> offsets;  // present iff the file had an `offset` column
};

// Lines longer than this are rejected (a real row is under 100 characters).
inline constexpr std::size_t kMaxCsvLineBytes = 4096;
// Files larger than this are refused before reading (about ten million rows).
inline constexpr Bytes kMaxCsvFileBytes = Bytes{1} << 30;

// `source` names the input in messages ("FILE:LINE: ...").
Result<MinimallocCsv> parse_minimalloc_csv(std::string_view text, std::string_view source);
// Reads a regular file only (common/input_file.h), line by line: a bad line stops the reading.
Result<MinimallocCsv> read_minimalloc_csv(const std::string& path);

// The same columns plus `offset`, rows in problem order. Ids with ',', '"' or line breaks
// cannot be written and give an Error.
Result<std::string> format_minimalloc_csv(const AllocationProblem& problem,
                                          const std::vector<Offset>& offsets);

}  // namespace memplan::planner
