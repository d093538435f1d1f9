#include "memplan/models/model_ref.h"

#include <utility>

#include "memplan/import/onnx_source.h"
#include "memplan/models/model_source.h"
#include "memplan/models/zoo.h"

namespace memplan::models {
namespace {

// A size knob (graph/model_source.h) as the flag, or config field, that sets it.
std::string flag_name(const graph::SizeKnob& k, std::optional<std::int64_t> value) {
  const std::string v = value ? " " + std::to_string(*value) : "";
  if (k.key == "num_hidden_layers") return "num_hidden_layers" + v + (value ? " (the config's layer count)" : "");
  if (k.key == "hidden_count") return value ? "--hidden with " + std::to_string(*value) + " widths" : "the --hidden widths";
  if (k.key == "hidden" && k.position > 0) return "--hidden (width " + std::to_string(k.position) + ")" + v;
  static const std::pair<const char*, const char*> kFlags[] = {
      {"batch", "--batch"}, {"seq", "--seq"}, {"target_seq", "--target-seq"}, {"image_size", "--image-size"}, {"width", "--width"},
      {"layers", "--layers"}, {"hidden", "--hidden"}};
  for (const auto& [key, flag] : kFlags) {
    if (k.key == key) return flag + v;
  }
  return k.quantity + v;  // a knob no flag sets: its own name
}

Status check_floating(graph::DType dtype) {
  if (graph::is_floating(dtype)) return Status::success();
  return Error{"--dtype: " + std::string(graph::dtype_name(dtype)) + " is not a floating dtype"};
}

// The sizes train takes from the data (the GPT's vocabulary), or --vocab.
Status apply_data_sizes(ModelOptions& model, std::int64_t vocab) {
  Status s = set_data_sizes(model, vocab);
  if (s) return s;
  return Error{vocab > 0 ? "--vocab: " + s.error().message : s.error().message + "; or give --vocab N"};
}

// What a mixture of experts' plan assumes of the routing; nothing for other models.
void note_moe_capacity(const LlamaConfig& config, std::int64_t batch, std::int64_t seq, std::vector<std::string>& notes) {
  const std::string moe = describe_moe_capacity(config, batch * seq);
  if (!moe.empty()) notes.push_back("note: " + moe + " (at batch " + std::to_string(batch) + ")");
}

Result<ResolvedModel> resolve_onnx(const ModelRef& ref, const graph::OptimizerConfig& optimizer) {
  if (ref.seq > 0 || ref.target_seq > 0 || ref.image_size > 0) {
    return Error{"--seq, --target-seq and --image-size do not apply to --onnx: the file fixes every size but the batch"};
  }
  if (ref.vocab > 0) return Error{"--vocab does not apply to --onnx: the file fixes every size but the batch"};
  if (ref.attention) return Error{"--attention does not apply to --onnx: the file's own attention ops are imported as they are"};
  if (ref.expert_parallel > 1) return Error{"--expert-parallel does not apply to --onnx: an imported graph has no experts to split"};
  if (ref.tensor_parallel > 1) {
    return Error{"--tensor-parallel does not apply to --onnx: an imported graph is planned whole on each rank (use "
                 "--devices for data parallelism)"};
  }
  if (Status s = check_floating(ref.dtype); !s) return s.error();
  auto model = import::OnnxModel::load(ref.onnx);
  if (!model) return Error{"--onnx: " + model.error().message};
  import::ImportOptions options;
  options.loss = ref.loss;
  options.output = ref.output;
  options.dtype = ref.dtype;
  ResolvedModel resolved;
  resolved.step = planner::StepDescription::of_source(import::onnx_source(std::move(model).value(), options),
                                                      ref.batch > 0 ? ref.batch : 1, optimizer);
  // An unsupported op or inconsistent shapes are the file's fault: said now, naming the node.
  try {
    (void)resolved.step.source->forward(1);
  } catch (const graph::SizeError&) {
  } catch (const graph::GraphError& e) {
    return Error{"--onnx: " + std::string(e.what())};
  }
  if (Status s = check_step_size_named(resolved.step); !s) return s.error();
  return resolved;
}

// A config reference: its sizes checked against the config's family.
Result<ResolvedModel> resolve_config(const ModelRef& ref, const graph::OptimizerConfig& optimizer) {
  ResolvedModel resolved;
  auto config = read_ref_config(ref, resolved.notes);
  if (!config) return config.error();
  const HfConfig& c = config.value();
  if (ref.seq > 0 && c.vision()) return Error{"--seq applies to language models; the config " + ref.config + " is a " + c.model_type};
  if (ref.image_size > 0 && !c.vision()) {
    return Error{"--image-size applies to vision models; the config " + ref.config + " is a " + c.model_type};
  }
  if (ref.target_seq > 0 && !c.encoder_decoder()) {
    return Error{"--target-seq applies to encoder-decoder configs (t5); the config " + ref.config + " is a " + c.model_type};
  }
  if (Status s = check_encoder_decoder_attention(c.encoder_decoder(), ref.attention, ref.config); !s) return s.error();
  if (ref.seq > 0 && c.learned_positions && ref.seq > c.positions) {
    return Error{"--seq " + std::to_string(ref.seq) + " exceeds the " + std::to_string(c.positions) + " learned positions of " +
                 ref.config};
  }
  if (ref.image_size > 0 && ref.image_size % c.patch_size != 0) {
    return Error{"--image-size " + std::to_string(ref.image_size) + " is not a multiple of the patch size " +
                 std::to_string(c.patch_size) + " of " + ref.config};
  }
  if (Status s = check_floating(ref.dtype); !s) return s.error();
  ModelOptions model;
  model.name = ref.config;
  model.config = c;
  model.zoo = {ref.seq, ref.image_size, ref.dtype};
  model.zoo.attention = ref.attention.value_or(AttentionKind::fused);  // every config is a transformer
  model.zoo.target_seq = ref.target_seq;
  set_tensor_parallel(model, {ref.tensor_parallel, 0, ref.sequence_parallel});
  set_expert_parallel(model, {ref.expert_parallel, 0});
  if (Status s = apply_data_sizes(model, ref.vocab); !s) return s.error();
  graph::ModelSource source = registry_source(std::move(model));
  const std::int64_t batch = ref.batch > 0 ? ref.batch : source.default_batch;
  if (c.family == HfFamily::llama) note_moe_capacity(c.llama, batch, ref.seq > 0 ? ref.seq : c.positions, resolved.notes);
  resolved.step = planner::StepDescription::of_source(std::move(source), batch, optimizer);
  resolved.config = std::move(config).value();
  auto problem = planner::find_step_size_problem(resolved.step);
  if (!problem) return resolved;
  std::string message = planner::describe(*problem, ref_size_naming());
  if (ref.seq == 0 && problem->kind == planner::StepSizeProblem::Kind::too_large && problem->knob.key == "seq") {
    message += " (without --seq, the config's " + std::to_string(c.positions) + " positions are the sequence length)";
  }
  return Error{message};
}

Result<ResolvedModel> resolve_name(const ModelRef& ref, const graph::OptimizerConfig& optimizer) {
  auto model = registry_options(ref);
  if (!model) return model.error();
  ResolvedModel resolved;
  graph::ModelSource source = registry_source(std::move(model).value());
  const std::int64_t batch = ref.batch > 0 ? ref.batch : source.default_batch;
  if (auto llama = zoo_llama_config(ref.name, {ref.seq}); llama.ok()) {
    note_moe_capacity(llama.value(), batch, llama.value().context, resolved.notes);
  }
  resolved.step = planner::StepDescription::of_source(std::move(source), batch, optimizer);
  if (Status s = check_step_size_named(resolved.step); !s) return s.error();
  return resolved;
}

}  // namespace

Status check_encoder_decoder_attention(bool encoder_decoder, std::optional<AttentionKind> asked, const std::string& model) {
  if (!encoder_decoder || asked != AttentionKind::fused) return Status::success();
  return Error{"--attention fused does not apply to " + model + ": T5's relative position bias adds onto the attention "
               "scores, so its attention is materialized (leave out --attention)"};
}


Result<HfConfig> read_ref_config(const ModelRef& ref, std::vector<std::string>& notes) {
  auto config = read_hf_config(ref.config);
  if (!config) return Error{"--config " + config.error().message};
  HfConfig& c = config.value();
  if (ref.moe_capacity_factor) {
    if (c.llama.moe.experts <= 0) {
      return Error{"--moe-capacity-factor applies to mixtures of experts (mixtral, qwen2_moe, qwen3_moe); " + ref.config +
                   " is a " + c.model_type + " without experts"};
    }
    c.llama.moe.capacity_factor = *ref.moe_capacity_factor;
  }
  if (ref.list_unread_config_keys) {
    std::string keys;
    for (const std::string& key : c.unread_keys) keys += (keys.empty() ? "" : ", ") + key;
    notes.push_back(ref.config + ": " + std::to_string(c.unread_keys.size()) + " key" + (c.unread_keys.size() == 1 ? "" : "s") +
                    " memplan does not read (for model_type " + c.model_type + " none changes what it plans)" +
                    (keys.empty() ? "" : ": " + keys));
  }
  return config;
}

std::string ModelRef::label() const { return !onnx.empty() ? onnx : !config.empty() ? config : name; }

planner::SizeNaming ref_size_naming() { return {flag_name, "flags"}; }

Status check_step_size_named(const planner::StepDescription& step) {
  if (auto problem = planner::find_step_size_problem(step)) return Error{planner::describe(*problem, ref_size_naming())};
  return Status::success();
}

Result<ModelOptions> registry_options(const ModelRef& ref) {
  const ModelInfo* info = find_model(ref.name);
  if (info == nullptr) return Error{"--model: unknown model '" + ref.name + "'"};
  const bool language = !info->vision && ref.name != "mlp";
  if (ref.seq > 0 && !language) return Error{"--seq applies to language models; '" + ref.name + "' takes none"};
  if (ref.image_size > 0 && !info->vision) {
    return Error{"--image-size applies to vision models (cnn, vit-b16, resnet50), not '" + ref.name + "'"};
  }
  if (Status s = check_floating(ref.dtype); !s) return s.error();
  const ZooModel* zoo = find_zoo_model(ref.name);
  const bool encoder_decoder = zoo != nullptr && zoo->encoder_decoder;
  if (ref.target_seq > 0 && !encoder_decoder) {
    return Error{"--target-seq applies to encoder-decoder models (t5-small, t5-base, flan-t5-base, flan-t5-xl, a t5 "
                 "--config), not '" + ref.name + "'"};
  }
  if (Status s = check_encoder_decoder_attention(encoder_decoder, ref.attention, ref.name); !s) return s.error();
  if (ref.attention && !has_attention(ref.name)) {
    return Error{"--attention applies to transformers (gpt, the zoo's models but resnet50, and --config), not '" + ref.name + "'"};
  }
  ModelOptions model;
  model.name = ref.name;
  model.mlp.hidden = ref.hidden;
  if (ref.seq > 0) model.gpt.context = ref.seq;
  if (ref.image_size > 0) model.cnn.image = ref.image_size;
  model.zoo = {ref.seq, ref.image_size, ref.dtype};
  model.zoo.attention = model.gpt.attention = ref.attention.value_or(AttentionKind::fused);
  model.zoo.target_seq = ref.target_seq;
  set_tensor_parallel(model, {ref.tensor_parallel, 0, ref.sequence_parallel});
  set_expert_parallel(model, {ref.expert_parallel, 0});
  if (Status s = apply_data_sizes(model, ref.vocab); !s) return s.error();
  return model;
}

Result<ResolvedModel> resolve_model(const ModelRef& ref, const graph::OptimizerConfig& optimizer) {
  if (!ref.onnx.empty() && !ref.config.empty()) return Error{"--onnx and --config each name the model: give one"};
  if (ref.sequence_parallel && ref.tensor_parallel < 2) {
    return Error{"--sequence-parallel splits the rows tensor parallelism leaves whole: give --tensor-parallel T (2 or more) too"};
  }
  auto resolved = !ref.onnx.empty()     ? resolve_onnx(ref, optimizer)
                  : !ref.config.empty() ? resolve_config(ref, optimizer)
                                        : resolve_name(ref, optimizer);
  if (resolved) resolved.value().step.dtype = ref.dtype;  // mixed precision: every source's forward graph at the dtype
  return resolved;
}

Result<ServedDecoder> served_decoder(const ModelRef& ref) {
  ServedDecoder out;
  if (!ref.onnx.empty()) return Error{"--serve plans decoder models; --onnx " + ref.onnx + " is not one memplan can serve"};
  if (ref.name == "gpt" && ref.config.empty()) {
    auto model = registry_options(ref);
    if (!model) return model.error();
    out.gpt = model.value().gpt;
    out.gpt.dropout = 0.0f;
    out.seq = ref.seq;
    return out;
  }
  if (!ref.config.empty()) {
    auto config = read_ref_config(ref, out.notes);
    if (!config) return config.error();
    const HfConfig& c = config.value();
    out.seq = ref.seq > 0 ? ref.seq : c.positions;
    if (c.family == HfFamily::llama) {
      out.llama = c.llama;
      out.llama->context = out.seq;
      out.llama->dtype = ref.dtype;
    } else if (c.family == HfFamily::gpt2) {
      out.gpt = c.gpt;
      out.gpt.context = out.seq;
      out.gpt.dtype = ref.dtype;
      out.gpt.dropout = 0.0f;
    } else {
      return Error{"--serve plans decoder models; " + ref.config + " is a " + c.model_type};
    }
    return out;
  }
  ZooOptions zoo;
  zoo.dtype = ref.dtype;
  zoo.seq = ref.seq;
  out.seq = ref.seq;
  if (auto llama = zoo_llama_config(ref.name, zoo)) {
    out.llama = llama.value();
    return out;
  } else if (auto gpt = zoo_gpt_config(ref.name, zoo)) {
    out.gpt = gpt.value();
    return out;
  } else {
    return Error{"--serve plans the decoder models: gpt and the zoo's GPT-2 and LLaMA-family models (" + llama.error().message +
                 "; " + gpt.error().message + ")"};
  }
}

}  // namespace memplan::models
