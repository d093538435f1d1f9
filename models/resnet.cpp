#include "memplan/models/resnet.h"

#include <cmath>
#include <string>

#include "memplan/graph/builder.h"

namespace memplan::models {
namespace {

using graph::InitSpec;

class ResnetBuilder {
 public:
  ResnetBuilder(graph::Graph& g, graph::DType dtype) : b_(g), dtype_(dtype) {}
  graph::Builder& b() { return b_; }

  TensorId conv_bn(TensorId x, std::int64_t cin, std::int64_t cout, std::int64_t kernel, std::int64_t stride,
                   const std::string& conv_name, const std::string& bn_name) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(cin * kernel * kernel));
    const TensorId w =
        b_.parameter(conv_name + ".weight", {cout, cin, kernel, kernel}, {InitSpec::Kind::uniform, bound}, dtype_);
    const TensorId h = b_.conv2d(x, w, stride, kernel / 2, conv_name);
    const TensorId gamma = b_.parameter(bn_name + ".weight", {cout}, {InitSpec::Kind::ones, 0.0f}, dtype_);
    const TensorId beta = b_.parameter(bn_name + ".bias", {cout}, {InitSpec::Kind::zeros, 0.0f}, dtype_);
    const TensorId mean = b_.buffer(bn_name + ".running_mean", {cout}, {InitSpec::Kind::zeros, 0.0f});
    const TensorId var = b_.buffer(bn_name + ".running_var", {cout}, {InitSpec::Kind::ones, 0.0f});
    return b_.batch_norm(h, gamma, beta, mean, var, /*training=*/true, bn_name);
  }

  // relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))) + shortcut(x)).
  TensorId bottleneck(TensorId x, std::int64_t cin, std::int64_t width, std::int64_t stride, const std::string& n) {
    const std::int64_t cout = 4 * width;
    TensorId h = b_.relu(conv_bn(x, cin, width, 1, 1, n + ".conv1", n + ".bn1"), n + ".relu1");
    h = b_.relu(conv_bn(h, width, width, 3, stride, n + ".conv2", n + ".bn2"), n + ".relu2");
    h = conv_bn(h, width, cout, 1, 1, n + ".conv3", n + ".bn3");
    const TensorId shortcut =
        stride != 1 || cin != cout ? conv_bn(x, cin, cout, 1, stride, n + ".downsample.0", n + ".downsample.1") : x;
    return b_.relu(b_.add(h, shortcut, n + ".sum"), n + ".relu3");
  }

 private:
  graph::Builder b_;
  graph::DType dtype_;
};

}  // namespace

graph::Graph build_resnet(const ResnetConfig& config, std::int64_t batch) {
  if (batch <= 0 || config.image < 32 || config.blocks.size() != 4) {
    throw graph::GraphError("resnet: needs a positive batch, an image of at least 32 pixels and 4 stages");
  }
  graph::Graph g;
  ResnetBuilder net(g, config.dtype);
  graph::Builder& b = net.b();
  const std::int64_t B = batch, CH = config.channels, S = config.image;
  const TensorId x = b.input("x", {B, graph::checked_mul(graph::checked_mul(CH, S), S)}, config.dtype);
  const TensorId labels = b.input("labels", {B}, graph::DType::i32);
  TensorId h = b.reshape(x, {B, CH, S, S}, "x.image");
  h = b.relu(net.conv_bn(h, CH, 64, 7, 2, "conv1", "bn1"), "relu");
  h = b.max_pool2d(h, 3, 2, 1, "maxpool");
  std::int64_t channels = 64;
  for (std::size_t stage = 0; stage < config.blocks.size(); ++stage) {
    const std::int64_t width = std::int64_t{64} << stage;
    for (std::int64_t i = 0; i < config.blocks[stage]; ++i) {
      const std::int64_t stride = stage > 0 && i == 0 ? 2 : 1;
      const std::string name = "layer" + std::to_string(stage + 1) + "." + std::to_string(i);
      h = net.bottleneck(h, channels, width, stride, name);
      channels = 4 * width;
    }
  }
  h = b.global_avg_pool(h, "avgpool");  // [B, 2048]
  const float bound = 1.0f / std::sqrt(static_cast<float>(channels));
  const TensorId w = b.parameter("fc.weight", {config.classes, channels}, {InitSpec::Kind::uniform, bound}, config.dtype);
  const TensorId bias = b.parameter("fc.bias", {config.classes}, {InitSpec::Kind::uniform, bound}, config.dtype);
  g.output = b.linear(h, w, bias, "logits");
  g.loss = b.cross_entropy(g.output, labels, "loss");
  return g;
}

}  // namespace memplan::models
