// The exact solver's band decomposition: a search over guillotine packings for zero-waste
// targets, one attempt per call. The driver (exact_solver.cpp) runs it in turns with the
// zero-waste search (zero_waste_search.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "memplan/planner/exact_search_internal.h"

namespace memplan::planner::exact_search {

namespace {

// Band decomposition, for zero-waste targets whose packing can be cut recursively, in time or
// in offset, into rectangles each filled by one buffer (a guillotine packing: the zero-slack
// family is built that way, and so are arenas where groups of buffers fill a band exactly).
// Complete for such packings, and not beyond them: it finding none proves nothing, so it takes
// turns with the zero-waste search (feasible_within in exact_solver.cpp). Over a set of
// buffers that fills [a, b) x height:
//  * where no buffer of the set crosses a time, the two sides are independent rectangles;
//  * a buffer spanning all of [a, b) can go to the bottom (what lies above and below it are
//    full rectangles, so it can be moved below the lower one);
//  * otherwise the top cut is in offset: the set is a stack of bands, each spanning [a, b)
//    at a constant height, and the bands can be stacked in any order. The band holding one
//    chosen buffer (the pivot, starting at a) is a subset where, at every time inside the
//    range, the sizes of its buffers that end there add up to those that start there, and
//    which some time inside the range cuts (else it would split further, by offset). The
//    band and the rest are then packed apart, one above the other.
// Bands are found by a depth-first search that adds buffers to balance the boundary with the
// fewest candidates, pruned by subset sums (bitsets in units of the sizes' common divisor):
// an imbalance no subset of the undecided buffers there can cancel is a dead end. Sets that
// could not be packed are remembered by their multiset of buffers (identical buffers alike),
// since many bands leave the same rest.
class BandSearch {
 public:
  using Key = BandKey;
  using Memo = BandMemo;

  BandSearch(const Instance& inst, Bytes capacity, Budget& budget, const std::vector<std::uint64_t>& item_key, Memo& failed)
      : inst_(inst), capacity_(capacity), budget_(budget), item_key_(item_key), failed_(failed) {
    offset_.assign(inst.items.size(), kUnplaced);
    unit_ = capacity;
    for (const auto& item : inst.items) {
      unit_ = std::gcd(unit_, item.size);
      align_ = std::max(align_, item.alignment);
    }
    // Subset sums as bitsets up to the height in units; past 2^16 bits the plain sums prune.
    use_bitsets_ = unit_ > 0 && capacity / unit_ < (Bytes{1} << 16);
  }

  Outcome run() {
    std::vector<int> all(inst_.items.size());
    std::iota(all.begin(), all.end(), 0);
    return solve(all, capacity_, 0);
  }
  const std::vector<Offset>& offsets() const { return offset_; }
  std::int64_t backtracks() const { return backtracks_; }

 private:
  Key set_key(const std::vector<int>& items, Offset base) const {
    // Order-free: sums of two hashes of each buffer's class, with the base's misalignment.
    std::uint64_t a = mix(std::uint64_t(base % align_) + 0x51ed27fULL), b = mix(a + 1);
    for (const int i : items) {
      a += mix(item_key_[std::size_t(i)]);
      b += mix(item_key_[std::size_t(i)] ^ 0xd6e8feb86659fd93ULL);
    }
    return {a, b};
  }

  // Packs `items`, which fill their time range at `height` in every section, from `base` up.
  Outcome solve(const std::vector<int>& items, Bytes height, Offset base) {
    if (!budget_.spend()) return Outcome::budget;
    const Key key = set_key(items, base);
    if (failed_.count(key)) return dead();
    const Outcome outcome = solve_uncached(items, height, base);
    if (outcome == Outcome::infeasible) {
      if (failed_.size() >= kMaxRemembered) failed_.clear();
      failed_.insert(key);
    }
    return outcome;
  }

