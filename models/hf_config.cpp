#include "memplan/models/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "memplan/common/input_file.h"

namespace memplan::models {
namespace {

using nlohmann::json;

constexpr Bytes kMaxConfigBytes = Bytes{16} << 20;  // real configs are a few KiB (id2label included)

struct TypeRow {
  const char* model_type;
  HfFamily family;
};
// The decoder-only families all map onto the rotary decoder (models/llama.h), each with its settings.
constexpr TypeRow kModelTypes[] = {{"gpt2", HfFamily::gpt2},      {"llama", HfFamily::llama},    {"mistral", HfFamily::llama},
                                   {"qwen2", HfFamily::llama},    {"qwen3", HfFamily::llama},    {"gemma", HfFamily::llama},
                                   {"gemma2", HfFamily::llama},  {"gemma3_text", HfFamily::llama}, {"granite", HfFamily::llama},
                                   {"starcoder2", HfFamily::llama}, {"stablelm", HfFamily::llama}, {"olmoe", HfFamily::llama},
                                   {"deepseek_v2", HfFamily::llama}, {"deepseek_v3", HfFamily::llama}, {"kimi_k2", HfFamily::llama},
                                   {"opt", HfFamily::llama},      {"gpt_bigcode", HfFamily::llama},
                                   {"phi3", HfFamily::llama},     {"olmo2", HfFamily::llama},    {"gpt_neox", HfFamily::llama},
                                   {"falcon", HfFamily::llama},   {"mixtral", HfFamily::llama},  {"qwen2_moe", HfFamily::llama},
                                   {"qwen3_moe", HfFamily::llama}, {"bert", HfFamily::bert},     {"vit", HfFamily::vit},
                                   {"t5", HfFamily::t5}};

// Families people download that memplan does not plan yet, each with what it lacks: a config of
// one is refused naming that, never planned as something it is not.
struct Unplanned {
  const char* model_type;
  const char* missing;
};
constexpr const char* kStateSpace =
    "state-space (Mamba) layers: the selective scan over in_proj, conv1d, x_proj, dt_proj, A_log, D and out_proj, "
    "and its recurrent state";
constexpr Unplanned kNotPlanned[] = {
    {"mamba", kStateSpace},
    {"mamba2", kStateSpace},
    {"falcon_mamba", kStateSpace},
    {"jamba", "the Mamba (state-space) layers between its attention layers"},
    {"falcon_h1", "the Mamba (state-space) heads beside its attention"},
    {"zamba2", "the Mamba (state-space) layers of its hybrid stack"},
    {"nemotron_h", "the Mamba (state-space) layers of its hybrid stack"},
    {"qwen3_next", "the gated DeltaNet linear-attention layers beside its gated attention"},
    {"gpt_oss", "attention sinks, alternating sliding windows and gpt-oss's experts (clamped SwiGLU with biases)"},
    {"llama4", "Llama 4's text decoder (chunked attention with NoPE layers, an interleaved mixture of experts) and its "
               "vision tower"},
    {"llama4_text", "chunked attention with NoPE layers and Llama 4's interleaved mixture of experts"},
    {"bloom", "ALiBi positions and the embedding LayerNorm"},
    {"mpt", "ALiBi positions and bias-free LayerNorms"},
    {"cohere", "bias-free LayerNorms and Cohere's parallel block with logit_scale"},
    {"cohere2", "bias-free LayerNorms, Cohere's parallel block and its interleaved sliding windows"},
    {"internlm2", "InternLM2's packed wqkv projection and its module names (wqkv, wo, w1, w2, w3)"},
    {"phimoe", "PhiMoE's sparsemixer router over experts with LayerNorms and biases"},
    {"qwen2_5_vl", "Qwen2.5-VL's multimodal rotary positions (mrope) and its vision tower"},
};

std::string kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a fractional number";
    default: return "a number";
  }
}

// The fields of one config object, read with errors that name the file and the field. Every
// getter records the first error and returns a harmless value, so a family's reader stays a flat
// list of fields; ok() is checked once at the end.
class Fields {
 public:
  Fields(const json& object, std::string source) : j_(object), source_(std::move(source)) {}

  bool ok() const { return !error_; }
  const Error& error() const { return *error_; }
  void fail(const std::string& field, const std::string& message) {
    if (!error_) error_ = Error{source_ + ": " + field + ": " + message};
  }
  void fail(const std::string& message) {
    if (!error_) error_ = Error{source_ + ": " + message};
  }

  // The value of the first present (non-null) name among `names` (aliases of one field, e.g.
  // n_embd and hidden_size); two present names with different values are an error.
  const json* find(std::initializer_list<const char*> names, std::string* which) {
    const json* found = nullptr;
    for (const char* name : names) {
      read_.insert(name);
      auto it = j_.find(name);
      if (it == j_.end() || it->is_null()) continue;
      if (found == nullptr) {
        found = &*it;
        *which = name;
      } else if (*found != *it) {
        fail(*which + " " + found->dump() + " and " + name + " " + it->dump() +
             " name the same field with different values; give one");
      }
    }
    return found;
  }

  // A size: a JSON integer >= 1. Missing: `fallback`, or an error when there is none.
  std::int64_t size(std::initializer_list<const char*> names, std::optional<std::int64_t> fallback = std::nullopt) {
    std::string which = *names.begin();
    const json* v = find(names, &which);
    if (v == nullptr) {
      if (fallback) return *fallback;
      std::string alts;
      for (const char* n : names) alts += std::string(alts.empty() ? "" : " or ") + n;
      fail(alts, "missing (a positive integer is required)");
      return 1;
    }
    if (v->is_number_unsigned()) {
      if (v->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(which, v->dump() + " is too large for a size");
        return 1;
      }
    } else if (!v->is_number_integer()) {
      fail(which, "expected a positive integer, got " + kind_of(*v) + " " + v->dump().substr(0, 40));
      return 1;
    }
    const std::int64_t n = v->get<std::int64_t>();
    if (n < 1) {
      fail(which, "must be a positive integer, got " + std::to_string(n));
      return 1;
    }
    return n;
  }

  bool boolean(const char* name, bool fallback) {
    read_.insert(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      fail(name, "expected true or false, got " + kind_of(*it) + " " + it->dump().substr(0, 40));
      return fallback;
    }
    return it->get<bool>();
  }

