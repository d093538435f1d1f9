#include "memplan/planner/order_search.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "memplan/common/check.h"
#include "memplan/planner/memory_plan.h"
#include "memplan/planner/schedule.h"

namespace memplan::planner {

using graph::Graph;
using graph::Op;

namespace {

// The units the search moves: one op, or a fused pair (keep_next_adjacent) kept together; flat,
// as a large step has a hundred thousand of them.
struct Units {
  std::vector<int> flat;    // every op, unit after unit (the start order)
  std::vector<int> begin;   // unit u's ops: flat[begin[u], begin[u + 1])
  std::vector<int> of_op;   // op -> unit
  std::size_t size() const { return begin.size() - 1; }
  std::span<const int> ops(int u) const {
    const auto b = static_cast<std::size_t>(begin[static_cast<std::size_t>(u)]);
    const auto e = static_cast<std::size_t>(begin[static_cast<std::size_t>(u) + 1]);
    return std::span<const int>(flat).subspan(b, e - b);
  }
};

Units units_of(const Graph& graph, const Schedule& start) {
  Units units;
  units.flat = start;
  units.of_op.assign(start.size(), -1);
  for (std::size_t pos = 0; pos < start.size(); ++pos) {
    if (pos == 0 || !keep_next_adjacent(graph, start[pos - 1], start[pos])) units.begin.push_back(static_cast<int>(pos));
    units.of_op[static_cast<std::size_t>(start[pos])] = static_cast<int>(units.begin.size()) - 1;
  }
  units.begin.push_back(static_cast<int>(start.size()));
  return units;
}

// Per unit, the units that must run before it and after it (module comment in the header), as
// adjacency lists in one array each.
struct Constraints {
  std::vector<int> before, before_begin;  // unit u: before[before_begin[u], before_begin[u + 1])
  std::vector<int> after, after_begin;
  std::span<const int> runs_before(int u) const { return slice(before, before_begin, u); }
  std::span<const int> runs_after(int u) const { return slice(after, after_begin, u); }
  static std::span<const int> slice(const std::vector<int>& v, const std::vector<int>& begin, int u) {
    const auto b = static_cast<std::size_t>(begin[static_cast<std::size_t>(u)]);
    return std::span<const int>(v).subspan(b, static_cast<std::size_t>(begin[static_cast<std::size_t>(u) + 1]) - b);
  }
};

Constraints constraints_of(const Graph& graph, const Schedule& start, const Units& units) {
  std::vector<std::pair<int, int>> edges;  // (first unit, then unit), in the order found
  auto order = [&](int first_op, int then_op) {
    const int a = units.of_op[static_cast<std::size_t>(first_op)];
    const int b = units.of_op[static_cast<std::size_t>(then_op)];
    if (a != b) edges.emplace_back(a, b);
  };
  const auto n_tensors = static_cast<std::size_t>(graph.num_tensors());
  std::vector<int> last_writer(n_tensors, -1);
  std::vector<std::vector<int>> readers_since(n_tensors);  // readers since the last write, per root
  std::vector<int> gates;
  int last_collective = -1;
  for (const int i : start) {
    const Op& op = graph.ops()[static_cast<std::size_t>(i)];
    const graph::OpInfo& info = graph::op_info(op.kind);
    auto read = [&](TensorId t) {
      // A view's own producer (a pure view) is not its storage's writer, but must still run first.
      if (const int p = graph.producer(t); p >= 0) order(p, i);
      const auto r = static_cast<std::size_t>(graph.storage_root(t));
      if (last_writer[r] >= 0) order(last_writer[r], i);
      readers_since[r].push_back(i);
    };
    auto write = [&](TensorId t) {
      const auto r = static_cast<std::size_t>(graph.storage_root(t));
      if (last_writer[r] >= 0) order(last_writer[r], i);
      for (const int reader : readers_since[r]) order(reader, i);
      readers_since[r].clear();
      last_writer[r] = i;
    };
    for (const TensorId t : op.inputs) read(t);
    for (const TensorId t : op.outputs) {
      // A view aliases storage an earlier op wrote: a pure view only reads it; any other op with
      // a view output (an in-place all-reduce) writes it.
      if (graph.tensor(t).is_view() && info.pure_view) {
        read(t);
      } else {
        write(t);
      }
    }
    for (const TensorId t : op.updates) write(t);
    if (info.gates_updates) gates.push_back(i);
    if (!op.updates.empty() && op.phase == graph::Phase::optimizer) {
      for (const int g : gates) order(g, i);
    }
    if (info.communicates) {
      if (last_collective >= 0) order(last_collective, i);
      last_collective = i;
    }
  }
  // Repeated pairs (an op reading a tensor twice) are kept: they bound a move the same way.
  const std::size_t n_units = units.size();
  Constraints c;
  c.after_begin.assign(n_units + 1, 0);
  c.before_begin.assign(n_units + 1, 0);
  for (const auto& [a, b] : edges) {
    ++c.after_begin[static_cast<std::size_t>(a) + 1];
    ++c.before_begin[static_cast<std::size_t>(b) + 1];
  }
  for (std::size_t u = 0; u < n_units; ++u) {
    c.after_begin[u + 1] += c.after_begin[u];
    c.before_begin[u + 1] += c.before_begin[u];
  }
  c.after.resize(edges.size());
  c.before.resize(edges.size());
  std::vector<int> after_next(c.after_begin.begin(), c.after_begin.end() - 1);
  std::vector<int> before_next(c.before_begin.begin(), c.before_begin.end() - 1);
  for (const auto& [a, b] : edges) {
    c.after[static_cast<std::size_t>(after_next[static_cast<std::size_t>(a)]++)] = b;
    c.before[static_cast<std::size_t>(before_next[static_cast<std::size_t>(b)]++)] = a;
  }
  return c;
}

// The transient profile of an order: its peak of live footprints, the first position (in ops)
// at the peak and how many positions reach it.
struct Profile {
  Bytes peak = 0;
  OpIndex peak_position = 0;
  std::int64_t positions_at_peak = 0;

