#include "memplan/models/cnn.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"

namespace memplan::models {
namespace {

using graph::InitSpec;

class CnnBuilder {
 public:
  CnnBuilder(graph::Graph& g, const CnnConfig& config, bool training) : b_(g), config_(config), training_(training) {}

  graph::Builder& b() { return b_; }

  // conv (no bias) -> batch norm; x [N, cin, H, W] -> [N, cout, H/stride, W/stride].
  TensorId conv_bn(TensorId x, std::int64_t cin, std::int64_t cout, std::int64_t kernel, std::int64_t stride,
                   const std::string& name) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(cin * kernel * kernel));
    const TensorId w = b_.parameter(name + ".conv.weight", {cout, cin, kernel, kernel}, {InitSpec::Kind::uniform, bound});
    const TensorId h = b_.conv2d(x, w, stride, kernel / 2, name + ".conv");
    const TensorId gamma = b_.parameter(name + ".bn.weight", {cout}, {InitSpec::Kind::ones, 0.0f});
    const TensorId beta = b_.parameter(name + ".bn.bias", {cout}, {InitSpec::Kind::zeros, 0.0f});
    const TensorId mean = b_.buffer(name + ".bn.running_mean", {cout}, {InitSpec::Kind::zeros, 0.0f});
    const TensorId var = b_.buffer(name + ".bn.running_var", {cout}, {InitSpec::Kind::ones, 0.0f});
    return b_.batch_norm(h, gamma, beta, mean, var, training_, name + ".bn", config_.bn_momentum);
  }

  // relu(conv_bn(relu(conv_bn(x))) + shortcut(x)), the shortcut a 1x1 conv_bn when the shape changes.
  TensorId block(TensorId x, std::int64_t cin, std::int64_t cout, std::int64_t stride, const std::string& name) {
    TensorId h = b_.relu(conv_bn(x, cin, cout, 3, stride, name + ".a"), name + ".a.relu");
    h = conv_bn(h, cout, cout, 3, 1, name + ".b");
    const TensorId shortcut = stride != 1 || cin != cout ? conv_bn(x, cin, cout, 1, stride, name + ".down") : x;
    return b_.relu(b_.add(h, shortcut, name + ".sum"), name + ".relu");
  }

 private:
  graph::Builder b_;
  const CnnConfig& config_;
  bool training_;
};

}  // namespace

graph::Graph build_cnn(const CnnConfig& config, std::int64_t batch, bool training) {
  if (batch <= 0) throw graph::GraphError("batch size must be positive, got " + std::to_string(batch));
  if (config.widths.empty() || config.blocks_per_stage <= 0 || config.image <= 0 || config.in_channels <= 0) {
    throw graph::GraphError("cnn needs at least one stage, one block per stage and a positive image size");
  }
  graph::Graph g;
  CnnBuilder net(g, config, training);
  graph::Builder& b = net.b();
  const std::int64_t B = batch, C = config.in_channels, S = config.image;
  const TensorId x = b.input("x", {B, graph::checked_mul(graph::checked_mul(C, S), S)});
  const TensorId labels = b.input("labels", {B}, graph::DType::i32);

  TensorId h = b.reshape(x, {B, C, S, S}, "x.image");
  h = b.relu(net.conv_bn(h, C, config.widths[0], 3, 1, "stem"), "stem.relu");  // [B, W0, S, S]
  std::int64_t channels = config.widths[0];
  for (std::size_t stage = 0; stage < config.widths.size(); ++stage) {
    for (std::int64_t i = 0; i < config.blocks_per_stage; ++i) {
      const std::int64_t stride = stage > 0 && i == 0 ? 2 : 1;
      const std::string name = "stage" + std::to_string(stage + 1) + ".block" + std::to_string(i + 1);
      h = net.block(h, channels, config.widths[stage], stride, name);
      channels = config.widths[stage];
    }
  }
  h = b.global_avg_pool(h, "pool");  // [B, channels]
  const float bound = 1.0f / std::sqrt(static_cast<float>(channels));
  const TensorId w = b.parameter("fc.weight", {config.classes, channels}, {InitSpec::Kind::uniform, bound});
  const TensorId bias = b.parameter("fc.bias", {config.classes}, {InitSpec::Kind::uniform, bound});
  g.output = b.linear(h, w, bias, "logits");
  g.loss = b.cross_entropy(g.output, labels, "loss");
  return g;
}

}  // namespace memplan::models