  // A finite number in [lo, hi] (a probability, an epsilon, rope theta).
  double number(const char* name, double fallback, double lo, double hi) {
    read_.insert(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_number()) {
      fail(name, "expected a number, got " + kind_of(*it) + " " + it->dump().substr(0, 40));
      return fallback;
    }
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < lo || v > hi) {
      char range[96];
      std::snprintf(range, sizeof range, "must be a number in [%g, %g], got ", lo, hi);
      fail(name, range + it->dump());
      return fallback;
    }
    return v;
  }

  // A number in [lo, hi] that may be switched off: absent, `fallback`; null, 0 (off).
  double number_or_off(const char* name, double fallback, double lo, double hi) {
    auto it = j_.find(name);
    if (it != j_.end() && it->is_null()) {
      read_.insert(name);
      return 0.0;
    }
    return number(name, fallback, lo, hi);
  }

  // A string, "" when absent.
  std::string text(const char* name) {
    read_.insert(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return {};
    if (!it->is_string()) {
      fail(name, "expected a string, got " + kind_of(*it) + " " + it->dump().substr(0, 40));
      return {};
    }
    return it->get<std::string>();
  }

  // Present with a type that changes no tensor (rope_scaling): only checked.
  void expect_object_or_absent(const char* name) {
    read_.insert(name);
    auto it = j_.find(name);
    if (it != j_.end() && !it->is_null() && !it->is_object()) fail(name, "expected an object, got " + kind_of(*it));
  }

  // A list of non-negative integers (layer indices), empty when absent.
  std::vector<std::int64_t> indices(const char* name) {
    return list<std::int64_t>(name, "layer indices", "non-negative integers",
                              [](const json& v) { return v.is_number_integer() && v.get<std::int64_t>() >= 0; });
  }

  // A list of strings (layer_types), empty when absent.
  std::vector<std::string> strings(const char* name) {
    return list<std::string>(name, "strings", "strings", [](const json& v) { return v.is_string(); });
  }

  // A list, empty when absent, of elements `accepts` takes; `what` names the list and `each` its
  // elements in the messages.
  template <typename T>
  std::vector<T> list(const char* name, const char* what, const char* each, bool (*accepts)(const json&)) {
    read_.insert(name);
    auto it = j_.find(name);
    std::vector<T> out;
    if (it == j_.end() || it->is_null()) return out;
    if (!it->is_array()) {
      fail(name, std::string("expected a list of ") + what + ", got " + kind_of(*it) + " " + it->dump().substr(0, 40));
      return out;
    }
    for (const json& v : *it) {
      if (!accepts(v)) {
        fail(name, std::string("expected ") + each + ", got " + v.dump().substr(0, 40));
        return {};
      }
      out.push_back(v.get<T>());
    }
    return out;
  }

  // A key read directly from the object (id2label) counts as read.
  void mark_read(const char* name) { read_.insert(name); }
  // The object's keys no getter asked for, sorted.
  std::vector<std::string> unread() const {
    std::vector<std::string> keys;
    for (const auto& [key, value] : j_.items()) {
      if (!read_.count(key)) keys.push_back(key);
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }

 private:
  const json& j_;
  std::string source_;
  std::optional<Error> error_;
  std::set<std::string, std::less<>> read_;
};

// Dropout rates: memplan applies one rate per model; the largest of the config's rates decides
// whether masks are stored (their value does not change memory).
float dropout(Fields& f, std::initializer_list<const char*> names, double fallback) {
  double p = 0.0;
  for (const char* name : names) {
    const double v = f.number(name, fallback, 0.0, 1.0);
    if (v >= 1.0) f.fail(name, "dropout probabilities must be below 1");
    p = std::max(p, v);
  }
  return static_cast<float>(p);
}

// Each weight the config implies must be representable: a product of sizes, in elements of at
// most 4 bytes, within graph::kMaxTensorBytes. Checked on the named fields before anything is built.
void check_weight(Fields& f, const std::string& what, std::initializer_list<std::int64_t> factors) {
  if (!f.ok()) return;
  std::int64_t room = graph::kMaxTensorBytes / 4;  // elements left; every factor is >= 1
  std::string dims;
  for (std::int64_t factor : factors) {
    dims += (dims.empty() ? "" : " x ") + std::to_string(factor);
    room = factor > room ? -1 : room / factor;
    if (room < 0) break;
  }
  if (room < 0) {
    f.fail(what + " (" + dims + "): the weight would hold more than 2^60 bytes, more than one tensor may; "
           "the sizes cannot be represented");
  }
}

void check_heads(Fields& f, std::int64_t width, std::int64_t heads, const char* width_name) {
  if (f.ok() && width % heads != 0) {
    f.fail(std::string("num_attention_heads ") + std::to_string(heads) + " does not divide " + width_name + " " +
           std::to_string(width) + " (each head takes width / heads channels)");
  }
}

// Dropout the rotary decoder does not apply: a rate above zero would store masks memplan does not
// plan, so it is refused naming the key; zero (what these families train and ship with) passes.
void expect_no_dropout(Fields& f, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const double p = f.number(name, 0.0, 0.0, 1.0);
    if (p > 0.0) {
      f.fail(name, std::to_string(p).substr(0, 8) + " is not supported: memplan's rotary decoder (" +
                       "llama, mistral, qwen, gemma, phi3, olmo2, gpt_neox, falcon) trains without dropout; set it to 0.0");
    }
  }
}

// The rotating channels of a head of `head_size` for a fraction `key` of it (GPT-NeoX's
// rotary_pct, Phi's partial_rotary_factor), rounded down as transformers does; 0 for all of them.
std::int64_t rotary_dims(Fields& f, const char* key, std::int64_t head_size, double fallback = 1.0) {
  const double fraction = f.number(key, fallback, 0.0, 1.0);
  const auto dims = static_cast<std::int64_t>(static_cast<double>(head_size) * fraction);
  if (!f.ok() || dims == head_size) return 0;
  if (dims <= 0 || dims % 2 != 0) {
    f.fail(key, "gives " + std::to_string(dims) + " rotating channels of a head of " + std::to_string(head_size) +
                    "; rotary needs a positive even count");
  }
  return dims;
}