  Outcome solve_uncached(const std::vector<int>& items, Bytes height, Offset base) {
    // Independent time ranges: split where no buffer crosses.
    std::vector<int> sorted = items;
    std::stable_sort(sorted.begin(), sorted.end(), [&](int x, int y) { return item(x).first_section < item(y).first_section; });
    int reach = item(sorted[0]).end_section;
    for (std::size_t k = 1; k < sorted.size(); ++k) {
      if (item(sorted[k]).first_section >= reach) {
        const std::vector<int> left(sorted.begin(), sorted.begin() + std::ptrdiff_t(k));
        const std::vector<int> right(sorted.begin() + std::ptrdiff_t(k), sorted.end());
        const Outcome outcome = solve(left, height, base);
        return outcome == Outcome::found ? solve(right, height, base) : outcome;
      }
      reach = std::max(reach, item(sorted[k]).end_section);
    }
    const int a = item(sorted[0]).first_section;
    const int b = reach;
    // Buffers spanning the whole range go to the bottom.
    std::vector<int> rest;
    Offset top = base;
    for (const int i : sorted) {
      if (item(i).first_section == a && item(i).end_section == b) {
        if (top % item(i).alignment != 0) return dead();
        offset_[std::size_t(i)] = top;
        top += item(i).size;
      } else {
        rest.push_back(i);
      }
    }
    if (rest.empty()) return top - base == height ? Outcome::found : dead();
    if (top != base) return solve(rest, height - (top - base), top);
    return choose_band(rest, a, b, height, base);
  }

  // The band search over `items` (no time cut, no buffer spanning [a, b)).
  struct Band {
    int a = 0, b = 0;
    std::vector<int> items;
    std::vector<std::vector<int>> starts, ends;  // per boundary t - a: positions in items
    std::vector<signed char> state;               // per position: 0 undecided, 1 in, -1 out
    std::vector<Bytes> imbalance;                 // per boundary: sizes starting - ending (in)
    Bytes edge = 0;                               // sizes starting at a - ending at b (in)
    std::vector<int> cover;                       // per boundary: chosen buffers crossing it
    std::vector<int> chosen;
  };

  Outcome choose_band(const std::vector<int>& items, int a, int b, Bytes height, Offset base) {
    Band band;
    band.a = a;
    band.b = b;
    band.items = items;
    const std::size_t boundaries = std::size_t(b - a + 1);
    band.starts.resize(boundaries);
    band.ends.resize(boundaries);
    band.imbalance.assign(boundaries, 0);
    band.cover.assign(boundaries, 0);
    band.state.assign(items.size(), 0);
    for (std::size_t k = 0; k < items.size(); ++k) {
      band.starts[std::size_t(item(items[k]).first_section - a)].push_back(int(k));
      band.ends[std::size_t(item(items[k]).end_section - a)].push_back(int(k));
    }
    // The pivot: the largest buffer (by area) starting at a; every band has some.
    int pivot = -1;
    for (const int k : band.starts[0]) {
      if (pivot < 0 || item(items[std::size_t(k)]).area > item(items[std::size_t(pivot)]).area) pivot = k;
    }
    choose(band, pivot, 1);
    return band_node(band, height, base);
  }

  void choose(Band& band, int k, int sign) {
    const auto& it = item(band.items[std::size_t(k)]);
    band.state[std::size_t(k)] = sign > 0 ? 1 : 0;
    const Bytes size = it.size * sign;
    if (it.first_section == band.a) band.edge += size; else band.imbalance[std::size_t(it.first_section - band.a)] += size;
    if (it.end_section == band.b) band.edge -= size; else band.imbalance[std::size_t(it.end_section - band.a)] -= size;
    for (int t = it.first_section + 1; t < it.end_section; ++t) band.cover[std::size_t(t - band.a)] += sign;
    if (sign > 0) band.chosen.push_back(k); else band.chosen.pop_back();
  }

