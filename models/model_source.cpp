#include "memplan/models/model_source.h"

#include <algorithm>
#include <memory>
#include <span>
#include <utility>

#include "memplan/models/text_dataset.h"

namespace memplan::models {
namespace {

using Sizes = std::span<const std::int64_t>;

graph::SizeKnob knob(std::string key, std::string quantity, std::int64_t value, std::int64_t usual,
                     std::int64_t granule = 1) {
  graph::SizeKnob k;
  k.key = std::move(key);
  k.quantity = std::move(quantity);
  k.value = value;
  k.usual = std::max<std::int64_t>(usual, 1);
  k.granule = std::max<std::int64_t>(granule, 1);
  return k;
}

graph::SizeKnob layer_count(std::string key, std::string quantity, std::int64_t value, std::int64_t usual,
                            std::string unit, bool searched) {
  graph::SizeKnob k = knob(std::move(key), std::move(quantity), value, usual);
  k.layers = true;
  k.searched = searched;
  k.unit = std::move(unit);
  return k;
}

std::int64_t& config_layers(HfConfig& c) {
  switch (c.family) {
    case HfFamily::gpt2: return c.gpt.layers;
    case HfFamily::llama: return c.llama.layers;
    case HfFamily::bert: return c.bert.encoder.layers;
    case HfFamily::vit: return c.vit.encoder.layers;
    case HfFamily::t5: return c.t5.layers;  // the encoder's; the decoder's stay as the file says
  }
  return c.gpt.layers;
}

// A config: its sequence length (or image size) and its layer count, which the file fixes (so it
// is only checked, never searched). Without --seq the config's positions are the length; the
// search for a length that works starts from a modest one (a config may allow far more positions
// than can be represented).
void config_knobs(graph::ModelSource& s, std::shared_ptr<const ModelOptions> m) {
  HfConfig c = *m->config;
  if (c.vision()) {
    s.knobs.push_back(knob("image_size", "the image size", m->zoo.image_size > 0 ? m->zoo.image_size : c.image_size,
                           std::min(c.image_size, 16 * c.patch_size), c.patch_size));
  } else {
    const std::int64_t seq = m->zoo.seq > 0 ? m->zoo.seq : c.positions;
    s.knobs.push_back(knob("seq", "the sequence length", seq, std::min<std::int64_t>(c.positions, 1024)));
    if (c.encoder_decoder()) {
      s.knobs.push_back(knob("target_seq", "the target sequence length", m->zoo.target_seq > 0 ? m->zoo.target_seq : seq,
                             std::min<std::int64_t>(c.positions, 1024)));
    }
  }
  const std::int64_t layers = config_layers(c);
  s.knobs.push_back(layer_count("num_hidden_layers", "the layer count", layers, layers, "layers", false));
  s.default_batch = c.vision() ? 32 : 8;
  s.build = [m](std::int64_t batch, Sizes sizes) {
    HfConfig config = *m->config;
    ZooOptions zoo = m->zoo;
    std::size_t next = 0;
    (config.vision() ? zoo.image_size : zoo.seq) = sizes[next++];
    if (config.encoder_decoder()) zoo.target_seq = sizes[next++];
    config_layers(config) = sizes[next];
    return build_hf_forward(config, batch, zoo, m->training);
  };
}

// The MLP: each hidden width, and how many there are (a layer count). A count past the widths
// given repeats the last one (only the layer-count check builds such a model).
void mlp_knobs(graph::ModelSource& s, std::shared_ptr<const ModelOptions> m) {
  const std::vector<std::int64_t>& hidden = m->mlp.hidden;
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    graph::SizeKnob k = knob("hidden", hidden.size() == 1 ? "the hidden width" : "hidden width " + std::to_string(i + 1),
                             hidden[i], 256);
    k.position = hidden.size() == 1 ? 0 : static_cast<int>(i + 1);
    s.knobs.push_back(k);
  }
  const auto n = static_cast<std::int64_t>(hidden.size());
  s.knobs.push_back(layer_count("hidden_count", "the hidden width count", n, n, "widths", false));
  s.build = [m](std::int64_t batch, Sizes sizes) {
    MlpConfig mlp = m->mlp;
    const std::size_t widths = mlp.hidden.size();
    mlp.hidden.assign(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(widths));
    mlp.hidden.resize(static_cast<std::size_t>(sizes[widths]), mlp.hidden.empty() ? 1 : mlp.hidden.back());
    return build_mlp(mlp, batch);
  };
}

void gpt_knobs(graph::ModelSource& s, std::shared_ptr<const ModelOptions> m) {
  const GptConfig usual;
  const GptConfig& g = m->gpt;
  s.knobs.push_back(knob("seq", "the sequence length", g.context, usual.context));
  s.knobs.push_back(knob("width", "the width", g.width, usual.width, g.heads));
  s.knobs.push_back(layer_count("layers", "the layer count", g.layers, usual.layers, "layers", true));
  s.build = [m](std::int64_t batch, Sizes sizes) {
    GptConfig gpt = m->gpt;
    gpt.context = sizes[0];
    gpt.width = sizes[1];
    gpt.layers = sizes[2];
    return build_gpt(gpt, batch, m->training);
  };
}

void zoo_knobs(graph::ModelSource& s, std::shared_ptr<const ModelOptions> m, const ZooModel& zoo) {
  if (zoo.vision) {
    s.knobs.push_back(knob("image_size", "the image size", m->zoo.image_size > 0 ? m->zoo.image_size : zoo.default_image,
                           zoo.default_image, zoo.image_multiple));
  } else {
    const std::int64_t seq = m->zoo.seq > 0 ? m->zoo.seq : zoo.default_seq;
    s.knobs.push_back(knob("seq", "the sequence length", seq, zoo.default_seq));
    if (zoo.encoder_decoder) {
      s.knobs.push_back(knob("target_seq", "the target sequence length", m->zoo.target_seq > 0 ? m->zoo.target_seq : seq,
                             zoo.default_seq));
    }
  }
  s.build = [m, vision = zoo.vision, encoder_decoder = zoo.encoder_decoder](std::int64_t batch, Sizes sizes) {
    ZooOptions options = m->zoo;
    (vision ? options.image_size : options.seq) = sizes[0];
    if (encoder_decoder) options.target_seq = sizes[1];
    return build_zoo_forward_or_throw(m->name, batch, options);
  };
}

}  // namespace