// hidden_act / activation of an MLP: silu, gelu (and its tanh forms, computed as the erf form: the
// same memory, values within about 1e-3) or relu.
Activation activation(Fields& f, const char* key, const std::string& act, Activation fallback) {
  if (act.empty()) return fallback;
  if (act == "gelu" || act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast") return Activation::gelu;
  if (act == "relu") return Activation::relu;
  if (act == "silu" || act == "swish") return Activation::silu;
  f.fail(key, "'" + act + "' is not supported (silu, gelu, gelu_pytorch_tanh, gelu_new or relu)");
  return fallback;
}

// The checks every rotary decoder's sizes pass, with the config's own names for them.
void check_decoder(Fields& f, const LlamaConfig& l, const char* width_name, const char* kv_heads_name = "num_key_value_heads") {
  if (l.head_dim == 0) check_heads(f, l.width, l.heads, width_name);
  if (f.ok() && l.heads % l.kv_heads != 0) {
    f.fail(std::string(kv_heads_name) + " " + std::to_string(l.kv_heads) + " does not divide num_attention_heads " +
           std::to_string(l.heads) + " (each K/V head serves a group of query heads)");
  }
  if (f.ok() && l.head_size() % 2 != 0) {
    f.fail((l.head_dim > 0 ? "head_dim " : std::string(width_name) + " / num_attention_heads = ") + std::to_string(l.head_size()) +
           " is odd; rotary positions need an even head size");
  }
  check_weight(f, "vocab_size x hidden_size", {l.vocab, l.width});
  check_weight(f, "intermediate_size x hidden_size", {l.ffn, l.width});
  check_weight(f, "hidden_size x hidden_size", {l.width, l.width});
  if (l.head_dim > 0) check_weight(f, "num_attention_heads x head_dim x hidden_size (q_proj)", {l.heads, l.head_dim, l.width});
}

void read_torch_dtype(Fields& f, HfConfig& c) {
  // transformers writes torch_dtype, and dtype since 4.56.
  c.torch_dtype = f.text("torch_dtype");
  if (c.torch_dtype.empty()) c.torch_dtype = f.text("dtype");
  if (!c.torch_dtype.empty() && c.torch_dtype != "float32" && c.torch_dtype != "float16" &&
      c.torch_dtype != "bfloat16" && c.torch_dtype != "auto") {
    f.fail("torch_dtype", "'" + c.torch_dtype + "' is not one of float32, float16, bfloat16, auto");
  }
}

void read_gpt2(Fields& f, HfConfig& c) {
  GptConfig& g = c.gpt;
  // GPT2Config's attribute_map: hidden_size, num_hidden_layers, num_attention_heads and
  // max_position_embeddings are other names for its own fields.
  g.width = f.size({"n_embd", "hidden_size"});
  g.layers = f.size({"n_layer", "num_hidden_layers"});
  g.heads = f.size({"n_head", "num_attention_heads"});
  g.vocab = f.size({"vocab_size"});
  c.positions = f.size({"n_positions", "max_position_embeddings", "n_ctx"});
  g.max_positions = c.positions;
  g.context = c.positions;
  c.learned_positions = true;
  g.mlp = f.size({"n_inner"}, std::int64_t{0});  // null in GPT-2's configs: 4 * n_embd
  g.tied_head = f.boolean("tie_word_embeddings", true);
  g.dropout = dropout(f, {"resid_pdrop", "embd_pdrop", "attn_pdrop"}, 0.1);
  f.number("layer_norm_epsilon", 1e-5, 0.0, 1.0);
  f.text("activation_function");
  if (f.boolean("add_cross_attention", false)) {
    f.fail("add_cross_attention", "true is not supported: memplan's GPT-2 is a decoder without cross-attention");
  }
  check_heads(f, g.width, g.heads, "n_embd");
  check_weight(f, "vocab_size x n_embd", {g.vocab, g.width});
  check_weight(f, "n_positions x n_embd", {c.positions, g.width});
  if (g.mlp > 0) {
    check_weight(f, "n_inner x n_embd", {g.mlp, g.width});
  } else {
    check_weight(f, "4 n_embd x n_embd (n_inner null)", {4, g.width, g.width});
  }
}

// The mixture of experts of Mixtral (num_local_experts, every layer, top-k renormalised, experts
// of intermediate_size) and of Qwen2-MoE and Qwen3-MoE (num_experts of moe_intermediate_size,
// norm_topk_prob, dense layers by decoder_sparse_step and mlp_only_layers, and Qwen2-MoE's gated
// shared expert). The load-balancing loss joins the loss when output_router_logits asks for it.
void read_moe(Fields& f, HfConfig& c) {
  LlamaConfig::Moe& m = c.llama.moe;
  const bool mixtral = c.model_type == "mixtral";
  const char* experts_key = mixtral ? "num_local_experts" : "num_experts";
  const bool olmoe = c.model_type == "olmoe";
  m.experts = f.size({experts_key}, std::int64_t{mixtral ? 8 : c.model_type == "qwen2_moe" ? 60 : olmoe ? 64 : 128});
  m.top_k = f.size({"num_experts_per_tok"}, std::int64_t{mixtral ? 2 : c.model_type == "qwen2_moe" ? 4 : 8});
  if (f.ok() && m.top_k > m.experts) {
    f.fail("num_experts_per_tok", std::to_string(m.top_k) + " exceeds the " + std::to_string(m.experts) + " experts of " +
                                      experts_key + "; a token is routed to at most every expert once");
  }
  if (f.ok() && m.experts > graph::kMaxExperts) {
    f.fail(experts_key, std::to_string(m.experts) + " is more than the " + std::to_string(graph::kMaxExperts) +
                            " experts memplan routes among");
  }
  const double coef = f.number("router_aux_loss_coef", 0.001, 0.0, 1e6);
  m.aux_loss_coef = f.boolean("output_router_logits", false) ? coef : 0.0;
  if (mixtral) {
    m.normalize_top_k = true;  // softmax over the chosen experts' logits
    if (f.number("router_jitter_noise", 0.0, 0.0, 1e6) > 0.0) {
      f.fail("router_jitter_noise", "is not supported: memplan's router takes no noise; set it to 0.0");
    }
  } else {
    // OLMoE's experts are intermediate_size wide (it has no dense MLP).
    m.expert_ffn = olmoe ? c.llama.ffn : f.size({"moe_intermediate_size"});
    m.normalize_top_k = f.boolean("norm_topk_prob", false);
    m.sparse_step = f.size({"decoder_sparse_step"}, std::int64_t{1});
    m.dense_layers = f.indices("mlp_only_layers");
    for (std::int64_t layer : m.dense_layers) {
      if (f.ok() && layer >= c.llama.layers) {
        f.fail("mlp_only_layers", "layer " + std::to_string(layer) + " is not among the " + std::to_string(c.llama.layers) +
                                      " layers of num_hidden_layers");
      }
    }
    if (c.model_type == "qwen2_moe") m.shared_ffn = f.size({"shared_expert_intermediate_size"});
  }
  const std::int64_t F = m.expert_ffn > 0 ? m.expert_ffn : c.llama.ffn;
  check_weight(f, std::string(experts_key) + " x " + (mixtral || olmoe ? "intermediate_size" : "moe_intermediate_size") + " x hidden_size",
               {m.experts, F, c.llama.width});
  if (m.shared_ffn > 0) check_weight(f, "shared_expert_intermediate_size x hidden_size", {m.shared_ffn, c.llama.width});
}

void read_llama(Fields& f, HfConfig& c) {
  LlamaConfig& l = c.llama;
  l.width = f.size({"hidden_size"});
  l.layers = f.size({"num_hidden_layers"});
  l.heads = f.size({"num_attention_heads"});
  l.kv_heads = f.size({"num_key_value_heads"}, l.heads);  // absent: multi-head attention
  l.ffn = f.size({"intermediate_size"});
  l.vocab = f.size({"vocab_size"});
  c.positions = f.size({"max_position_embeddings"});
  l.context = c.positions;
  const bool gemma3 = c.model_type == "gemma3_text";
  const bool gemma = c.model_type == "gemma" || c.model_type == "gemma2" || gemma3;
  l.tied_head = f.boolean("tie_word_embeddings", gemma);  // GemmaConfig ties them unless told not to
  l.rope_base = static_cast<float>(f.number("rope_theta", gemma3 ? 1e6 : 10000.0, 1.0, 1e12));
  f.number("rms_norm_eps", 1e-6, 0.0, 1.0);
  // The gated MLP's activation: SiLU (SwiGLU) for llama and its kin; Gemma's GeGLU takes the
  // tanh-approximated GELU (hidden_activation, which overrides hidden_act).
  const std::string hidden_activation = f.text("hidden_activation");
  const char* act_key = hidden_activation.empty() ? "hidden_act" : "hidden_activation";
  l.gate = activation(f, act_key, hidden_activation.empty() ? f.text("hidden_act") : hidden_activation,
                      gemma ? LlamaConfig::Gate::gelu : LlamaConfig::Gate::silu);
  l.scale_embeddings = gemma;  // Gemma multiplies the embeddings by sqrt(hidden_size)
  f.expect_object_or_absent("rope_scaling");  // longer contexts: positions, not memory
  // Sliding windows (LlamaConfig::sliding_window): every layer of mistral, mixtral and phi3;
  // qwen2's (and its MoE's) from max_window_layers on when use_sliding_window; gemma2's every
  // other layer (below). qwen3 configs carry the keys with use_sliding_window false.
  const std::int64_t window = f.size({"sliding_window"}, std::int64_t{0});
  const bool use_window = f.boolean("use_sliding_window", false);
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen2_moe" || c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  if (qwen) {
    const std::int64_t window_layers = f.size({"max_window_layers"}, l.layers);
    if (use_window && window > 0) {
      l.sliding_window = window;
      l.window_first_layer = window_layers;
    }
  } else if (c.model_type == "mistral" || c.model_type == "mixtral" || c.model_type == "phi3") {
    l.sliding_window = window;
  }
  const bool attention_bias = f.boolean("attention_bias", false);
  if (f.boolean("mlp_bias", false)) f.fail("mlp_bias", "true is not supported: memplan's SwiGLU MLP has no biases");
  // Qwen2's attention always has q, k and v biases (and none on o_proj); Llama's attention_bias
  // puts one on all four.
  l.qkv_bias = c.model_type == "qwen2" || c.model_type == "qwen2_moe" || attention_bias;
  l.o_bias = attention_bias;
  // Qwen3 normalises each head's queries and keys (q_norm, k_norm), and its head size is its own
  // setting (Qwen3-0.6B: 16 heads of 128 over a width of 1024).
  if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") l.qk_norm = LlamaConfig::QkNorm::per_head;
  l.head_dim = f.size({"head_dim"}, std::int64_t{gemma3 ? 256 : 0});
  l.attention_dropout = dropout(f, {"attention_dropout"}, 0.0);
  if (c.model_type == "phi3") {
    // Phi-3 stores q, k and v as one qkv_proj and gate and up as one gate_up_proj: the same
    // parameters and activations as separate projections. Dropout rates are its own keys: on
    // each sublayer's output (resid_pdrop) and the embeddings (embd_pdrop).
    l.residual_dropout = dropout(f, {"resid_pdrop"}, 0.0);
    l.embedding_dropout = dropout(f, {"embd_pdrop"}, 0.0);
    f.size({"original_max_position_embeddings"}, std::int64_t{0});
  }
  if (gemma3) {
    // Gemma 3: Gemma-2's norms on both sides of each sublayer and scaled scores, per-head q/k
    // norms, no soft-capping by default; five windowed (local) layers to one global, the local
    // ones rotating with their own base. Which layers: layer_types when given, else
    // sliding_window_pattern (transformers' is_sliding = (layer + 1) % pattern != 0).
    l.pre_norm = l.post_norm = true;
    l.qk_norm = LlamaConfig::QkNorm::per_head;
    l.query_scale = static_cast<float>(f.number("query_pre_attn_scalar", 256.0, 1e-6, 1e12));
    l.attn_softcap = static_cast<float>(f.number_or_off("attn_logit_softcapping", 0.0, 1e-6, 1e12));
    l.final_softcap = static_cast<float>(f.number_or_off("final_logit_softcapping", 0.0, 1e-6, 1e12));
    l.sliding_window = f.size({"sliding_window"}, std::int64_t{4096});
    l.local_rope_base = static_cast<float>(f.number("rope_local_base_freq", 10000.0, 1.0, 1e12));
    const std::vector<std::string> types = f.strings("layer_types");
    const std::int64_t pattern = f.size({"sliding_window_pattern"}, std::int64_t{6});
    if (!types.empty() && static_cast<std::int64_t>(types.size()) != l.layers) {
      f.fail("layer_types", "lists " + std::to_string(types.size()) + " layers; num_hidden_layers is " + std::to_string(l.layers));
    }
    for (std::int64_t layer = 0; f.ok() && layer < l.layers; ++layer) {
      if (types.empty()) {
        l.windowed_layers.push_back((layer + 1) % pattern != 0);
        continue;
      }
      const std::string& t = types[static_cast<std::size_t>(layer)];
      if (t != "sliding_attention" && t != "full_attention") {
        f.fail("layer_types", "'" + t.substr(0, 40) + "' is not sliding_attention or full_attention");
      }
      l.windowed_layers.push_back(t == "sliding_attention");
    }
    f.text("cache_implementation");
  }
  if (c.model_type == "stablelm") {
    // StableLM: LayerNorms, rotary over partial_rotary_factor of each head (a quarter by
    // default), q/k/v biases by use_qkv_bias. Its hidden_dropout drops the MLP's output only,
    // which memplan's residual dropout (both sublayers) is not: refused above 0.
    l.norm = LlamaConfig::Norm::layer;
    l.qkv_bias = f.boolean("use_qkv_bias", false);
    f.number("layer_norm_eps", 1e-5, 0.0, 1.0);
    expect_no_dropout(f, {"hidden_dropout"});
    if (f.boolean("qk_layernorm", false)) f.fail("qk_layernorm", "true is not supported: per-head LayerNorms of q and k are not planned");
    l.parallel_residual = f.boolean("use_parallel_residual", false);
  }
  if (c.model_type == "olmoe") {
    // OLMoE: OLMo's whole-projection q/k norms over a mixture of experts in every layer.
    l.qk_norm = LlamaConfig::QkNorm::whole;
    if (f.number_or_off("clip_qkv", 0.0, 0.0, 1e12) > 0.0) f.fail("clip_qkv", "is not supported: memplan does not clamp q, k and v; set it to null");
  }
  if (c.model_type == "granite") {
    // Granite's multipliers (GraniteConfig's defaults 1): the embeddings by embedding_multiplier,
    // each sublayer's output by residual_multiplier, scores by attention_multiplier in place of
    // head_size^-1/2, the logits divided by logits_scaling.
    l.embedding_multiplier = static_cast<float>(f.number("embedding_multiplier", 1.0, 1e-12, 1e12));
    l.residual_multiplier = static_cast<float>(f.number("residual_multiplier", 1.0, 1e-12, 1e12));
    l.attention_multiplier = static_cast<float>(f.number("attention_multiplier", 1.0, 1e-12, 1e12));
    l.logit_scale = static_cast<float>(1.0 / f.number("logits_scaling", 1.0, 1e-12, 1e12));
  }
  if (c.model_type == "gemma2") {
    // Gemma-2: norms before and after each sublayer, scores scaled by query_pre_attn_scalar^-1/2
    // and soft-capped, logits soft-capped (null switches a cap off); a sliding window on every
    // other layer from the first (transformers' is_sliding = not layer_idx % 2).
    l.pre_norm = l.post_norm = true;
    l.sliding_window = f.size({"sliding_window"}, std::int64_t{4096});  // layers 0, 2, 4, ...
    l.window_layer_period = 2;
    l.query_scale = static_cast<float>(f.number("query_pre_attn_scalar", 256.0, 1e-6, 1e12));
    l.attn_softcap = static_cast<float>(f.number_or_off("attn_logit_softcapping", 50.0, 1e-6, 1e12));
    l.final_softcap = static_cast<float>(f.number_or_off("final_logit_softcapping", 30.0, 1e-6, 1e12));
    f.text("cache_implementation");  // the KV cache's layout in transformers, not the model
  }
  if (c.model_type == "olmo2") {
    // OLMo-2 normalises each sublayer's output before the residual add (no norm before it) and
    // its queries and keys over the whole projection.
    l.pre_norm = false;
    l.post_norm = true;
    l.qk_norm = LlamaConfig::QkNorm::whole;
  }
  if (c.model_type == "mixtral" || c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe" || c.model_type == "olmoe") {
    read_moe(f, c);
  }
  check_decoder(f, l, "hidden_size");
  // StableLmConfig rotates a quarter of each head unless told otherwise.
  if (f.ok()) l.rotary_dims = rotary_dims(f, "partial_rotary_factor", l.head_size(), c.model_type == "stablelm" ? 0.25 : 1.0);
}