  Outcome band_node(Band& band, Bytes height, Offset base) {
    if (!budget_.spend()) return Outcome::budget;
    if (dead_end(band, height)) return dead();
    // The boundary to balance: the one with the fewest candidates; the edge last.
    int need = -1;
    std::size_t fewest = std::numeric_limits<std::size_t>::max();
    for (int t = band.a + 1; t < band.b; ++t) {
      const Bytes v = band.imbalance[std::size_t(t - band.a)];
      if (v == 0) continue;
      const std::size_t count = undecided(band, v > 0 ? band.ends[std::size_t(t - band.a)] : band.starts[std::size_t(t - band.a)]);
      if (count < fewest) {
        fewest = count;
        need = t;
      }
    }
    std::vector<int> pool;
    Bytes gap = 0;
    if (need >= 0) {
      gap = band.imbalance[std::size_t(need - band.a)];
      pool = gap > 0 ? band.ends[std::size_t(need - band.a)] : band.starts[std::size_t(need - band.a)];
    } else if (band.edge != 0) {
      gap = band.edge;
      pool = gap > 0 ? band.ends.back() : band.starts.front();
    } else {
      // Balanced: a band. Pack it and the rest; if either fails, grow it by another buffer
      // starting at a (a larger band holding this one).
      if (band.chosen.size() < band.items.size()) {
        std::vector<int> in, out;
        Bytes y = 0;
        for (std::size_t k = 0; k < band.items.size(); ++k) {
          (band.state[k] == 1 ? in : out).push_back(band.items[k]);
          if (band.state[k] == 1 && item(band.items[k]).first_section == band.a) y += item(band.items[k]).size;
        }
        Outcome outcome = solve(in, y, base);
        if (outcome == Outcome::found) outcome = solve(out, height - y, base + y);
        if (outcome != Outcome::infeasible) return outcome;
      }
      pool = band.starts.front();
    }
    const Bytes want = gap < 0 ? -gap : gap;
    std::erase_if(pool, [&](int k) { return band.state[std::size_t(k)] != 0; });
    // Exact fits first, then larger buffers: fewer steps to balance.
    std::stable_sort(pool.begin(), pool.end(), [&](int x, int y) {
      const Bytes sx = item(band.items[std::size_t(x)]).size, sy = item(band.items[std::size_t(y)]).size;
      if ((sx == want) != (sy == want)) return sx == want;
      return sx > sy;
    });
    // Each candidate in turn, the ones before it left out (so every band is met once);
    // identical buffers are tried once.
    std::vector<int> excluded;
    Outcome result = Outcome::infeasible;
    std::vector<std::uint64_t> tried;
    for (const int k : pool) {
      const std::uint64_t cls = item_key_[std::size_t(band.items[std::size_t(k)])];
      if (std::find(tried.begin(), tried.end(), cls) == tried.end()) {
        tried.push_back(cls);
        choose(band, k, 1);
        const Outcome outcome = band_node(band, height, base);
        choose(band, k, -1);
        if (outcome != Outcome::infeasible) {
          result = outcome;
          break;
        }
      }
      band.state[std::size_t(k)] = -1;
      excluded.push_back(k);
    }
    for (const int k : excluded) band.state[std::size_t(k)] = 0;
    if (result == Outcome::infeasible) ++backtracks_;
    return result;
  }

  std::size_t undecided(const Band& band, const std::vector<int>& list) const {
    std::size_t n = 0;
    for (const int k : list) n += band.state[std::size_t(k)] == 0 ? 1 : 0;
    return n;
  }

  // No band can come of this choice: every time inside the range is crossed by a chosen
  // buffer (a band has a time cut), or some boundary's imbalance cannot be cancelled.
  bool dead_end(const Band& band, Bytes height) {
    bool cut = false;
    for (int t = band.a + 1; t < band.b && !cut; ++t) cut = band.cover[std::size_t(t - band.a)] == 0;
    if (!cut) return true;
    for (int t = band.a + 1; t < band.b; ++t) {
      const Bytes v = band.imbalance[std::size_t(t - band.a)];
      if (v != 0 && !cancellable(band, v, band.ends[std::size_t(t - band.a)], band.starts[std::size_t(t - band.a)], height)) return true;
    }
    return band.edge != 0 && !cancellable(band, band.edge, band.ends.back(), band.starts.front(), height);
  }

