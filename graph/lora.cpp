#include "memplan/graph/lora.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>

#include "memplan/graph/builder.h"
#include "memplan/graph/linear_layers_internal.h"

namespace memplan::graph {
namespace {

using namespace linear_layers;

// Whether `target` names `module`: its last component, a dotted tail of its path, or the short
// form of a PEFT name (q for q_proj).
bool names(const std::string& target, const std::string& module) {
  for (const std::string& form : {target, target + "_proj"}) {
    if (module == form || ends_with(module, "." + form)) return true;
  }
  return false;
}

// The adapted form of the linear y = x W^T at op `index` (already emitted as `y`): the adapter's
// ops appended to `g`, returning y + (alpha / r) B A x. Parameters A and B are added to `g`.
TensorId add_adapter(Graph& g, const LoraConfig& config, TensorId x, TensorId w, TensorId y, LoraReport& report) {
  Builder b(g);
  const TensorDesc weight = g.tensor(w);
  const std::string module = module_of(weight);
  const std::int64_t out = weight.shape[0], in = weight.shape[1];
  const std::int64_t r = config.rank;
  if (r > std::min(in, out)) {
    throw GraphError("LoRA rank " + std::to_string(r) + " exceeds the width of '" + module + "' [" + std::to_string(out) + ", " +
                     std::to_string(in) + "]: give a rank of at most " + std::to_string(std::min(in, out)));
  }
  const DType dt = config.dtype.value_or(DType::f32);
  const InitSpec a_init{InitSpec::Kind::uniform, static_cast<float>(1.0 / std::sqrt(double(in)))};
  const TensorId a = b.parameter(module + ".lora_A.weight", {r, in}, a_init, dt);
  const TensorId bw = b.parameter(module + ".lora_B.weight", {out, r}, InitSpec{}, dt);
  TensorId h = b.cast(x, dt, module + ".lora.in");
  h = b.dropout(h, config.dropout, module + ".lora.dropout");
  h = b.matmul(h, a, false, true, module + ".lora_A");
  h = b.matmul(h, bw, false, true, module + ".lora_B");
  h = b.scale(h, config.alpha / static_cast<float>(r), module + ".lora.scaled");
  h = b.cast(h, g.tensor(y).dtype, module + ".lora.out");
  ++report.adapted_layers;
  report.adapter_params += r * in + out * r;
  report.adapter_bytes += g.tensor(a).size_bytes() + g.tensor(bw).size_bytes();
  report.modules.push_back(module);
  return b.add(y, h, module + ".lora.sum");
}

}  // namespace

std::vector<std::string> linear_modules(const Graph& forward) {
  const std::set<TensorId> heads = head_weights(forward);
  std::vector<std::string> modules;
  for (const Op& op : forward.ops()) {
    const TensorId w = linear_weight(forward, op);
    if (w == kNoTensor || heads.count(w)) continue;
    const std::string m = module_of(forward.tensor(w));
    if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
  }
  return modules;
}

LoraReport apply_lora(Graph& g, const LoraConfig& config) {
  LoraReport report;
  if (!config.active()) return report;
  if (config.rank < 0) throw GraphError("LoRA rank " + std::to_string(config.rank) + " is negative: give a rank of 1 or more");
  if (config.dtype && !is_floating(*config.dtype)) {
    throw GraphError("LoRA adapters' dtype must be floating, not " + std::string(dtype_name(*config.dtype)));
  }
  if (!(config.dropout >= 0.0f && config.dropout < 1.0f)) {
    throw GraphError("LoRA dropout " + std::to_string(config.dropout) + " must be in [0, 1)");
  }
  const std::set<TensorId> heads = head_weights(g);
  // Which linear ops get adapters, checked against the targets before anything changes.
  std::vector<int> adapted;
  if (config.rank > 0) {
    const std::vector<std::string> modules = linear_modules(g);
    std::vector<bool> used(config.targets.size(), false);
    for (int i = 0; i < g.num_ops(); ++i) {
      const TensorId w = linear_weight(g, g.ops()[static_cast<std::size_t>(i)]);
      if (w == kNoTensor || heads.count(w)) continue;
      const std::string m = module_of(g.tensor(w));
      bool named = false, all = false;
      for (std::size_t t = 0; t < config.targets.size(); ++t) {
        const bool is_all = config.targets[t] == "all-linear";
        if (is_all || names(config.targets[t], m)) {
          used[t] = true;
          (is_all ? all : named) = true;
        }
      }
      // all-linear leaves out a layer narrower than the rank (a mixture's shared-expert gate
      // [1, C]); a layer named on its own is refused then (add_adapter says why).
      const TensorDesc& wd = g.tensor(w);
      if (!named && all && config.rank > std::min(wd.shape[0], wd.shape[1])) {
        report.skipped_narrow.push_back(m);
        continue;
      }
      if (named || all) adapted.push_back(i);
    }
    for (std::size_t t = 0; t < config.targets.size(); ++t) {
      if (used[t]) continue;
      std::set<std::string> last;
      for (const std::string& m : modules) last.insert(m.substr(m.rfind('.') + 1));
      std::string list;
      for (const std::string& m : last) list += (list.empty() ? "" : ", ") + m;
      throw GraphError("LoRA target '" + config.targets[t] + "' names no linear layer of this model; its linear layers are " +
                       (list.empty() ? std::string("none") : list) + " (or all-linear)");
    }
  }
  // Freeze: everything under LoRA, and what the patterns name.
  std::vector<bool> pattern_used(config.freeze.size(), false);
  for (TensorId p : g.parameters()) {
    TensorDesc& d = g.mutable_tensor(p);
    bool freeze = config.rank > 0;
    for (std::size_t i = 0; i < config.freeze.size(); ++i) {
      if (glob_match(config.freeze[i], d.name)) {
        freeze = true;
        pattern_used[i] = true;
      }
    }
    d.frozen = freeze;
  }
  for (std::size_t i = 0; i < config.freeze.size(); ++i) {
    if (!pattern_used[i]) {
      throw GraphError("--freeze pattern '" + config.freeze[i] + "' matches no parameter ('*' matches any text, e.g. 'h.0.*' or '*norm*')");
    }
  }
  // Adapters appended, each product's readers pointed at its adapted sum, then each adapter's ops
  // moved to run right after its base product.
  const int base_ops = g.num_ops();
  std::vector<std::vector<int>> after(static_cast<std::size_t>(base_ops));
  for (int i : adapted) {
    const Op op = g.ops()[static_cast<std::size_t>(i)];
    const TensorId y = op.outputs[0];
    const int first_new = g.num_ops();
    const TensorId sum = add_adapter(g, config, op.inputs[0], op.inputs[1], y, report);
    for (int k = first_new; k < g.num_ops(); ++k) after[static_cast<std::size_t>(i)].push_back(k);
    for (int j = i + 1; j < base_ops; ++j) {
      const Op& reader = g.ops()[static_cast<std::size_t>(j)];
      for (std::size_t slot = 0; slot < reader.inputs.size(); ++slot) {
        if (reader.inputs[slot] != y) continue;
        g.replace_input(j, static_cast<int>(slot), sum);
        // A view of the product (a reshape into heads) must view the sum: its storage is what
        // its readers read, and replace_input changes the op, not the view's base.
        if (op_info(reader.kind).output_is_view && slot == 0 && !reader.outputs.empty()) {
          g.mutable_tensor(reader.outputs[0]).view_of = sum;
        }
      }
    }
    if (g.output == y) g.output = sum;
    if (g.loss == y) g.loss = sum;
    std::replace(g.retained.begin(), g.retained.end(), y, sum);
  }
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(g.num_ops()));
  for (int i = 0; i < base_ops; ++i) {
    order.push_back(i);
    for (int k : after[static_cast<std::size_t>(i)]) order.push_back(k);
  }
  g.reorder_ops(order);
  for (TensorId p : g.parameters()) {
    const TensorDesc& d = g.tensor(p);
    (d.frozen ? report.frozen_params : report.trainable_params) += d.shape.numel();
    if (d.frozen) report.frozen_bytes += d.size_bytes();
  }
  if (report.trainable_params == 0) {
    throw GraphError("every parameter is frozen: nothing would train (loosen --freeze, or add adapters with --lora)");
  }
  return report;
}

}  // namespace memplan::graph