// GPT-NeoX (Pythia): LayerNorms, fused q/k/v with biases, a plain GELU MLP with biases, attention
// and MLP in parallel on the residual (use_parallel_residual), rotary over rotary_pct of each head.
void read_gpt_neox(Fields& f, HfConfig& c) {
  LlamaConfig& l = c.llama;
  l.width = f.size({"hidden_size"});
  l.layers = f.size({"num_hidden_layers"});
  l.heads = f.size({"num_attention_heads"});
  l.kv_heads = l.heads;
  l.ffn = f.size({"intermediate_size"});
  l.vocab = f.size({"vocab_size"});
  c.positions = f.size({"max_position_embeddings"});
  l.context = c.positions;
  l.tied_head = f.boolean("tie_word_embeddings", false);
  std::string base_key = "rotary_emb_base";
  const json* base = f.find({"rotary_emb_base", "rope_theta"}, &base_key);
  l.rope_base = static_cast<float>(base == nullptr ? 10000.0 : f.number(base_key.c_str(), 10000.0, 1.0, 1e12));
  f.number("layer_norm_eps", 1e-5, 0.0, 1.0);
  f.expect_object_or_absent("rope_scaling");
  expect_no_dropout(f, {"hidden_dropout", "attention_dropout", "classifier_dropout"});
  l.norm = LlamaConfig::Norm::layer;
  l.gated_mlp = false;
  l.mlp_bias = true;
  l.gate = activation(f, "hidden_act", f.text("hidden_act"), LlamaConfig::Gate::gelu);
  l.qkv_bias = l.o_bias = f.boolean("attention_bias", true);
  l.parallel_residual = f.boolean("use_parallel_residual", true);
  check_decoder(f, l, "hidden_size");
  if (f.ok()) l.rotary_dims = rotary_dims(f, "rotary_pct", l.head_size());
}

// StarCoder2: LayerNorms, grouped-query attention and a plain GELU MLP (c_fc, c_proj), biases on
// every projection unless use_bias is false, a sliding window on every layer, dropout on the
// embeddings, the sublayers' outputs and the attention probabilities, tied embeddings by default
// (Starcoder2Config's defaults where a key is absent).
void read_starcoder2(Fields& f, HfConfig& c) {
  LlamaConfig& l = c.llama;
  l.width = f.size({"hidden_size"});
  l.layers = f.size({"num_hidden_layers"});
  l.heads = f.size({"num_attention_heads"});
  l.kv_heads = f.size({"num_key_value_heads"}, std::int64_t{2});
  l.ffn = f.size({"intermediate_size"});
  l.vocab = f.size({"vocab_size"});
  c.positions = f.size({"max_position_embeddings"}, std::int64_t{4096});
  l.context = c.positions;
  l.tied_head = f.boolean("tie_word_embeddings", true);
  l.rope_base = static_cast<float>(f.number("rope_theta", 10000.0, 1.0, 1e12));
  f.number("norm_epsilon", 1e-5, 0.0, 1.0);
  f.expect_object_or_absent("rope_scaling");
  l.norm = LlamaConfig::Norm::layer;
  l.gated_mlp = false;
  l.mlp_up_name = "c_fc";
  l.mlp_down_name = "c_proj";
  l.gate = activation(f, "hidden_act", f.text("hidden_act"), LlamaConfig::Gate::gelu);
  l.qkv_bias = l.o_bias = l.mlp_bias = f.boolean("use_bias", true);
  l.sliding_window = f.size({"sliding_window"}, std::int64_t{0});
  l.embedding_dropout = dropout(f, {"embedding_dropout"}, 0.0);
  l.residual_dropout = dropout(f, {"residual_dropout"}, 0.0);
  l.attention_dropout = dropout(f, {"attention_dropout"}, 0.0);
  check_decoder(f, l, "hidden_size");
}