  // Can undecided buffers from `ends` (sum E) and `starts` (sum S) give E - S == v?
  bool cancellable(const Band& band, Bytes v, const std::vector<int>& ends, const std::vector<int>& starts, Bytes height) {
    Bytes end_sum = 0, start_sum = 0;
    for (const int k : ends) end_sum += band.state[std::size_t(k)] == 0 ? item(band.items[std::size_t(k)]).size : 0;
    for (const int k : starts) start_sum += band.state[std::size_t(k)] == 0 ? item(band.items[std::size_t(k)]).size : 0;
    if (v > 0 ? end_sum < v : start_sum < -v) return false;
    if (!use_bitsets_) return true;
    const std::size_t bits = std::size_t(height / unit_) + 1;
    subset_sums(band, ends, bits, end_bits_);
    subset_sums(band, starts, bits, start_bits_);
    // v > 0: some e in E with e - v in S; v < 0: some s in S with s + v in E.
    const auto& high = v > 0 ? end_bits_ : start_bits_;
    const auto& low = v > 0 ? start_bits_ : end_bits_;
    const std::size_t shift = std::size_t((v > 0 ? v : -v) / unit_);
    const std::size_t words = (bits + 63) / 64;
    for (std::size_t w = 0; w < words; ++w) {
      // Bits [64w, 64w + 64) of high >> shift.
      const std::size_t from = w * 64 + shift;
      const std::size_t q = from / 64, r = from % 64;
      if (q >= words) break;
      std::uint64_t x = high[q] >> r;
      if (r != 0 && q + 1 < words) x |= high[q + 1] << (64 - r);
      if (x & low[w]) return true;
    }
    return false;
  }

  void subset_sums(const Band& band, const std::vector<int>& list, std::size_t bits, std::vector<std::uint64_t>& out) const {
    const std::size_t words = (bits + 63) / 64;
    out.assign(words, 0);
    out[0] = 1;
    for (const int k : list) {
      if (band.state[std::size_t(k)] != 0) continue;
      const std::size_t shift = std::size_t(item(band.items[std::size_t(k)]).size / unit_);
      const std::size_t q = shift / 64, r = shift % 64;
      for (std::size_t w = words; w-- > q;) {
        std::uint64_t x = out[w - q] << r;
        if (r != 0 && w - q >= 1) x |= out[w - q - 1] >> (64 - r);
        out[w] |= x;
      }
    }
    if (bits % 64 != 0) out[words - 1] &= (std::uint64_t{1} << (bits % 64)) - 1;
  }

  const Instance::Item& item(int i) const { return inst_.items[std::size_t(i)]; }
  Outcome dead() {
    ++backtracks_;
    return Outcome::infeasible;
  }

  static constexpr std::size_t kMaxRemembered = std::size_t{1} << 20;
  const Instance& inst_;
  const Bytes capacity_;
  Budget& budget_;
  const std::vector<std::uint64_t>& item_key_;
  Bytes unit_ = 1;
  Bytes align_ = 1;
  bool use_bitsets_ = false;
  std::vector<Offset> offset_;
  std::vector<std::uint64_t> end_bits_, start_bits_;
  Memo& failed_;
  std::int64_t backtracks_ = 0;
};

}  // namespace

Outcome band_search(const Instance& inst, Bytes capacity, Budget& budget, const std::vector<std::uint64_t>& item_key,
                    BandMemo& failed, std::vector<Offset>& item_offsets, std::int64_t& backtracks) {
  BandSearch bands(inst, capacity, budget, item_key, failed);
  return run_attempt(bands, item_offsets, backtracks);
}

}  // namespace memplan::planner::exact_search