  bool better_than(const Profile& other) const {
    return peak < other.peak || (peak == other.peak && positions_at_peak < other.positions_at_peak);
  }
};

// Profiles of orders of one graph, many times over: compute_lifetimes' rules (storage roots,
// in-place sharing, inputs live from the first op, step results to the last) over each op's
// accesses gathered once, in scratch arrays reused between orders. A search evaluates an order
// per candidate move; this keeps each one a few linear passes (tests check it against the plan's
// lower bound).
class ProfileEvaluator {
 public:
  ProfileEvaluator(const Graph& graph, const OrderSearchOptions& options) {
    const auto n_tensors = static_cast<std::size_t>(graph.num_tensors());
    root_.resize(n_tensors);
    for (TensorId t = 0; t < graph.num_tensors(); ++t) root_[static_cast<std::size_t>(t)] = graph.storage_root(t);
    footprint_.assign(n_tensors, 0);
    size_.assign(n_tensors, 0);
    kind_.assign(n_tensors, RootKind::transient);
    result_.assign(n_tensors, false);
    for (TensorId t = 0; t < graph.num_tensors(); ++t) {
      const graph::TensorDesc& desc = graph.tensor(t);
      if (desc.is_view()) continue;
      const auto r = static_cast<std::size_t>(t);
      size_[r] = desc.size_bytes();
      footprint_[r] = buffer_footprint(size_[r], options.guard_bytes);
      if (desc.external || desc.host) kind_[r] = RootKind::elsewhere;
      else if (graph::is_persistent(desc.role)) kind_[r] = RootKind::persistent;
      else if (desc.role == graph::Role::input) kind_[r] = RootKind::input;
    }
    for (TensorId t : graph.retained) result_[static_cast<std::size_t>(graph.storage_root(t))] = true;
    for (TensorId t : {graph.loss, graph.output}) {
      if (t != kNoTensor) result_[static_cast<std::size_t>(graph.storage_root(t))] = true;
    }
    const auto n_ops = static_cast<std::size_t>(graph.num_ops());
    roots_begin_.reserve(n_ops + 1);
    in_place_begin_.reserve(n_ops + 1);
    output_.assign(n_ops, kNoTensor);
    for (std::size_t i = 0; i < n_ops; ++i) {
      const Op& op = graph.ops()[i];
      roots_begin_.push_back(static_cast<int>(roots_.size()));
      in_place_begin_.push_back(static_cast<int>(in_place_.size()));
      for (const auto* list : {&op.inputs, &op.outputs, &op.updates}) {
        for (TensorId t : *list) roots_.push_back(graph.storage_root(t));
      }
      if (options.in_place && op.outputs.size() == 1 && !graph.tensor(op.outputs[0]).is_view()) {
        output_[i] = op.outputs[0];
        for (int k = 0; k < static_cast<int>(op.inputs.size()); ++k) {
          if (graph::op_info(op.kind).may_run_in_place(k)) in_place_.push_back(graph.storage_root(op.inputs[static_cast<std::size_t>(k)]));
        }
      }
    }
    roots_begin_.push_back(static_cast<int>(roots_.size()));
    in_place_begin_.push_back(static_cast<int>(in_place_.size()));
    last_use_.resize(n_tensors);
    parent_.resize(n_tensors);
    merged_last_.resize(n_tensors);
    merged_result_.resize(n_tensors);
    first_.resize(n_tensors);
    last_.resize(n_tensors);
  }