// DeepSeek-V2 and V3 (Kimi K2 keeps V3's layout): multi-head latent attention (LlamaConfig::Mla),
// dense MLPs in the first first_k_dense_replace layers and DeepSeek's mixture of experts in the
// rest: n_routed_experts of moe_intermediate_size, n_shared_experts summed into one ungated MLP,
// softmax or sigmoid scores (scoring_func), the choice greedy, group-limited by each group's best
// expert (group_limited_greedy) or its two best with a correction bias (noaux_tc), the gates
// renormalised (norm_topk_prob) and scaled by routed_scaling_factor. A YaRN rope_scaling scales
// the scores by mscale^2 (0.1 mscale_all_dim ln(factor) + 1, squared) over qk_head_dim^-1/2.
void read_deepseek(Fields& f, HfConfig& c) {
  LlamaConfig& l = c.llama;
  l.width = f.size({"hidden_size"});
  l.layers = f.size({"num_hidden_layers"});
  l.heads = f.size({"num_attention_heads"});
  l.kv_heads = l.heads;  // every head has its own key and value (from the shared latent)
  f.size({"num_key_value_heads"}, l.heads);
  l.ffn = f.size({"intermediate_size"});
  l.vocab = f.size({"vocab_size"});
  c.positions = f.size({"max_position_embeddings"}, std::int64_t{4096});
  l.context = c.positions;
  l.tied_head = f.boolean("tie_word_embeddings", false);
  l.rope_base = static_cast<float>(f.number("rope_theta", 10000.0, 1.0, 1e12));
  f.number("rms_norm_eps", 1e-6, 0.0, 1.0);
  l.gate = activation(f, "hidden_act", f.text("hidden_act"), LlamaConfig::Gate::silu);
  l.attention_dropout = dropout(f, {"attention_dropout"}, 0.0);
  if (f.boolean("attention_bias", false)) f.fail("attention_bias", "true is not supported: memplan's latent attention has no biases");
  LlamaConfig::Mla& m = l.mla;
  m.q_lora_rank = f.size({"q_lora_rank"}, std::int64_t{0});  // null: one q_proj (DeepSeek-V2-Lite)
  m.kv_lora_rank = f.size({"kv_lora_rank"});
  m.qk_nope = f.size({"qk_nope_head_dim"});
  m.qk_rope = f.size({"qk_rope_head_dim"});
  m.v_head = f.size({"v_head_dim"});
  if (f.ok() && m.qk_rope % 2 != 0) f.fail("qk_rope_head_dim", std::to_string(m.qk_rope) + " is odd; rotary needs an even count");
  l.head_dim = m.qk_head();
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_head()));
  std::string which = "rope_scaling";
  if (const json* rs = f.find({"rope_scaling"}, &which); rs != nullptr && rs->is_object()) {
    const std::string type = rs->value("type", rs->value("rope_type", std::string()));
    const double factor = rs->contains("factor") && (*rs)["factor"].is_number() ? (*rs)["factor"].get<double>() : 1.0;
    const double all_dim = rs->contains("mscale_all_dim") && (*rs)["mscale_all_dim"].is_number() ? (*rs)["mscale_all_dim"].get<double>() : 0.0;
    if (type == "yarn" && factor > 1.0 && all_dim > 0.0) {
      const double mscale = 0.1 * all_dim * std::log(factor) + 1.0;
      scale *= mscale * mscale;
    }
  } else if (rs != nullptr) {
    f.fail("rope_scaling", "expected an object, got " + kind_of(*rs));
  }
  l.attention_multiplier = static_cast<float>(scale);
  // The mixture of experts, from layer first_k_dense_replace on.
  LlamaConfig::Moe& e = l.moe;
  e.experts = f.size({"n_routed_experts"});
  e.top_k = f.size({"num_experts_per_tok"});
  e.expert_ffn = f.size({"moe_intermediate_size"});
  e.shared_ffn = f.size({"n_shared_experts"}, std::int64_t{0}) * e.expert_ffn;
  e.shared_gate = false;
  e.normalize_top_k = f.boolean("norm_topk_prob", false);
  e.routed_scale = static_cast<float>(f.number("routed_scaling_factor", 1.0, 1e-6, 1e6));
  const std::int64_t dense = f.size({"first_k_dense_replace"}, std::int64_t{0});
  for (std::int64_t layer = 0; layer < std::min(dense, l.layers); ++layer) e.dense_layers.push_back(layer);
  if (f.size({"moe_layer_freq"}, std::int64_t{1}) != 1) {
    f.fail("moe_layer_freq", "must be 1: memplan plans a mixture in every layer from first_k_dense_replace on");
  }
  const std::string scoring = f.text("scoring_func");
  if (!scoring.empty() && scoring != "softmax" && scoring != "sigmoid") f.fail("scoring_func", "'" + scoring + "' is not softmax or sigmoid");
  e.sigmoid_scores = scoring == "sigmoid";
  const std::string method = f.text("topk_method");
  const std::int64_t groups = f.size({"n_group"}, std::int64_t{1});
  const std::int64_t top_groups = f.size({"topk_group"}, std::int64_t{1});
  if (method == "noaux_tc" || method == "group_limited_greedy") {
    e.expert_groups = groups;
    e.top_groups = top_groups;
    e.group_top2 = method == "noaux_tc";
    e.choice_bias = method == "noaux_tc";
  } else if (!method.empty() && method != "greedy") {
    f.fail("topk_method", "'" + method + "' is not greedy, group_limited_greedy or noaux_tc");
  }
  if (f.ok() && e.expert_groups > 1 && (e.experts % e.expert_groups != 0 || top_groups * (e.experts / e.expert_groups) < e.top_k)) {
    f.fail("n_group", std::to_string(e.experts) + " experts in " + std::to_string(groups) + " groups, topk_group " +
                          std::to_string(top_groups) + ", cannot hold num_experts_per_tok " + std::to_string(e.top_k));
  }
  if (f.ok() && e.top_k > e.experts) f.fail("num_experts_per_tok", "exceeds n_routed_experts");
  if (f.ok() && e.experts > graph::kMaxExperts) f.fail("n_routed_experts", "is more than the experts memplan routes among");
  // Read and left out: the sequence-level auxiliary loss (aux_loss_alpha, seq_aux) is not added;
  // ep_size is the released code's expert parallelism; the multi-token prediction module
  // (num_nextn_predict_layers) is not part of the model transformers builds, nor of memplan's.
  f.number("aux_loss_alpha", 0.0, 0.0, 1e6);
  f.boolean("seq_aux", false);
  f.size({"ep_size"}, std::int64_t{1});
  if (f.size({"num_nextn_predict_layers"}, std::int64_t{0}) > 0 && f.ok()) {
    c.not_counted = "the multi-token prediction module (num_nextn_predict_layers), which transformers does not build either";
  }
  check_weight(f, "n_routed_experts x moe_intermediate_size x hidden_size", {e.experts, e.expert_ffn, l.width});
  check_weight(f, "vocab_size x hidden_size", {l.vocab, l.width});
  check_weight(f, "intermediate_size x hidden_size", {l.ffn, l.width});
  check_weight(f, "num_attention_heads x (qk_nope_head_dim + v_head_dim) x kv_lora_rank",
               {l.heads, m.qk_nope + m.v_head, m.kv_lora_rank});
}