graph::ModelSource registry_source(ModelOptions options) {
  auto m = std::make_shared<const ModelOptions>(std::move(options));
  graph::ModelSource s;
  s.name = m->name;
  s.training = m->training;
  s.tensor_parallel = tensor_parallel_of(*m).degree;
  const ModelInfo* info = find_model(m->name);
  if (info != nullptr) s.default_batch = info->default_batch;
  if (m->config) {
    config_knobs(s, m);
  } else if (m->name == "mlp") {
    mlp_knobs(s, m);
  } else if (m->name == "cnn") {
    s.knobs.push_back(knob("image_size", "the image size", m->cnn.image, CnnConfig{}.image));
    s.build = [m](std::int64_t batch, Sizes sizes) {
      CnnConfig cnn = m->cnn;
      cnn.image = sizes[0];
      return build_cnn(cnn, batch, m->training);
    };
  } else if (m->name == "gpt") {
    gpt_knobs(s, m);
  } else if (const ZooModel* zoo = find_zoo_model(m->name)) {
    zoo_knobs(s, m, *zoo);
  } else {
    s.name.clear();  // the error names the model itself
    s.build = [m](std::int64_t batch, Sizes) { return build_forward_or_throw(*m, batch); };
  }
  if (s.tensor_parallel > 1 && !m->config && (m->name == "mlp" || m->name == "cnn")) {
    s.build = [m](std::int64_t batch, Sizes) { return build_forward_or_throw(*m, batch); };  // says why not
  }
  return s;
}

Status set_data_sizes(ModelOptions& options, std::int64_t vocab) {
  if (options.config) {
    HfConfig& c = *options.config;
    if (vocab <= 0) return Status::success();  // planned with the config's own tokens
    if (c.family == HfFamily::gpt2) {
      c.gpt.vocab = vocab;
    } else if (c.family == HfFamily::llama) {
      c.llama.vocab = vocab;
    } else if (c.family == HfFamily::t5) {
      c.t5.vocab = vocab;
    } else {
      return Error{"a vocabulary size applies to text configs (gpt2, the rotary decoders and t5), not a " + c.model_type};
    }
    return Status::success();
  }
  if (options.name != "gpt") {
    if (vocab > 0) return Error{"a vocabulary size applies to text models (gpt and decoder configs), not '" + options.name + "'"};
    return Status::success();
  }
  if (vocab > 0) {
    options.gpt.vocab = vocab;
    return Status::success();
  }
  auto found = text_vocabulary(kFortunesDefaultDir);
  if (!found) return Error{"the GPT's vocabulary is its default text's: " + found.error().message};
  options.gpt.vocab = found.value();
  return Status::success();
}

}  // namespace memplan::models