  Profile evaluate(const Schedule& schedule) {
    const auto n = static_cast<OpIndex>(schedule.size());
    const OpIndex end = std::max<OpIndex>(0, n - 1);
    std::fill(last_use_.begin(), last_use_.end(), -1);
    for (OpIndex pos = 0; pos < n; ++pos) {
      for (const TensorId r : roots_at(schedule, pos)) last_use_[static_cast<std::size_t>(r)] = pos;
    }
    std::iota(parent_.begin(), parent_.end(), TensorId{0});
    merged_last_ = last_use_;
    merged_result_ = result_;
    for (OpIndex pos = 0; pos < n; ++pos) {
      const auto op = static_cast<std::size_t>(schedule[static_cast<std::size_t>(pos)]);
      const TensorId out = output_[op];
      for (const TensorId in : slice(in_place_, in_place_begin_, op)) {
        const auto m = static_cast<std::size_t>(find(in));
        if (kind_[m] == RootKind::persistent || merged_result_[m] || merged_last_[m] != pos) continue;
        if (size_[m] != size_[static_cast<std::size_t>(out)]) continue;
        parent_[static_cast<std::size_t>(out)] = static_cast<TensorId>(m);
        merged_last_[m] = last_use_[static_cast<std::size_t>(out)];
        merged_result_[m] = result_[static_cast<std::size_t>(out)];
        break;
      }
    }
    std::fill(first_.begin(), first_.end(), -1);
    buffers_.clear();
    for (OpIndex pos = 0; pos < n; ++pos) {
      for (const TensorId r : roots_at(schedule, pos)) {
        if (kind_[static_cast<std::size_t>(r)] == RootKind::elsewhere) continue;
        const auto m = static_cast<std::size_t>(find(r));
        if (kind_[m] == RootKind::persistent) continue;
        if (first_[m] < 0) {
          first_[m] = kind_[m] == RootKind::input ? 0 : pos;
          last_[m] = pos;
          buffers_.push_back(static_cast<TensorId>(m));
        } else {
          last_[m] = pos;
        }
      }
    }
    end_ = end;
    change_.assign(schedule.size() + 1, 0);
    for (const TensorId b : buffers_) {
      change_[static_cast<std::size_t>(first(b))] += footprint(b);
      change_[static_cast<std::size_t>(last(b)) + 1] -= footprint(b);
    }
    Profile p;
    Bytes live = 0;
    for (std::size_t pos = 0; pos < schedule.size(); ++pos) {
      live += change_[pos];
      if (live > p.peak) {
        p.peak = live;
        p.peak_position = static_cast<OpIndex>(pos);
        p.positions_at_peak = 1;
      } else if (live == p.peak && live > 0) {
        ++p.positions_at_peak;
      }
    }
    return p;
  }

  // The buffers of the order evaluate() saw last: each named by its storage root (merged by
  // in-place sharing), none persistent; first and last positions as compute_lifetimes gives them.
  const std::vector<TensorId>& buffers() const { return buffers_; }
  OpIndex first(TensorId b) const { return first_[static_cast<std::size_t>(b)]; }
  OpIndex last(TensorId b) const { return step_result(b) ? end_ : last_[static_cast<std::size_t>(b)]; }
  bool step_result(TensorId b) const { return result_[static_cast<std::size_t>(b)] || merged_result_[static_cast<std::size_t>(b)]; }
  bool input(TensorId b) const { return kind_[static_cast<std::size_t>(b)] == RootKind::input; }
  Bytes footprint(TensorId b) const { return footprint_[static_cast<std::size_t>(b)]; }
  Bytes size(TensorId b) const { return size_[static_cast<std::size_t>(b)]; }
  // The buffer tensor `t` lives in, or kNoTensor where it is persistent or not in the arena.
  TensorId buffer_of(TensorId t) {
    const TensorId r = root_[static_cast<std::size_t>(t)];
    if (kind_[static_cast<std::size_t>(r)] == RootKind::elsewhere) return kNoTensor;
    const TensorId m = find(r);
    return kind_[static_cast<std::size_t>(m)] == RootKind::persistent ? kNoTensor : m;
  }