// OPT: learned positions from row 2 of a table of max_position_embeddings + 2, LayerNorms before
// each sublayer, q/k/v/out_proj and fc1/fc2 with biases, a ReLU MLP, dropout on each sublayer's
// output, tied embeddings. OPT-350m's projections between word_embed_proj_dim and the width and its
// norms after the residual add (do_layer_norm_before false) are refused.
void read_opt(Fields& f, HfConfig& c) {
  LlamaConfig& l = c.llama;
  l.width = f.size({"hidden_size"});
  l.layers = f.size({"num_hidden_layers"});
  l.heads = f.size({"num_attention_heads"});
  l.kv_heads = l.heads;
  l.ffn = f.size({"ffn_dim"});
  l.vocab = f.size({"vocab_size"});
  c.positions = f.size({"max_position_embeddings"}, std::int64_t{2048});
  c.learned_positions = true;
  l.context = c.positions;
  l.positions = LlamaConfig::Positions::learned;
  l.position_offset = 2;  // OPTLearnedPositionalEmbedding's offset
  l.position_table = c.positions + 2;
  l.tied_head = f.boolean("tie_word_embeddings", true);
  if (f.size({"word_embed_proj_dim"}, l.width) != l.width) {
    f.fail("word_embed_proj_dim", "differs from hidden_size: OPT-350m's project_in and project_out are not planned");
  }
  if (!f.boolean("do_layer_norm_before", true)) {
    f.fail("do_layer_norm_before", "false is not supported: memplan's decoder normalises before each sublayer");
  }
  if (!f.boolean("enable_bias", true)) f.fail("enable_bias", "false is not supported: OPT's projections carry biases");
  if (!f.boolean("layer_norm_elementwise_affine", true)) {
    f.fail("layer_norm_elementwise_affine", "false is not supported: memplan's LayerNorms have a weight and a bias");
  }
  l.norm = LlamaConfig::Norm::layer;
  l.gated_mlp = false;
  l.mlp_bias = l.qkv_bias = l.o_bias = true;
  l.mlp_up_name = "fc1";
  l.mlp_down_name = "fc2";
  l.attn_out_name = "out_proj";
  l.gate = activation(f, "activation_function", f.text("activation_function"), LlamaConfig::Gate::relu);
  l.residual_dropout = dropout(f, {"dropout"}, 0.0);
  l.attention_dropout = dropout(f, {"attention_dropout"}, 0.0);
  expect_no_dropout(f, {"activation_dropout", "layerdrop"});
  check_decoder(f, l, "hidden_size");
}

// GPT-BigCode (SantaCoder, StarCoder): GPT-2's layout (learned positions, LayerNorms, a GELU MLP
// with biases, tied embeddings) with one K/V head shared by all (multi_query) or one a head; its
// packed c_attn holds the same parameters as q, k and v projections.
void read_gpt_bigcode(Fields& f, HfConfig& c) {
  LlamaConfig& l = c.llama;
  l.width = f.size({"n_embd", "hidden_size"});
  l.layers = f.size({"n_layer", "num_hidden_layers"});
  l.heads = f.size({"n_head", "num_attention_heads"});
  l.kv_heads = f.boolean("multi_query", true) ? 1 : l.heads;
  const std::int64_t inner = l.width > std::numeric_limits<std::int64_t>::max() / 4 ? l.width : 4 * l.width;
  l.ffn = f.size({"n_inner"}, inner);
  l.vocab = f.size({"vocab_size"});
  c.positions = f.size({"n_positions", "max_position_embeddings"}, std::int64_t{1024});
  c.learned_positions = true;
  l.context = c.positions;
  l.positions = LlamaConfig::Positions::learned;
  l.position_table = c.positions;
  l.tied_head = f.boolean("tie_word_embeddings", true);
  f.number("layer_norm_epsilon", 1e-5, 0.0, 1.0);
  if (!f.boolean("scale_attn_weights", true)) f.fail("scale_attn_weights", "false is not supported: scores are scaled by head_size^-1/2");
  l.norm = LlamaConfig::Norm::layer;
  l.gated_mlp = false;
  l.mlp_bias = l.qkv_bias = l.o_bias = true;
  l.mlp_up_name = "c_fc";
  l.mlp_down_name = "c_proj";
  l.attn_out_name = "c_proj";
  l.gate = activation(f, "activation_function", f.text("activation_function"), LlamaConfig::Gate::gelu);
  l.residual_dropout = dropout(f, {"resid_pdrop"}, 0.0);
  l.embedding_dropout = dropout(f, {"embd_pdrop"}, 0.0);
  l.attention_dropout = dropout(f, {"attn_pdrop"}, 0.0);
  check_decoder(f, l, "n_embd", "multi_query");
}

// Falcon: LayerNorms, multi-query (or grouped, new_decoder_architecture) attention, a plain GELU
// MLP of ffn_hidden_size, attention and MLP in parallel from one norm (two with the new
// architecture), biases everywhere or nowhere (bias), tied embeddings by default.
void read_falcon(Fields& f, HfConfig& c) {
  LlamaConfig& l = c.llama;
  l.width = f.size({"hidden_size"});
  l.layers = f.size({"num_hidden_layers"});
  l.heads = f.size({"num_attention_heads"});
  const bool new_architecture = f.boolean("new_decoder_architecture", false);
  const bool multi_query = f.boolean("multi_query", true);
  // FalconAttention: num_kv_heads with the new architecture or without multi_query, else one.
  l.kv_heads = new_architecture || !multi_query ? f.size({"num_kv_heads"}, l.heads) : 1;
  // ffn_hidden_size absent: 4 hidden_size (kept representable; check_decoder bounds the weight).
  l.ffn = f.size({"ffn_hidden_size"}, l.width > std::numeric_limits<std::int64_t>::max() / 4 ? l.width : 4 * l.width);
  l.vocab = f.size({"vocab_size"});
  c.positions = f.size({"max_position_embeddings"}, std::int64_t{2048});
  l.context = c.positions;
  l.tied_head = f.boolean("tie_word_embeddings", true);
  l.rope_base = static_cast<float>(f.number("rope_theta", 10000.0, 1.0, 1e12));
  f.number("layer_norm_epsilon", 1e-5, 0.0, 1.0);
  f.expect_object_or_absent("rope_scaling");
  expect_no_dropout(f, {"hidden_dropout", "attention_dropout"});
  if (f.boolean("alibi", false)) f.fail("alibi", "true is not supported: memplan's decoder takes rotary positions (alibi false)");
  if (f.boolean("apply_residual_connection_post_layernorm", false)) {
    f.fail("apply_residual_connection_post_layernorm", "true is not supported: the residual adds the layer's input");
  }
  l.norm = LlamaConfig::Norm::layer;
  l.gated_mlp = false;
  l.gate = activation(f, "activation", f.text("activation"), LlamaConfig::Gate::gelu);
  l.qkv_bias = l.o_bias = l.mlp_bias = f.boolean("bias", false);
  l.parallel_residual = f.boolean("parallel_attn", true);
  // The new architecture's parallel block has a norm for each branch unless num_ln_in_parallel_attn is 1.
  const std::int64_t norms = f.size({"num_ln_in_parallel_attn"}, new_architecture ? 2 : 1);
  if (norms > 2) f.fail("num_ln_in_parallel_attn", "must be 1 or 2, got " + std::to_string(norms));
  l.shared_norm = l.parallel_residual && norms == 1;
  check_decoder(f, l, "hidden_size", "num_kv_heads");
}

void read_encoder(Fields& f, EncoderConfig& e) {
  e.width = f.size({"hidden_size"});
  e.layers = f.size({"num_hidden_layers"});
  e.heads = f.size({"num_attention_heads"});
  e.mlp = f.size({"intermediate_size"});
  f.number("layer_norm_eps", 1e-12, 0.0, 1.0);
  f.text("hidden_act");
  check_heads(f, e.width, e.heads, "hidden_size");
  check_weight(f, "intermediate_size x hidden_size", {e.mlp, e.width});
  check_weight(f, "hidden_size x hidden_size", {e.width, e.width});
}

void read_bert(Fields& f, HfConfig& c) {
  BertConfig& b = c.bert;
  read_encoder(f, b.encoder);
  b.encoder.dropout = dropout(f, {"hidden_dropout_prob", "attention_probs_dropout_prob"}, 0.1);
  b.vocab = f.size({"vocab_size"});
  c.positions = f.size({"max_position_embeddings"});
  b.max_positions = c.positions;
  b.seq = c.positions;
  c.learned_positions = true;
  b.token_types = f.size({"type_vocab_size"}, std::int64_t{2});
  if (!f.boolean("tie_word_embeddings", true)) {
    f.fail("tie_word_embeddings", "false is not supported: memplan's BERT decodes with the word embeddings");
  }
  const std::string position_type = f.text("position_embedding_type");
  if (!position_type.empty() && position_type != "absolute") {
    f.fail("position_embedding_type", "'" + position_type + "' is not supported (only \"absolute\")");
  }
  check_weight(f, "vocab_size x hidden_size", {b.vocab, b.encoder.width});
  check_weight(f, "max_position_embeddings x hidden_size", {c.positions, b.encoder.width});
  check_weight(f, "type_vocab_size x hidden_size", {b.token_types, b.encoder.width});
}

