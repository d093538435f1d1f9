#include "memplan/planner/step_size.h"

#include <algorithm>
#include <string>
#include <vector>

#include "memplan/graph/training_step.h"
#include "memplan/models/zoo.h"

namespace memplan::planner {
namespace {

enum class Fit { ok, too_large, inconsistent };

struct Outcome {
  Fit fit = Fit::ok;
  std::string why;  // too_large: what could not be represented
  std::int64_t ops = 0;
};

Outcome evaluate(const StepDescription& step) {
  try {
    graph::Graph g = step.forward ? step.forward(step.batch) : models::build_forward_or_throw(step.model, step.batch);
    if (step.model.training) graph::make_training_step(g, step.optimizer);
    if (g.num_ops() > kMaxStepOps) {
      return {Fit::too_large, "the step would have " + std::to_string(g.num_ops()) + " ops, more than the planner's " +
                                  std::to_string(kMaxStepOps)};
    }
    Bytes total = 0;
    for (TensorId id = 0; id < g.num_tensors(); ++id) {
      const graph::TensorDesc& t = g.tensor(id);
      if (t.is_view()) continue;
      total += t.size_bytes();  // each at most 2^60 and the sum so far at most 2^61: no overflow
      if (total > kMaxStepBytes) {
        return {Fit::too_large, "the step's tensors would add up to more than 2^61 bytes"};
      }
    }
    return {Fit::ok, {}, g.num_ops()};
  } catch (const graph::SizeError& e) {
    return {Fit::too_large, e.what()};
  } catch (const graph::GraphError&) {
    return {Fit::inconsistent, {}};
  }
}

// A size the user chose, in a working copy of the step.
struct Knob {
  std::string flag;
  std::int64_t* value;
  std::int64_t usual;        // the model's default: a value at which it is valid
  std::int64_t granule = 1;  // values must be multiples of it (patches, heads)
  // Where the search for the largest value starts: a value that is valid for the model.
  std::int64_t floor(std::int64_t asked) const {
    return std::max(granule, std::min(asked, usual) / granule * granule);
  }
};

// The knobs of a step, the one pushed furthest past its default first: the flag to name when
// bringing it down alone makes the step representable.
std::vector<Knob> knobs_of(StepDescription& s) {
  const models::ModelInfo* info = models::find_model(s.model.name);
  std::vector<Knob> knobs = {{"--batch", &s.batch, info ? info->default_batch : 1}};
  models::ModelOptions& m = s.model;
  if (m.config) {
    // Without the flag the config's positions / image size are used. The search starts from a
    // modest value (a config may allow far more positions than can be represented).
    const std::int64_t patch = m.config->patch_size;
    if (m.config->vision()) {
      if (m.zoo.image_size <= 0) m.zoo.image_size = m.config->image_size;
      knobs.push_back({"--image-size", &m.zoo.image_size, std::min(m.config->image_size, 16 * patch), patch});
    } else {
      if (m.zoo.seq <= 0) m.zoo.seq = m.config->positions;
      knobs.push_back({"--seq", &m.zoo.seq, std::min<std::int64_t>(m.config->positions, 1024)});
    }
  } else if (m.name == "mlp") {
    for (std::size_t i = 0; i < m.mlp.hidden.size(); ++i) {
      const std::string which = m.mlp.hidden.size() == 1 ? "" : " (width " + std::to_string(i + 1) + ")";
      knobs.push_back({"--hidden" + which, &m.mlp.hidden[i], 256});
    }
  } else if (m.name == "cnn") {
    knobs.push_back({"--image-size", &m.cnn.image, models::CnnConfig{}.image});
  } else if (m.name == "gpt") {
    const models::GptConfig usual;
    knobs.push_back({"--seq", &m.gpt.context, usual.context});
    knobs.push_back({"--width", &m.gpt.width, usual.width, std::max<std::int64_t>(m.gpt.heads, 1)});
    knobs.push_back({"--layers", &m.gpt.layers, usual.layers});
  } else if (const models::ZooModel* zoo = models::find_zoo_model(m.name)) {
    if (zoo->vision) {
      if (m.zoo.image_size <= 0) m.zoo.image_size = zoo->default_image;
      knobs.push_back({"--image-size", &m.zoo.image_size, zoo->default_image, zoo->image_multiple});
    } else {
      if (m.zoo.seq <= 0) m.zoo.seq = zoo->default_seq;
      knobs.push_back({"--seq", &m.zoo.seq, zoo->default_seq});
    }
  }
  std::stable_sort(knobs.begin(), knobs.end(), [](const Knob& a, const Knob& b) {
    return static_cast<double>(*a.value) / static_cast<double>(a.usual) >
           static_cast<double>(*b.value) / static_cast<double>(b.usual);
  });
  return knobs;
}

// Layer counts decide how large the graph itself is: checked by extrapolating the op count of
// one and two layers of a tiny model (ops grow linearly with layers), before building any more.
// A config's layer count, checked the same way on its smallest sizes.
Status check_config_layer_count(const StepDescription& step) {
  const models::HfConfig& c = *step.model.config;
  StepDescription tiny = step;
  tiny.batch = 1;
  tiny.model.zoo.seq = 1;
  tiny.model.zoo.image_size = c.patch_size;
  models::HfConfig& t = *tiny.model.config;
  std::int64_t given = 0;
  std::int64_t* layers = nullptr;
  switch (c.family) {
    case models::HfFamily::gpt2: layers = &t.gpt.layers; break;
    case models::HfFamily::llama: layers = &t.llama.layers; break;
    case models::HfFamily::bert: layers = &t.bert.encoder.layers; break;
    case models::HfFamily::vit: layers = &t.vit.encoder.layers; break;
  }
  given = *layers;
  *layers = 1;
  const Outcome one = evaluate(tiny);
  *layers = 2;
  const Outcome two = evaluate(tiny);
  if (one.fit != Fit::ok || two.fit != Fit::ok) return Status::success();  // plan_step names the problem
  const std::int64_t per_layer = two.ops - one.ops;
  const std::int64_t fixed = one.ops - per_layer;
  if (per_layer <= 0 || given <= (kMaxStepOps - fixed) / per_layer) return Status::success();
  return Error{"num_hidden_layers " + std::to_string(given) + " (the config's layer count): the step would have more than " +
               std::to_string(kMaxStepOps) + " ops, the most the planner takes; the largest that works is " +
               std::to_string((kMaxStepOps - fixed) / per_layer) + " layers"};
}

Status check_layer_count(const StepDescription& step) {
  const models::ModelOptions& m = step.model;
  if (m.config) return check_config_layer_count(step);
  if (m.name != "gpt" && m.name != "mlp") return Status::success();
  StepDescription tiny = step;
  tiny.batch = 1;
  std::int64_t given = 0;
  auto set_layers = [&](std::int64_t n) {
    if (m.name == "gpt") {
      tiny.model.gpt.layers = n;
    } else {
      tiny.model.mlp.hidden.assign(static_cast<std::size_t>(n), 1);
    }
  };
  if (m.name == "gpt") {
    tiny.model.gpt.context = 1;
    tiny.model.gpt.width = 1;
    tiny.model.gpt.heads = 1;
    given = m.gpt.layers;
  } else {
    given = static_cast<std::int64_t>(m.mlp.hidden.size());
  }
  set_layers(1);
  const Outcome one = evaluate(tiny);
  set_layers(2);
  const Outcome two = evaluate(tiny);
  if (one.fit != Fit::ok || two.fit != Fit::ok) return Status::success();  // plan_step names the problem
  const std::int64_t per_layer = two.ops - one.ops;
  const std::int64_t fixed = one.ops - per_layer;
  if (per_layer <= 0 || given <= (kMaxStepOps - fixed) / per_layer) return Status::success();
  const std::int64_t largest = (kMaxStepOps - fixed) / per_layer;
  const std::string flag = m.name == "gpt" ? "--layers " + std::to_string(given)
                                           : "--hidden with " + std::to_string(given) + " widths";
  return Error{flag + ": the step would have more than " + std::to_string(kMaxStepOps) +
               " ops, the most the planner takes; the largest that works is " + std::to_string(largest) +
               (m.name == "gpt" ? " layers" : " widths")};
}

}  // namespace

Status check_step_size(const StepDescription& step) {
  if (step.graph || step.batch <= 0) return Status::success();
  if (step.forward) {  // the batch is the one size a user chooses
    const Outcome given = evaluate(step);
    if (given.fit != Fit::too_large) return Status::success();
    return Error{"--batch " + std::to_string(step.batch) + ": the step cannot be represented (" + given.why +
                 "); the largest value that works is " + std::to_string(largest_representable_batch(step, step.batch))};
  }
  if (Status s = check_layer_count(step); !s) return s;
  StepDescription work = step;
  std::vector<Knob> knobs = knobs_of(work);
  const Outcome given = evaluate(work);
  if (given.fit != Fit::too_large) return Status::success();
  for (const Knob& knob : knobs) {
    const std::int64_t asked = *knob.value;
    const std::int64_t g = knob.granule;
    const std::int64_t floor = knob.floor(asked);
    if (asked <= floor) continue;
    *knob.value = floor;
    if (evaluate(work).fit != Fit::ok) {
      *knob.value = asked;
      continue;
    }
    // Sizes only grow with the value: bisection between a value that works and one that does not.
    std::int64_t lo = floor / g, hi = asked / g + (asked % g != 0);  // in granules
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      *knob.value = mid * g;
      (evaluate(work).fit == Fit::ok ? lo : hi) = mid;
    }
    *knob.value = asked;
    return Error{knob.flag + " " + std::to_string(asked) + ": the step cannot be represented (" + given.why +
                 "); the largest value that works with the other flags as given is " + std::to_string(lo * g)};
  }
  std::string flags;
  for (const Knob& knob : knobs) flags += (flags.empty() ? "" : ", ") + knob.flag;
  return Error{"the step cannot be represented at these sizes (" + given.why + "), and no single one of " + flags +
               " brought down alone changes that: reduce several of them"};
}

std::int64_t largest_representable_batch(const StepDescription& step, std::int64_t limit) {
  if (step.graph) return limit;
  StepDescription work = step;
  work.batch = limit;
  if (evaluate(work).fit != Fit::too_large) return limit;
  work.batch = 1;
  if (evaluate(work).fit == Fit::too_large) return 0;
  std::int64_t lo = 1, hi = limit;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    work.batch = mid;
    (evaluate(work).fit == Fit::too_large ? hi : lo) = mid;
  }
  return lo;
}

}  // namespace memplan::planner