 private:
  enum class RootKind : std::uint8_t { transient, input, persistent, elsewhere };  // elsewhere: external or host
  static std::span<const TensorId> slice(const std::vector<TensorId>& v, const std::vector<int>& begin, std::size_t op) {
    const auto b = static_cast<std::size_t>(begin[op]);
    return std::span<const TensorId>(v).subspan(b, static_cast<std::size_t>(begin[op + 1]) - b);
  }
  std::span<const TensorId> roots_at(const Schedule& schedule, OpIndex pos) const {
    return slice(roots_, roots_begin_, static_cast<std::size_t>(schedule[static_cast<std::size_t>(pos)]));
  }
  TensorId find(TensorId t) {
    while (parent_[static_cast<std::size_t>(t)] != t) {
      parent_[static_cast<std::size_t>(t)] = parent_[static_cast<std::size_t>(parent_[static_cast<std::size_t>(t)])];
      t = parent_[static_cast<std::size_t>(t)];
    }
    return t;
  }

  std::vector<TensorId> root_;           // per tensor: its storage root
  std::vector<Bytes> footprint_, size_;  // per root
  std::vector<RootKind> kind_;
  std::vector<bool> result_;
  // Per op, flat: the storage roots of its inputs, outputs and updates; its one output where it
  // may share an input's storage, and the storage roots of the inputs it may write over.
  std::vector<TensorId> roots_, in_place_;
  std::vector<int> roots_begin_, in_place_begin_;
  std::vector<TensorId> output_;
  // Scratch, per tensor.
  std::vector<OpIndex> last_use_, merged_last_, first_, last_;
  std::vector<TensorId> parent_;
  std::vector<bool> merged_result_;
  std::vector<TensorId> buffers_;
  std::vector<Bytes> change_;
  OpIndex end_ = 0;
};

// One candidate move: unit `unit` taken out and put back so that it ends at index `to` of the
// unit order.
struct Move {
  int unit = 0;
  int to = 0;
  Bytes change = 0;  // of the bytes live at the peak op, as candidates() counts them (0: not counted)
};

class OrderSearch {
 public:
  // `evaluator`: the graph's, `start_profile`: start's (evaluated once, by whoever chose it).
  OrderSearch(const Graph& graph, const Schedule& start, const OrderSearchOptions& options, ProfileEvaluator evaluator,
              const Profile& start_profile)
      : graph_(graph),
        options_(options),
        units_(units_of(graph, start)),
        constraints_(constraints_of(graph, start, units_)),
        evaluator_(std::move(evaluator)),
        start_profile_(start_profile) {
    order_.resize(units_.size());
    std::iota(order_.begin(), order_.end(), 0);
    where_ = order_;
  }

  OrderSearchResult run() {
    // Each evaluation is a pass over the step: the default budget bounds their total work, so a
    // step of a hundred thousand ops (a large model's least-memory checkpoint schedule) gets tens
    // of evaluations where GPT-2 gets thousands.
    const std::int64_t ops = std::max<std::int64_t>(1, static_cast<std::int64_t>(units_.of_op.size()));
    const std::int64_t budget = options_.max_evaluations > 0
                                    ? options_.max_evaluations
                                    : std::clamp(kOrderSearchWork / ops, std::int64_t{8}, kDefaultOrderEvaluations);
    OrderSearchResult result;
    Profile best = start_profile_;
    result.start_peak = best.peak;
    std::int64_t evaluations = 0;
    while (evaluations < budget) {
      bool moved = false;
      for (const Move& m : candidates(best)) {
        if (evaluations >= budget) break;
        std::vector<int> trial = moved_order(m);
        Profile p = evaluator_.evaluate(expand(trial));
        evaluator_holds_best_ = false;
        ++evaluations;
        if (p.better_than(best)) {
          order_ = std::move(trial);
          for (std::size_t k = 0; k < order_.size(); ++k) where_[static_cast<std::size_t>(order_[k])] = static_cast<int>(k);
          best = std::move(p);
          evaluator_holds_best_ = true;  // the trial just evaluated
          ++result.moves;
          moved = true;
          break;
        }
      }
      if (!moved) break;
    }
    result.schedule = expand(order_);
    result.peak = best.peak;
    result.evaluations = evaluations;
    return result;
  }