void read_vit(Fields& f, const json& j, HfConfig& c) {
  VitConfig& v = c.vit;
  read_encoder(f, v.encoder);
  v.encoder.dropout = dropout(f, {"hidden_dropout_prob", "attention_probs_dropout_prob"}, 0.0);
  c.image_size = f.size({"image_size"});
  c.patch_size = f.size({"patch_size"});
  v.image = c.image_size;
  v.patch = c.patch_size;
  v.channels = f.size({"num_channels"}, std::int64_t{3});
  if (!f.boolean("qkv_bias", true)) f.fail("qkv_bias", "false is not supported: memplan's ViT has q, k, v biases");
  // The classifier's classes: num_labels, or as many as id2label names; PretrainedConfig's
  // default is 2.
  std::int64_t labels = 2;
  f.mark_read("id2label");
  f.mark_read("label2id");  // id2label's inverse: the same classes
  if (auto it = j.find("id2label"); it != j.end() && !it->is_null()) {
    if (!it->is_object() || it->empty()) {
      f.fail("id2label", "expected a non-empty object of class names, got " + kind_of(*it));
    } else {
      labels = static_cast<std::int64_t>(it->size());
    }
  }
  const std::int64_t num_labels = f.size({"num_labels"}, labels);
  if (f.ok() && j.contains("id2label") && j.contains("num_labels") && !j["id2label"].is_null() && num_labels != labels) {
    f.fail("num_labels " + std::to_string(num_labels) + " differs from the " + std::to_string(labels) +
           " classes id2label names");
  }
  v.classes = num_labels;
  if (f.ok() && c.image_size % c.patch_size != 0) {
    f.fail("image_size " + std::to_string(c.image_size) + " is not a multiple of patch_size " +
           std::to_string(c.patch_size));
  }
  check_weight(f, "hidden_size x num_channels x patch_size^2", {v.encoder.width, v.channels, c.patch_size, c.patch_size});
  check_weight(f, "num_labels x hidden_size", {v.classes, v.encoder.width});
  // One image (num_channels x image_size^2 values) and the position table ((image_size /
  // patch_size)^2 + 1 rows) must be representable too.
  check_weight(f, "num_channels x image_size^2 (one image)", {v.channels, c.image_size, c.image_size});
  const std::int64_t side = c.image_size / c.patch_size;
  if (f.ok()) check_weight(f, "(image_size / patch_size)^2 + 1 positions x hidden_size", {side * side + 1, v.encoder.width});
}

// T5's MLP as transformers reads feed_forward_proj: "ACT" or "gated-ACT" ("gated-gelu" means the
// tanh GELU, computed as the erf form like the decoders' tanh GELUs: the same memory). The derived
// keys a saved config also carries (dense_act_fn, is_gated_act) must agree with it.
void read_t5_mlp(Fields& f, T5Config& t) {
  std::string proj = f.text("feed_forward_proj");
  if (proj.empty()) proj = "relu";
  const bool gated = proj.starts_with("gated-");
  const std::string act = gated ? proj.substr(6) : proj;
  if (act.empty()) f.fail("feed_forward_proj", "'" + proj + "' names no activation (e.g. \"gated-gelu\")");
  t.act = activation(f, "feed_forward_proj", act, Activation::relu);
  t.gated = gated;
  if (f.ok() && f.boolean("is_gated_act", gated) != gated) {
    f.fail("is_gated_act", std::string(gated ? "false" : "true") + " contradicts feed_forward_proj '" + proj + "'");
  }
  const std::string dense = f.text("dense_act_fn");
  if (f.ok() && !dense.empty() && dense != act && !(proj == "gated-gelu" && dense == "gelu_new")) {
    f.fail("dense_act_fn", "'" + dense.substr(0, 40) + "' contradicts feed_forward_proj '" + proj + "'");
  }
}

void read_t5(Fields& f, HfConfig& c) {
  T5Config& t = c.t5;
  t.vocab = f.size({"vocab_size"});
  t.width = f.size({"d_model"});
  t.head_size = f.size({"d_kv"});
  t.ffn = f.size({"d_ff"});
  t.heads = f.size({"num_heads"});
  t.layers = f.size({"num_layers"});
  t.decoder_layers = f.size({"num_decoder_layers"}, t.layers);
  t.buckets = f.size({"relative_attention_num_buckets"}, std::int64_t{32});
  t.max_distance = f.size({"relative_attention_max_distance"}, std::int64_t{128});
  t.dropout = dropout(f, {"dropout_rate"}, 0.1);
  t.norm_eps = static_cast<float>(f.number("layer_norm_epsilon", 1e-6, 0.0, 1.0));
  t.tied_head = f.boolean("tie_word_embeddings", true);
  read_t5_mlp(f, t);
  if (!f.boolean("is_encoder_decoder", true)) {
    f.fail("is_encoder_decoder", "false is not supported: memplan's t5 is the encoder-decoder (T5ForConditionalGeneration)");
  }
  // No learned positions: n_positions is only the length the model was trained at, the default.
  c.positions = f.size({"n_positions"}, std::int64_t{512});
  if (f.ok() && t.buckets < 4) {
    f.fail("relative_attention_num_buckets", std::to_string(t.buckets) + " is too few: the encoder's bidirectional "
           "buckets need at least 4 (two exact distances each way)");
  }
  if (f.ok() && t.max_distance <= t.buckets / 2) {
    f.fail("relative_attention_max_distance", std::to_string(t.max_distance) + " must exceed half of "
           "relative_attention_num_buckets " + std::to_string(t.buckets) + " (the distances bucketed exactly)");
  }
  check_weight(f, "vocab_size x d_model", {t.vocab, t.width});
  check_weight(f, "d_ff x d_model", {t.ffn, t.width});
  check_weight(f, "num_heads x d_kv x d_model", {t.heads, t.head_size, t.width});
}

// ", 8 experts (top 2) of 14336" for a mixture of experts, "" for a dense MLP.
std::string moe_summary(const LlamaConfig::Moe& m) {
  if (m.experts <= 0) return "";
  std::string s = ", " + std::to_string(m.experts) + " experts (top " + std::to_string(m.top_k) + ")";
  if (m.expert_ffn > 0) s += " of " + std::to_string(m.expert_ffn);
  if (m.shared_ffn > 0) s += " and a shared expert of " + std::to_string(m.shared_ffn);
  return s;
}

std::string family_name(HfFamily f) {
  switch (f) {
    case HfFamily::gpt2: return "gpt2";
    case HfFamily::llama: return "llama";
    case HfFamily::bert: return "bert";
    case HfFamily::vit: return "vit";
    case HfFamily::t5: return "t5";
  }
  return "?";
}

}  // namespace

std::string supported_model_types() {
  std::string s;
  for (const TypeRow& row : kModelTypes) s += (s.empty() ? "" : ", ") + std::string(row.model_type);
  return s;
}

