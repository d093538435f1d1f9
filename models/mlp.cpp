#include "memplan/models/mlp.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"

namespace memplan::models {

graph::Graph build_mlp(const MlpConfig& config, std::int64_t batch) {
  using graph::InitSpec;
  if (batch <= 0) throw graph::GraphError("batch size must be positive, got " + std::to_string(batch));
  graph::Graph g;
  graph::Builder b(g);
  const std::int64_t B = batch;
  TensorId h = b.input("x", {B, config.inputs});
  const TensorId labels = b.input("labels", {B}, graph::DType::i32);

  std::vector<std::int64_t> widths = {config.inputs};
  widths.insert(widths.end(), config.hidden.begin(), config.hidden.end());
  widths.push_back(config.classes);
  for (std::size_t layer = 0; layer + 1 < widths.size(); ++layer) {
    const std::int64_t in = widths[layer], out = widths[layer + 1];
    const std::string name = "fc" + std::to_string(layer + 1);
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    const InitSpec init{InitSpec::Kind::uniform, bound};
    TensorId w = b.parameter(name + ".weight", {out, in}, init);
    TensorId bias = b.parameter(name + ".bias", {out}, init);
    const bool last = layer + 2 == widths.size();
    h = b.linear(h, w, bias, last ? "logits" : name);  // h: [B, out]
    if (!last) h = b.relu(h, name + ".relu");
  }
  g.output = h;
  g.loss = b.cross_entropy(h, labels, "loss");
  return g;
}

}  // namespace memplan::models