 private:
  Schedule expand(const std::vector<int>& order) const {
    Schedule s;
    s.reserve(units_.of_op.size());
    for (const int u : order) {
      for (const int op : units_.ops(u)) s.push_back(op);
    }
    return s;
  }

  // The least and the greatest index unit `u` may end at when moved (index arithmetic in the
  // order as it is: moving later shifts the units between left by one, so the bound is the first
  // successor's index minus one; moving earlier, the last predecessor's plus one).
  int earliest(int u) const {
    int e = 0;
    for (const int p : constraints_.runs_before(u)) e = std::max(e, where_[static_cast<std::size_t>(p)] + 1);
    return e;
  }
  int latest(int u) const {
    int l = static_cast<int>(order_.size()) - 1;
    for (const int s : constraints_.runs_after(u)) l = std::min(l, where_[static_cast<std::size_t>(s)] - 1);
    return l;
  }

  std::vector<int> moved_order(const Move& m) const {
    std::vector<int> trial = order_;
    const int from = where_[static_cast<std::size_t>(m.unit)];
    if (m.to > from) {
      std::rotate(trial.begin() + from, trial.begin() + from + 1, trial.begin() + m.to + 1);
    } else {
      std::rotate(trial.begin() + m.to, trial.begin() + from, trial.begin() + from + 1);
    }
    return trial;
  }

  // Moves that can take a buffer live at the peak off it: its writer run after the peak op, or
  // its last reader before it, each both just across the peak and as far as it may go. Only
  // moves that lower the bytes live at the peak op (counted from which side of it each buffer's
  // touching units stand, before the full evaluation) are returned, the most lowering first; in a
  // tie, in the order found (larger buffers first).
  std::vector<Move> candidates(const Profile& profile) {
    const Schedule schedule = expand(order_);
    if (!evaluator_holds_best_) evaluator_.evaluate(schedule);  // its buffers, as this order has them
    evaluator_holds_best_ = true;
    const OpIndex p = profile.peak_position;
    const int peak_unit = units_.of_op[static_cast<std::size_t>(schedule[static_cast<std::size_t>(p)])];
    const int peak_index = where_[static_cast<std::size_t>(peak_unit)];
    auto unit_at = [&](OpIndex pos) { return units_.of_op[static_cast<std::size_t>(schedule[static_cast<std::size_t>(pos)])]; };
    // Per buffer: how many accesses to it run at or before the peak unit, and at or after it (an
    // input counts as written before the first op; a step result as read after the last).
    const auto n_tensors = static_cast<std::size_t>(graph_.num_tensors());
    std::vector<int> at_or_before(n_tensors, 0), at_or_after(n_tensors, 0);
    for (const TensorId b : evaluator_.buffers()) {
      if (evaluator_.input(b)) ++at_or_before[static_cast<std::size_t>(b)];
      if (evaluator_.step_result(b)) ++at_or_after[static_cast<std::size_t>(b)];
    }
    auto for_each_access = [&](int op_index, auto&& fn) {
      const Op& op = graph_.ops()[static_cast<std::size_t>(op_index)];
      for (const auto* list : {&op.inputs, &op.outputs, &op.updates}) {
        for (const TensorId t : *list) {
          if (const TensorId b = evaluator_.buffer_of(t); b != kNoTensor) fn(b);
        }
      }
    };
    for (std::size_t pos = 0; pos < schedule.size(); ++pos) {
      const int index = where_[static_cast<std::size_t>(units_.of_op[static_cast<std::size_t>(schedule[pos])])];
      for_each_access(schedule[pos], [&](TensorId b) {
        if (index <= peak_index) ++at_or_before[static_cast<std::size_t>(b)];
        if (index >= peak_index) ++at_or_after[static_cast<std::size_t>(b)];
      });
    }
    // The change of the bytes live at the peak op if `unit` (not the peak unit) runs on the
    // other side of it.
    std::vector<std::pair<TensorId, int>> accesses;  // scratch: (buffer, accesses) of one unit
    auto change_at_peak = [&](int unit) {
      accesses.clear();
      for (const int op_index : units_.ops(unit)) {
        for_each_access(op_index, [&](TensorId b) { accesses.emplace_back(b, 1); });
      }
      std::sort(accesses.begin(), accesses.end());
      const bool before_now = where_[static_cast<std::size_t>(unit)] < peak_index;
      Bytes change = 0;
      for (std::size_t k = 0; k < accesses.size();) {
        const TensorId b = accesses[k].first;
        int count = 0;
        for (; k < accesses.size() && accesses[k].first == b; ++k) ++count;
        const auto bi = static_cast<std::size_t>(b);
        const bool live_now = at_or_before[bi] > 0 && at_or_after[bi] > 0;
        const int before = at_or_before[bi] + (before_now ? -count : count);
        const int after = at_or_after[bi] + (before_now ? count : -count);
        const bool live_then = before > 0 && after > 0;
        change += (live_then ? evaluator_.footprint(b) : 0) - (live_now ? evaluator_.footprint(b) : 0);
      }
      return change;
    };

    std::vector<TensorId> live;
    for (const TensorId b : evaluator_.buffers()) {
      if (evaluator_.first(b) <= p && p <= evaluator_.last(b)) live.push_back(b);
    }
    std::stable_sort(live.begin(), live.end(), [&](TensorId a, TensorId b) {
      return evaluator_.size(a) != evaluator_.size(b) ? evaluator_.size(a) > evaluator_.size(b)
                                                      : evaluator_.first(a) < evaluator_.first(b);
    });
    std::vector<Move> moves;
    std::vector<Bytes> change_of_unit(order_.size(), 1);  // 1: not computed (a change is a multiple of 256)
    auto add = [&](int unit, int to) {
      if (to == where_[static_cast<std::size_t>(unit)]) return;  // where it is: nothing changes
      for (const Move& m : moves) {
        if (m.unit == unit && m.to == to) return;
      }
      Bytes change = 0;  // the peak unit itself moves the peak: left to the full evaluation
      if (unit != peak_unit) {
        Bytes& known = change_of_unit[static_cast<std::size_t>(unit)];
        if (known == 1) known = change_at_peak(unit);
        change = known;
        if (change >= 0) return;
      }
      moves.push_back({unit, to, change});
    };
    for (const TensorId b : live) {
      // Inputs are written before the first op: nothing to run later.
      if (!evaluator_.input(b)) {
        const int w = unit_at(evaluator_.first(b));
        const int last = latest(w);
        if (last >= peak_index && where_[static_cast<std::size_t>(w)] <= peak_index) {
          add(w, peak_index);
          add(w, last);
        }
      }
      if (!evaluator_.step_result(b) && evaluator_.last(b) > p) {
        const int r = unit_at(evaluator_.last(b));
        const int first = earliest(r);
        if (first <= peak_index) {
          add(r, peak_index);
          add(r, first);
        }
      }
    }
    std::stable_sort(moves.begin(), moves.end(), [](const Move& a, const Move& b) { return a.change < b.change; });
    return moves;
  }

