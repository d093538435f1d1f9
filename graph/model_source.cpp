#include "memplan/graph/model_source.h"

namespace memplan::graph {

std::vector<std::int64_t> ModelSource::sizes() const {
  std::vector<std::int64_t> out;
  out.reserve(knobs.size());
  for (const SizeKnob& k : knobs) out.push_back(k.value);
  return out;
}

Graph ModelSource::forward(std::int64_t batch) const {
  const std::vector<std::int64_t> at = sizes();
  return build(batch, at);
}

}  // namespace memplan::graph