std::string HfConfig::describe() const {
  if (!not_counted.empty()) {
    HfConfig inner = *this;
    inner.not_counted.clear();
    return inner.describe() + "; not counted: " + not_counted;
  }
  auto s = [](std::int64_t v) { return std::to_string(v); };
  switch (family) {
    case HfFamily::gpt2:
      return model_type + ": " + s(gpt.layers) + " layers, width " + s(gpt.width) + ", " + s(gpt.heads) + " heads, MLP " +
             s(gpt.mlp > 0 ? gpt.mlp : 4 * gpt.width) + ", vocab " + s(gpt.vocab) + ", " + s(positions) + " positions" +
             (gpt.tied_head ? "" : ", untied lm_head");
    case HfFamily::llama:
    {
      const char* act = activation_title(llama.gate);
      const std::string mlp = llama.gated_mlp ? std::string(llama.gate == LlamaConfig::Gate::silu ? "SwiGLU" : act + std::string("-gated MLP"))
                                              : act + std::string(" MLP");
      return model_type + ": " + s(llama.layers) + " layers, width " + s(llama.width) + ", " + s(llama.heads) +
             " heads" + (llama.kv_heads != llama.heads ? " (" + s(llama.kv_heads) + " K/V)" : "") + ", " + mlp + " " +
             s(llama.ffn) + ", vocab " + s(llama.vocab) +
             (llama.positions == LlamaConfig::Positions::learned ? ", learned positions" : ", rotary") +
             (llama.rotary_dims > 0 ? " on " + s(llama.rotary_dims) + " of " + s(llama.head_size()) + " channels" : "") +
             (llama.norm == LlamaConfig::Norm::layer ? ", LayerNorm" : "") + (llama.parallel_residual ? ", parallel residual" : "") +
             (!llama.pre_norm ? ", norms after each sublayer" : llama.post_norm ? ", norms before and after each sublayer" : "") +
             (llama.tied_head ? ", tied embeddings" : "") + (llama.qkv_bias ? ", q/k/v biases" : "") +
             (llama.attn_softcap > 0.0f ? ", soft-capped scores" : "") + (llama.final_softcap > 0.0f ? ", soft-capped logits" : "") +
             (llama.mla.active() ? ", latent attention (kv_lora_rank " + s(llama.mla.kv_lora_rank) +
                                       (llama.mla.q_lora_rank > 0 ? ", q_lora_rank " + s(llama.mla.q_lora_rank) : std::string()) + ")"
                                 : std::string()) +
             moe_summary(llama.moe);
    }
    case HfFamily::bert:
      return model_type + " (masked-LM head): " + s(bert.encoder.layers) + " layers, width " + s(bert.encoder.width) +
             ", " + s(bert.encoder.heads) + " heads, MLP " + s(bert.encoder.mlp) + ", vocab " + s(bert.vocab) + ", " +
             s(positions) + " positions";
    case HfFamily::vit:
      return model_type + ": " + s(patch_size) + "x" + s(patch_size) + " patches of " + s(image_size) + "x" +
             s(image_size) + ", " + s(vit.encoder.layers) + " layers, width " + s(vit.encoder.width) + ", " +
             s(vit.encoder.heads) + " heads, MLP " + s(vit.encoder.mlp) + ", " + s(vit.classes) + " classes";
    case HfFamily::t5:
    {
      const char* act = activation_title(t5.act);
      return model_type + " (encoder-decoder): " + s(t5.layers) + " encoder and " + s(t5.decoder_layers) +
             " decoder layers, width " + s(t5.width) + ", " + s(t5.heads) + " heads of " + s(t5.head_size) + ", " +
             (t5.gated ? std::string(act) + "-gated MLP " : std::string(act) + " MLP ") + s(t5.ffn) + ", vocab " +
             s(t5.vocab) + ", relative position buckets " + s(t5.buckets) + " up to " + s(t5.max_distance) +
             (t5.tied_head ? ", tied embeddings" : ", untied lm_head") + ", materialized attention";
    }
  }
  return model_type;
}

Result<HfConfig> parse_hf_config(std::string_view json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    return Error{source + ": not a JSON config (" + std::string(e.what()) + ")"};
  }
  if (!j.is_object()) return Error{source + ": a config.json holds a JSON object, got " + kind_of(j)};
  HfConfig c;
  Fields f(j, source);
  auto type = j.find("model_type");
  if (type == j.end() || type->is_null()) {
    return Error{source + ": model_type: missing (supported: " + supported_model_types() + ")"};
  }
  if (!type->is_string()) {
    return Error{source + ": model_type: expected a string, got " + kind_of(*type) + " (supported: " +
                 supported_model_types() + ")"};
  }
  c.model_type = type->get<std::string>();
  const TypeRow* row = nullptr;
  for (const TypeRow& r : kModelTypes) {
    if (c.model_type == r.model_type) row = &r;
  }
  if (row == nullptr) {
    // A multimodal config whose text decoder is a family memplan plans (Gemma 3 4B and up): the
    // text_config is the model planned, and the vision tower is said not to be counted.
    if (c.model_type == "gemma3") {
      auto text = j.find("text_config");
      if (text == j.end() || !text->is_object()) {
        return Error{source + ": model_type 'gemma3' (image and text): text_config: missing; memplan plans its text "
                              "decoder, described there"};
      }
      json inner = *text;
      if (!inner.contains("model_type")) inner["model_type"] = "gemma3_text";
      auto decoder = parse_hf_config(inner.dump(), source + " (text_config)");
      if (!decoder) return decoder.error();
      HfConfig out = std::move(decoder).value();
      out.not_counted = "the vision tower (vision_config) and the multimodal projector";
      out.text = std::string(json_text);
      return out;
    }
    for (const Unplanned& u : kNotPlanned) {
      if (c.model_type == u.model_type) {
        return Error{source + ": model_type '" + c.model_type + "' is not planned: memplan does not model " + u.missing +
                     " yet (supported: " + supported_model_types() + ")"};
      }
    }
    return Error{source + ": model_type '" + c.model_type.substr(0, 60) + "' is not supported (supported: " +
                 supported_model_types() + ")"};
  }
  c.family = row->family;
  f.mark_read("model_type");
  read_torch_dtype(f, c);
  switch (c.family) {
    case HfFamily::gpt2: read_gpt2(f, c); break;
    case HfFamily::llama:
      if (c.model_type == "gpt_neox") {
        read_gpt_neox(f, c);
      } else if (c.model_type == "falcon") {
        read_falcon(f, c);
      } else if (c.model_type == "starcoder2") {
        read_starcoder2(f, c);
      } else if (c.model_type == "deepseek_v2" || c.model_type == "deepseek_v3" || c.model_type == "kimi_k2") {
        read_deepseek(f, c);
      } else if (c.model_type == "opt") {
        read_opt(f, c);
      } else if (c.model_type == "gpt_bigcode") {
        read_gpt_bigcode(f, c);
      } else {
        read_llama(f, c);
      }
      break;
    case HfFamily::bert: read_bert(f, c); break;
    case HfFamily::vit: read_vit(f, j, c); break;
    case HfFamily::t5: read_t5(f, c); break;
  }
  if (!f.ok()) return f.error();
  c.unread_keys = f.unread();
  c.text = std::string(json_text);
  return c;
}

Result<HfConfig> read_hf_config(const std::string& path) {
  auto text = read_regular_file(path, kMaxConfigBytes, "Hugging Face config.json");
  if (!text) return text.error();
  return parse_hf_config(text.value(), path);
}

graph::Graph build_hf_forward(const HfConfig& config, std::int64_t batch, const ZooOptions& options, bool training) {
  if (!graph::is_floating(options.dtype)) throw graph::GraphError("a config's dtype must be fp32, bf16 or fp16");
  const std::int64_t seq = options.seq > 0 ? options.seq : config.positions;
  if (options.tensor_parallel.active() && config.family != HfFamily::gpt2 && config.family != HfFamily::llama) {
    throw graph::GraphError("--tensor-parallel splits the decoders (gpt2 and the rotary decoder families), not a " +
                            config.model_type + " model");
  }
  if (options.expert_parallel.active() && config.family != HfFamily::llama) {
    throw graph::GraphError("--expert-parallel splits a mixture of experts' experts; a " + config.model_type + " model has none");
  }
  switch (config.family) {
    case HfFamily::gpt2: {
      GptConfig c = config.gpt;
      c.context = seq;
      c.dtype = options.dtype;
      c.attention = options.attention;
      c.tensor_parallel = options.tensor_parallel;
      return build_gpt(c, batch, training);
    }
    case HfFamily::llama: {
      LlamaConfig c = config.llama;
      c.context = seq;
      c.dtype = options.dtype;
      c.attention = options.attention;
      c.tensor_parallel = options.tensor_parallel;
      c.expert_parallel = options.expert_parallel;
      if (!training) c.embedding_dropout = c.residual_dropout = c.attention_dropout = 0.0f;
      return build_llama(c, batch);
    }
    case HfFamily::bert: {
      BertConfig c = config.bert;
      c.seq = seq;
      c.encoder.dtype = options.dtype;
      c.encoder.attention = options.attention;
      if (!training) c.encoder.dropout = 0.0f;
      return build_bert(c, batch);
    }
    case HfFamily::vit: {
      VitConfig c = config.vit;
      c.image = options.image_size > 0 ? options.image_size : config.image_size;
      c.encoder.dtype = options.dtype;
      c.encoder.attention = options.attention;
      if (!training) c.encoder.dropout = 0.0f;
      return build_vit(c, batch);
    }
    case HfFamily::t5: {
      T5Config c = config.t5;
      c.seq = seq;
      c.target_seq = options.target_seq > 0 ? options.target_seq : seq;
      c.dtype = options.dtype;
      if (!training) c.dropout = 0.0f;
      return build_t5(c, batch);
    }
  }
  throw graph::GraphError("config of an unknown family " + family_name(config.family));
}

Result<HfConfig> shipped_config(std::string_view file) {
  for (const ShippedConfig& s : shipped_configs()) {
    if (s.file == file) return parse_hf_config(s.text, "models/configs/" + std::string(file));
  }
  return Error{"no shipped config named '" + std::string(file) + "'"};
}

}  // namespace memplan::models