  const Graph& graph_;
  OrderSearchOptions options_;
  Units units_;
  Constraints constraints_;
  ProfileEvaluator evaluator_;
  bool evaluator_holds_best_ = false;  // its last evaluate() was of order_
  Profile start_profile_;
  std::vector<int> order_;  // unit ids in run order
  std::vector<int> where_;  // unit id -> index in order_
};

}  // namespace

OrderSearchResult search_order(const Graph& graph, std::span<const Schedule> starts, const OrderSearchOptions& options) {
  MEMPLAN_CHECK(!starts.empty(), "an order search needs a start");
  for (const Schedule& start : starts) {
    MEMPLAN_CHECK(static_cast<int>(start.size()) == graph.num_ops(),
                  "start order has " << start.size() << " ops, the graph " << graph.num_ops());
  }
  if (starts.front().empty()) return OrderSearchResult{};
  ProfileEvaluator evaluator(graph, options);
  std::size_t chosen = 0;
  Profile chosen_profile = evaluator.evaluate(starts[0]);
  for (std::size_t k = 1; k < starts.size(); ++k) {
    const Profile p = evaluator.evaluate(starts[k]);
    if (p.peak < chosen_profile.peak) {
      chosen = k;
      chosen_profile = p;
    }
  }
  return OrderSearch(graph, starts[chosen], options, std::move(evaluator), chosen_profile).run();
}

OrderSearchResult search_order(const Graph& graph, const Schedule& start, const OrderSearchOptions& options) {
  return search_order(graph, std::span<const Schedule>(&start, 1), options);
}

Bytes transient_peak(const Graph& graph, const Schedule& schedule, const OrderSearchOptions& options) {
  return ProfileEvaluator(graph, options).evaluate(schedule).peak;
}

}  // namespace memplan::planner
