#include "memplan/train/adapters.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "memplan/common/atomic_file.h"
#include "memplan/common/input_file.h"
#include "memplan/kernels/half.h"
#include "memplan/runtime/safetensors.h"

namespace memplan::train {
namespace {

namespace fs = std::filesystem;

constexpr Bytes kMaxAdapterConfigBytes = Bytes{1} << 20;
constexpr Bytes kMaxAdapterBytes = Bytes{64} << 30;

bool is_adapter(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

// "<module>.lora_A.weight" -> "<module>"
std::string module_of(const std::string& name) { return name.substr(0, name.size() - std::string(".lora_A.weight").size()); }

std::string peft_name(const AdapterNaming& naming, const std::string& name) { return "base_model.model." + naming.module_prefix + name; }

// The step's adapters by PEFT name: the tensor and its description.
std::map<std::string, TensorId> adapters_of(const graph::Graph& g, const AdapterNaming& naming) {
  std::map<std::string, TensorId> out;
  for (TensorId p : g.parameters()) {
    if (is_adapter(g.tensor(p).name)) out[peft_name(naming, g.tensor(p).name)] = p;
  }
  return out;
}

// The adapted modules' names, as PEFT's target_modules lists them: each one's last name ("q_proj"),
// or its last two where a linear layer left without an adapter ends the same way (attn.proj
// beside mlp.proj), since PEFT takes every module whose name ends with a target.
std::vector<std::string> target_modules(const graph::Graph& g) {
  std::set<std::string> adapted;
  for (TensorId p : g.parameters()) {
    if (is_adapter(g.tensor(p).name)) adapted.insert(module_of(g.tensor(p).name));
  }
  std::vector<std::string> others;
  for (const std::string& m : graph::linear_modules(g)) {
    if (m.find(".lora_") == std::string::npos && !adapted.count(m)) others.push_back(m);
  }
  auto tail = [](const std::string& m, int parts) {
    std::size_t at = m.size();
    for (int i = 0; i < parts && at != std::string::npos && at > 0; ++i) at = m.rfind('.', at - 1);
    return at == std::string::npos ? m : m.substr(at + 1);
  };
  std::set<std::string> names;
  for (const std::string& m : adapted) {
    std::string t = tail(m, 1);
    const bool ambiguous = std::any_of(others.begin(), others.end(), [&](const std::string& o) { return o == t || o.ends_with("." + t); });
    names.insert(ambiguous ? tail(m, 2) : t);
  }
  return {names.begin(), names.end()};
}

// Whether PEFT's target `t` takes module `m` (its name is t or ends with "." t).
bool takes(const std::string& t, const std::string& m) { return m == t || m.ends_with("." + t); }

// A snapshot tensor's values as f32.
std::vector<float> values_of(const runtime::WeightsSnapshot& s, const runtime::WeightsSnapshot::Tensor& t) {
  std::int64_t n = 1;
  for (std::int64_t d : t.shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  kernels::widen_to_f32(t.dtype, s.data.data() + t.offset, v.data(), n);
  return v;
}

}  // namespace

Status merge_adapters(runtime::WeightsSnapshot& snapshot, const graph::LoraConfig& lora) {
  auto find = [&](const std::string& name) -> runtime::WeightsSnapshot::Tensor* {
    for (auto& t : snapshot.tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  };
  std::set<std::string> dropped;  // adapters and their optimizer state
  for (const auto& t : snapshot.tensors) {
    if (!t.name.ends_with(".lora_A.weight")) continue;
    const std::string module = module_of(t.name);
    runtime::WeightsSnapshot::Tensor* w = find(module + ".weight");
    const runtime::WeightsSnapshot::Tensor* b = find(module + ".lora_B.weight");
    if (w == nullptr || b == nullptr || w->shape.size() != 2) {
      return Error{"--merge-lora: '" + module + ".weight' is not in the saved state in full precision (a --quant base "
                   "cannot take merged adapters); save the adapters with --save-adapter instead"};
    }
    const std::int64_t out = w->shape[0], in = w->shape[1], r = t.shape[0];
    const std::vector<float> a = values_of(snapshot, t), bv = values_of(snapshot, *b);
    std::vector<float> merged = values_of(snapshot, *w);
    const float scale = lora.alpha / static_cast<float>(lora.rank);
    for (std::int64_t i = 0; i < out; ++i) {
      for (std::int64_t j = 0; j < in; ++j) {
        float s = 0.0f;
        for (std::int64_t k = 0; k < r; ++k) s += bv[static_cast<std::size_t>(i * r + k)] * a[static_cast<std::size_t>(k * in + j)];
        merged[static_cast<std::size_t>(i * in + j)] += scale * s;
      }
    }
    kernels::narrow_from_f32(w->dtype, merged.data(), snapshot.data.data() + w->offset, out * in);
    dropped.insert(module + ".lora_A.weight");
    dropped.insert(module + ".lora_B.weight");
  }
  if (dropped.empty()) return Error{"--merge-lora: the run has no LoRA adapters to merge (add --lora RANK)"};
  auto is_dropped = [&](const std::string& name) {
    for (const std::string& d : dropped) {
      if (name == d || name.rfind(d + ".", 0) == 0) return true;  // an adapter or its state ("<adapter>.adam_m")
    }
    return false;
  };
  runtime::WeightsSnapshot kept;
  kept.metadata = snapshot.metadata;
  for (const auto& t : snapshot.tensors) {
    if (is_dropped(t.name)) continue;
    runtime::WeightsSnapshot::Tensor copy = t;
    copy.offset = kept.data.size();
    kept.data.append(snapshot.data, t.offset, t.bytes);
    kept.tensors.push_back(copy);
  }
  snapshot = std::move(kept);
  return Status::success();
}

Status save_adapter(const runtime::Executor& executor, const graph::LoraConfig& lora, const AdapterNaming& naming,
                    const std::string& dir) {
  const graph::Graph& g = executor.graph();
  const std::map<std::string, TensorId> adapters = adapters_of(g, naming);
  if (adapters.empty()) return Error{"--save-adapter: the step has no LoRA adapters (add --lora RANK)"};
  std::vector<std::string> bytes;  // each tensor's data, kept alive for the entries' views
  bytes.reserve(adapters.size());
  std::vector<runtime::SafetensorsEntry> entries;
  for (const auto& [name, id] : adapters) {
    const graph::TensorDesc& d = g.tensor(id);
    std::string data(static_cast<std::size_t>(d.size_bytes()), '\0');
    executor.read_tensor(id, data.data());
    bytes.push_back(std::move(data));
    entries.push_back({name, d.dtype, d.shape.dims, bytes.back()});
  }
  auto file = runtime::encode_safetensors(entries, {{"format", "pt"}});
  if (!file) return file.error();
  nlohmann::json config{{"peft_type", "LORA"},
                        {"task_type", "CAUSAL_LM"},
                        {"base_model_name_or_path", naming.base_model},
                        {"r", lora.rank},
                        {"lora_alpha", lora.alpha},
                        {"lora_dropout", lora.dropout},
                        {"target_modules", target_modules(g)},
                        {"bias", "none"},
                        {"fan_in_fan_out", false},
                        {"inference_mode", true},
                        {"init_lora_weights", true},
                        {"modules_to_save", nullptr}};
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Error{"--save-adapter: cannot create " + dir + ": " + ec.message()};
  if (Status s = write_file_atomically((fs::path(dir) / kAdapterWeightsName).string(), file.value()); !s) return s;
  return write_file_atomically((fs::path(dir) / kAdapterConfigName).string(), config.dump(2) + "\n");
}

Result<int> load_adapter(runtime::Executor& executor, const graph::LoraConfig& lora, const AdapterNaming& naming,
                         const std::string& dir) {
  const graph::Graph& g = executor.graph();
  const std::string config_path = (fs::path(dir) / kAdapterConfigName).string();
  auto config_text = read_regular_file(config_path, kMaxAdapterConfigBytes, "adapter config");
  if (!config_text) return config_text.error();
  const std::map<std::string, TensorId> adapters = adapters_of(g, naming);
  const std::vector<std::string> modules = target_modules(g);
  try {
    const nlohmann::json c = nlohmann::json::parse(config_text.value());
    if (c.value("peft_type", std::string()) != "LORA") return Error{config_path + ": peft_type is not LORA"};
    const int r = c.at("r").get<int>();
    if (r != lora.rank) {
      return Error{config_path + ": r is " + std::to_string(r) + " and this run's --lora rank is " + std::to_string(lora.rank) +
                   ": give --lora " + std::to_string(r)};
    }
    const double alpha = c.at("lora_alpha").get<double>();
    if (static_cast<float>(alpha) != lora.alpha) {
      return Error{config_path + ": lora_alpha is " + c.at("lora_alpha").dump() + ", not this run's " + std::to_string(lora.alpha) +
                   ": give --lora " + std::to_string(r) + ":" + c.at("lora_alpha").dump()};
    }
    // Keys that change the arithmetic memplan's adapters do not do are refused by name.
    auto flag = [&](const char* key) { return c.contains(key) && c[key].is_boolean() && c[key].get<bool>(); };
    auto nonempty = [&](const char* key) { return c.contains(key) && c[key].is_object() && !c[key].empty(); };
    if (flag("use_rslora")) return Error{config_path + ": use_rslora is true (updates scaled by alpha / sqrt(r)); memplan's scale by alpha / r"};
    if (flag("use_dora")) return Error{config_path + ": use_dora is true (DoRA's magnitude vectors); memplan trains plain LoRA"};
    if (flag("fan_in_fan_out")) return Error{config_path + ": fan_in_fan_out is true (Conv1D weights [in, out]); memplan's are [out, in]"};
    if (nonempty("alpha_pattern") || nonempty("rank_pattern")) {
      return Error{config_path + ": alpha_pattern or rank_pattern gives modules their own lora_alpha or r; memplan's adapters share one"};
    }
    if (c.contains("bias") && c["bias"] != "none") {
      return Error{config_path + ": bias is " + c["bias"].dump() + "; memplan's adapters train no biases (bias \"none\")"};
    }
    std::vector<std::string> adapted;
    for (const auto& [peft, id] : adapters) adapted.push_back(module_of(g.tensor(id).name));
    for (const auto& m : c.at("target_modules")) {
      const std::string name = m.get<std::string>();
      if (std::none_of(adapted.begin(), adapted.end(), [&](const std::string& a) { return takes(name, a); })) {
        std::string list;
        for (const std::string& s : modules) list += (list.empty() ? "" : ", ") + s;
        return Error{config_path + ": target_modules names '" + name + "', which this run does not adapt (it adapts " + list +
                     "; set --lora-targets to the adapter's)"};
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return Error{config_path + ": not a PEFT adapter config: " + std::string(e.what())};
  }
  const std::string weights_path = (fs::path(dir) / kAdapterWeightsName).string();
  auto bytes = read_regular_file(weights_path, kMaxAdapterBytes, "adapter weights");
  if (!bytes) return bytes.error();
  auto view = runtime::parse_safetensors(bytes.value(), weights_path);
  if (!view) return view.error();
  for (const runtime::SafetensorsEntry& t : view.value().tensors) {
    if (!adapters.count(t.name)) return Error{weights_path + ": tensor '" + t.name + "' is not an adapter of this run"};
  }
  int loaded = 0;
  for (const auto& [name, id] : adapters) {
    const runtime::SafetensorsEntry* t = view.value().find(name);
    if (t == nullptr) return Error{weights_path + ": has no '" + name + "', an adapter of this run"};
    const graph::TensorDesc& d = g.tensor(id);
    if (t->dtype != d.dtype || t->shape != d.shape.dims) {
      return Error{weights_path + ": '" + name + "' is " + std::string(graph::dtype_name(t->dtype)) + " " +
                   graph::Shape(t->shape).to_string() + ", this run's is " + std::string(graph::dtype_name(d.dtype)) + " " +
                   d.shape.to_string()};
    }
    executor.write_tensor(id, t->data.data());
    ++loaded;
  }
  return loaded;
}

}  // namespace memplan::train
