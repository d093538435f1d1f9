#include "memplan/planner/problem_parts.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>

#include "memplan/common/check.h"

namespace memplan::planner {

namespace {

// Range maximum over a fixed array, O(log n) per query, 2n values.
class RangeMaximum {
 public:
  explicit RangeMaximum(std::vector<std::int64_t> values) : n_(values.size()), tree_(2 * values.size()) {
    std::copy(values.begin(), values.end(), tree_.begin() + std::ptrdiff_t(n_));
    for (std::size_t i = n_; i-- > 1;) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }
  // Max over [a, b), a < b.
  std::int64_t max(std::size_t a, std::size_t b) const {
    std::int64_t out = std::numeric_limits<std::int64_t>::min();
    for (a += n_, b += n_; a < b; a /= 2, b /= 2) {
      if (a & 1) out = std::max(out, tree_[a++]);
      if (b & 1) out = std::max(out, tree_[--b]);
    }
    return out;
  }

 private:
  std::size_t n_;
  std::vector<std::int64_t> tree_;
};

}  // namespace

ProblemParts split_problem(const AllocationProblem& problem) {
  ProblemParts parts;
  // Buffers by first_op, the longest first among equal starts: a piece is then always a run of
  // this order, and the buffers spanning a piece (its floor) lead its run.
  std::vector<std::size_t> order;
  for (std::size_t b = 0; b < problem.buffers.size(); ++b) {
    MEMPLAN_CHECK(!problem.buffers[b].fixed_offset, "split_problem: buffer " << b << " has a fixed offset");
    if (footprint_bytes(problem.buffers[b]) > 0) order.push_back(b);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const BufferSpec &x = problem.buffers[a], &y = problem.buffers[b];
    if (x.first_op != y.first_op) return x.first_op < y.first_op;
    if (x.end_op != y.end_op) return x.end_op > y.end_op;
    return a < b;
  });
  if (order.empty()) return parts;
  std::vector<std::int64_t> ends, alignments;
  for (const std::size_t b : order) {
    ends.push_back(problem.buffers[b].end_op);
    alignments.push_back(problem.buffers[b].alignment);
  }
  const RangeMaximum max_end(std::move(ends)), max_alignment(std::move(alignments));
  struct Piece {
    std::size_t begin, end;  // a run of `order`
    Bytes base;
  };
  // A work list, not recursion: nested lifetimes peel one floor per level, as deep as the
  // problem has buffers; each level costs O(log n) plus the buffers it peels or cuts.
  std::vector<Piece> work{{0, order.size(), 0}};
  while (!work.empty()) {
    Piece piece = work.back();
    work.pop_back();
    const Piece whole = piece;
    const std::size_t floor_before = parts.floor.size();
    bool peeled = true;
    while (peeled && piece.begin < piece.end) {
      peeled = false;
      const TimePoint lo = problem.buffers[order[piece.begin]].first_op;
      const TimePoint hi = max_end.max(piece.begin, piece.end);
      const Bytes alignment = max_alignment.max(piece.begin, piece.end);
      while (piece.begin < piece.end) {
        const BufferSpec& buffer = problem.buffers[order[piece.begin]];
        if (buffer.first_op != lo || buffer.end_op != hi || footprint_bytes(buffer) % alignment != 0) break;
        parts.floor.emplace_back(order[piece.begin], piece.base);
        piece.base += footprint_bytes(buffer);
        ++piece.begin;
        peeled = true;
      }
    }
    if (piece.begin == piece.end) continue;
    // Cut where no buffer crosses: a buffer starting at or after every earlier one's end.
    std::vector<Piece> cut;
    TimePoint reach = problem.buffers[order[piece.begin]].end_op;
    std::size_t from = piece.begin;
    for (std::size_t k = piece.begin + 1; k < piece.end; ++k) {
      const BufferSpec& buffer = problem.buffers[order[k]];
      if (buffer.first_op >= reach) {
        cut.push_back({from, k, piece.base});
        from = k;
      }
      reach = std::max(reach, buffer.end_op);
    }
    if (cut.empty()) {
      // A floor that cuts nothing in time is left in the leaf: stacked apart it only removes
      // freedom from the search (zero-slack packings often hold such buffers mid-height).
      parts.floor.resize(floor_before);
      piece = whole;
      parts.leaves.push_back({std::vector<std::size_t>(order.begin() + std::ptrdiff_t(piece.begin),
                                                       order.begin() + std::ptrdiff_t(piece.end)),
                              piece.base});
      continue;
    }
    cut.push_back({from, piece.end, piece.base});
    // Pushed in reverse so the leaves come out in time order.
    for (auto it = cut.rbegin(); it != cut.rend(); ++it) work.push_back(*it);
  }
  return parts;
}

AllocationProblem leaf_problem(const AllocationProblem& problem, const ProblemLeaf& leaf) {
  AllocationProblem out;
  out.buffers.reserve(leaf.buffers.size());
  for (const std::size_t b : leaf.buffers) out.buffers.push_back(problem.buffers[b]);
  return out;
}

std::vector<std::int64_t> leaf_shape(const AllocationProblem& problem, const ProblemLeaf& leaf) {
  std::vector<std::int64_t> shape;
  shape.reserve(4 * leaf.buffers.size());
  const TimePoint origin = leaf.buffers.empty() ? 0 : problem.buffers[leaf.buffers.front()].first_op;
  for (const std::size_t b : leaf.buffers) {
    const BufferSpec& buffer = problem.buffers[b];
    shape.push_back(buffer.size_bytes);
    shape.push_back(buffer.alignment);
    shape.push_back(buffer.first_op - origin);
    shape.push_back(buffer.end_op - origin);
  }
  return shape;
}

std::vector<Offset> assemble_parts(const AllocationProblem& problem, const ProblemParts& parts,
                                   const std::vector<const std::vector<Offset>*>& leaf_offsets) {
  MEMPLAN_CHECK(leaf_offsets.size() == parts.leaves.size(), "assemble_parts: one packing per leaf");
  std::vector<Offset> offsets(problem.buffers.size(), 0);
  for (const auto& [b, offset] : parts.floor) offsets[b] = offset;
  for (std::size_t l = 0; l < parts.leaves.size(); ++l) {
    const ProblemLeaf& leaf = parts.leaves[l];
    const std::vector<Offset>& own = *leaf_offsets[l];
    MEMPLAN_CHECK(own.size() == leaf.buffers.size(), "assemble_parts: leaf " << l << " has no packing");
    for (std::size_t k = 0; k < leaf.buffers.size(); ++k) offsets[leaf.buffers[k]] = leaf.base + own[k];
  }
  return offsets;
}

LeafShapes group_leaves_by_shape(const AllocationProblem& problem, const ProblemParts& parts) {
  LeafShapes shapes;
  std::map<std::vector<std::int64_t>, std::size_t> seen;
  for (std::size_t l = 0; l < parts.leaves.size(); ++l) {
    auto [it, added] = seen.emplace(leaf_shape(problem, parts.leaves[l]), shapes.first.size());
    if (added) shapes.first.push_back(l);
    shapes.shape_of.push_back(it->second);
  }
  return shapes;
}

}  // namespace memplan::planner
