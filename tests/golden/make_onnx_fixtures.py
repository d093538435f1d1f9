#!/usr/bin/python3
"""ONNX fixtures for memplan's importer tests: small torch models (random weights, nothing is
downloaded) exported with torch.onnx.export, plus torch's forward output and loss gradients for
a fixed input, written as JSON next to the .onnx files (NAME_golden.json).

Usage: python3 tests/golden/make_onnx_fixtures.py OUT_DIR [--large | --resnet18]
  OUT_DIR    where to write (tests/data/onnx for the committed fixtures)
  --large    instead export full-size torchvision ResNet-50 (224x224) and ViT-B/16 (224x224) for
             measurements (hundreds of MB: write them to /tmp, never commit them), ResNet-18,
             MobileNetV2 and a dilated ResNet-50 (replace_stride_with_dilation=[False, True, True],
             DeepLab's backbone; resnet50_dilated.onnx) at 224x224
  --resnet18 only torchvision's ResNet-18 with a 1-channel stem and 10 classes for Fashion-MNIST
             (resnet18_fmnist.onnx, 45 MB: `memplan train --onnx` trains it)
"""
import copy
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


class SmallCnn(nn.Module):
    """Conv, BatchNormalization, Relu, MaxPool, GlobalAveragePool, Flatten, Gemm, Add."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.max_pool2d(y, 2)
        y = F.relu(self.bn2(self.conv2(y)) + y)
        y = F.adaptive_avg_pool2d(y, 1)
        return self.fc(torch.flatten(y, 1))


class TinyMobileNet(nn.Module):
    """A narrow MobileNetV2 of torchvision's own InvertedResidual blocks: grouped and depthwise
    Conv (groups > 1), Clip (ReLU6), residual Add, plus a Sigmoid gate and a Tanh head so every
    activation the importer maps from mobile nets has golden data."""

    def __init__(self, classes=10):
        super().__init__()
        from torchvision.models.mobilenetv2 import InvertedResidual
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(8, 8, 1, 1), InvertedResidual(8, 12, 2, 4),
                                    InvertedResidual(12, 12, 1, 4))
        self.grouped = nn.Conv2d(12, 12, 3, 1, 1, groups=3)  # grouped, with a bias
        self.last = nn.Sequential(nn.Conv2d(12, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())
        self.fc1 = nn.Linear(32, 16)
        self.fc2 = nn.Linear(16, classes)

    def forward(self, x):
        y = self.blocks(self.stem(x))
        y = y * torch.sigmoid(self.grouped(y))
        y = F.adaptive_avg_pool2d(self.last(y), 1)
        return self.fc2(torch.tanh(self.fc1(torch.flatten(y, 1))))


class TinyLnMlp(nn.Module):
    """Exported at opset 15, where LayerNorm becomes ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
    Div, Mul, Add (opset 17 has a LayerNormalization node)."""

    def __init__(self, d=8, hidden=16, classes=5):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(F.gelu(self.ln(self.fc1(x))))


class FmnistCnn(nn.Module):
    """A Fashion-MNIST classifier of [B, 1, 28, 28] images for `memplan train --onnx` tests."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        y = F.relu(self.conv2(y))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class FmnistMlp(nn.Module):
    """A Fashion-MNIST classifier of flat [B, 784] images (Gemm, Relu)."""

    def __init__(self, hidden=16, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class TinyDilated(nn.Module):
    """Dilated (atrous) convolutions as DeepLab and dilated ResNets use them: a 3x3 at dilation 2
    and padding 2 that keeps the size (in a residual block), a depthwise one with a bias, and a
    strided 3x3 at dilation 3."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.atrous = nn.Conv2d(8, 8, 3, padding=2, dilation=2, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.wide = nn.Conv2d(8, 12, 3, stride=2, padding=3, dilation=3)
        self.fc = nn.Linear(12, classes)

    def forward(self, x):
        y = self.stem(x)
        y = F.relu(self.bn(self.atrous(y)) + y)
        y = F.relu(self.wide(F.relu(self.depthwise(y))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class TinySe(nn.Module):
    """Squeeze-and-excitation as MobileNetV3 and EfficientNet export it: torchvision's
    SqueezeExcitation (GlobalAveragePool, 1x1 Conv, Relu, 1x1 Conv, Sigmoid) gating its input with
    a Mul of [N, C, H, W] by [N, C, 1, 1], once after a depthwise conv and once on the residual."""

    def __init__(self, classes=10):
        super().__init__()
        from torchvision.ops import SqueezeExcitation
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.se1 = SqueezeExcitation(8, 4)
        self.project = nn.Conv2d(8, 12, 1, bias=False)
        self.se2 = SqueezeExcitation(12, 4)
        self.fc = nn.Linear(12, classes)

    def forward(self, x):
        y = self.stem(x)
        y = self.se1(F.relu(self.depthwise(y))) + y
        y = self.se2(self.project(y))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class TinyTorchvisionOps(nn.Module):
    """What torchvision's DenseNet, Inception-v3, GoogLeNet, SqueezeNet and MobileNetV3 export
    beyond the other fixtures: Hardswish, MaxPool2d with ceil_mode (12 -> 6, floor would give 5),
    an AvgPool2d with count_include_pad padding (exported as Pad + AveragePool, Inception's
    branches), DenseNet's channel concatenation and transition pool, MobileNetV3's
    squeeze-and-excitation gate with Hardsigmoid, and ConvNeXt's layer scale (a [C, 1, 1]
    parameter times the features)."""

    def __init__(self, classes=10):
        super().__init__()
        from torchvision.ops import SqueezeExcitation
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        self.pool = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.branch = nn.Conv2d(8, 4, 1)
        self.se = SqueezeExcitation(12, 4, scale_activation=nn.Hardsigmoid)
        self.layer_scale = nn.Parameter(torch.rand(12, 1, 1) + 0.5)
        self.fc = nn.Linear(12, classes)

    def forward(self, x):
        y = self.pool(self.stem(x))
        z = self.branch(F.avg_pool2d(y, 3, stride=1, padding=1))
        y = self.layer_scale * self.se(torch.cat([y, z], 1))
        y = F.avg_pool2d(y, 2, stride=2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def tiny_vgg():
    """torchvision's VGG class (its make_layers feature stack: Conv, Relu, MaxPool; its adaptive
    average pool; Flatten and a Linear/Relu/Dropout classifier) at VGG-11's layer pattern with
    narrow widths and a small head. Dropout p = 0 so the golden step is deterministic (memplan's
    masks are its own); the node still exports and imports."""
    from torchvision.models.vgg import VGG, make_layers
    model = VGG(make_layers([8, "M", 16, "M", 16, 16, "M"]), num_classes=10, init_weights=True, dropout=0.0)
    model.avgpool = nn.AdaptiveAvgPool2d((1, 1))  # 2x2 maps -> 1x1: exports as an AveragePool
    model.classifier = nn.Sequential(nn.Linear(16, 32), nn.ReLU(True), nn.Dropout(p=0.0), nn.Linear(32, 10))
    return model


def tiny_vit():
    """torchvision's VisionTransformer (conv patch embedding, class token Concat, learned
    positions, nn.MultiheadAttention, MLP with Gelu, Gather of the class token) at toy sizes."""
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                             num_classes=10)


def tiny_swin():
    """torchvision's SwinTransformer at toy sizes: 32x32 images in 4x4 patches give 8x8 maps,
    windows of 3 pad them to 9x9 (Pad) and shift by 1 (the roll as Slice + Concat, the mask built
    from constants by ScatterND, Mod, Expand, Where), relative-position bias as a Gather of a learned
    table by a constant index, and patch merging by strided Slices. Stochastic depth 0 (its
    Bernoulli sampling does not export in training mode)."""
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[2, 2], num_heads=[1, 2], window_size=[3, 3],
                           stochastic_depth_prob=0.0, num_classes=10)


def tiny_maxvit():
    """torchvision's MaxVit at toy sizes: MBConv (batch norm, depthwise Conv, squeeze-excitation),
    block and grid attention over 2x2 partitions with relative-position bias (a Gather of a learned
    table by a constant index) and Einsum products."""
    from torchvision.models.maxvit import MaxVit
    return MaxVit(input_size=(16, 16), stem_channels=8, partition_size=2, block_channels=[8, 16], block_layers=[1, 1],
                  head_dim=4, stochastic_depth_prob=0.0, num_classes=10)


def resnet18_fmnist():
    r18 = torchvision.models.resnet18(num_classes=10)
    r18.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return r18


class Block(nn.Module):
    def __init__(self, d, heads, t):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h) + self.mask[:t, :t]
        y = att.softmax(dim=-1) @ v
        y = y.transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGpt(nn.Module):
    """A GPT-2-style decoder over token ids: Gather (embedding), LayerNormalization, MatMul,
    Split, Reshape, Transpose, Softmax with a causal mask, Gelu's Erf decomposition."""

    def __init__(self, vocab=32, t=8, d=16, heads=2, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(1, t, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads, t) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def export(model, example, path, opset, input_name="input"):
    model.train()
    torch.onnx.export(model, example, path, opset_version=opset, input_names=[input_name], output_names=["output"],
                      dynamic_axes={input_name: {0: "batch"}, "output": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)


def golden(model, name, x, labels, out_dir, extra_grads=()):
    """One training-mode step (batch statistics, as memplan's training step) with mean
    cross-entropy over every position: the input, labels, output, loss, parameter count and the
    gradients of the first and last parameters (and of `extra_grads`), as JSON next to the .onnx file."""
    model.train()
    model.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
    loss.backward()
    named = list(model.named_parameters())
    data = {
        "input": x.reshape(-1).tolist(),
        "input_shape": list(x.shape),
        "labels": labels.reshape(-1).tolist(),
        "output": out.detach().reshape(-1).tolist(),
        "output_shape": list(out.shape),
        "loss": float(loss),
        "parameter_count": sum(p.numel() for _, p in named),
        "grad": {n: p.grad.reshape(-1).tolist() for n, p in [named[0], named[-1]] + [(e, dict(named)[e]) for e in extra_grads]},
    }
    with open(os.path.join(out_dir, name + "_golden.json"), "w") as f:
        json.dump(data, f)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    if "--large" in sys.argv:
        r50 = torchvision.models.resnet50()
        export(r50, torch.randn(2, 3, 224, 224), os.path.join(out_dir, "resnet50.onnx"), 15)
        vit = torchvision.models.vit_b_16()
        export(vit, torch.randn(2, 3, 224, 224), os.path.join(out_dir, "vit_b_16.onnx"), 17)
        export(resnet18_fmnist(), torch.randn(2, 1, 28, 28), os.path.join(out_dir, "resnet18_fmnist.onnx"), 15)
        export(torchvision.models.mobilenet_v2(), torch.randn(2, 3, 224, 224), os.path.join(out_dir, "mobilenet_v2.onnx"), 15)
        export(torchvision.models.vgg11(), torch.randn(2, 3, 224, 224), os.path.join(out_dir, "vgg11.onnx"), 15)
        export(torchvision.models.resnet50(replace_stride_with_dilation=[False, True, True]), torch.randn(2, 3, 224, 224),
               os.path.join(out_dir, "resnet50_dilated.onnx"), 15)
        return
    if "--resnet18" in sys.argv:
        export(resnet18_fmnist(), torch.randn(2, 1, 28, 28), os.path.join(out_dir, "resnet18_fmnist.onnx"), 15)
        return
    batch = 2
    cnn = SmallCnn()
    x = torch.randn(batch, 1, 12, 12)
    fixture(cnn, "small_cnn", x, torch.tensor([3, 7]), out_dir, 15)
    gpt = TinyGpt()
    ids = torch.randint(0, 32, (batch, 8))
    fixture(gpt, "tiny_gpt", ids, torch.randint(0, 32, (batch, 8)), out_dir, 17)
    mobile = TinyMobileNet()
    fixture(mobile, "tiny_mobilenet", torch.randn(batch, 3, 16, 16), torch.tensor([1, 8]), out_dir, 13,
            ["blocks.0.conv.0.0.weight", "blocks.1.conv.1.0.weight", "grouped.weight", "grouped.bias"])
    fixture(TinyLnMlp(), "tiny_ln_mlp", torch.randn(batch, 4, 8), torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]]), out_dir, 15,
            ["ln.weight", "ln.bias"])
    # Fashion-MNIST-shaped classifiers for `memplan train --onnx` (no golden data: the training
    # tests compare memplan with itself, before and after an export).
    export(FmnistCnn(), torch.randn(batch, 1, 28, 28), os.path.join(out_dir, "fmnist_cnn.onnx"), 15)
    export(FmnistMlp(), torch.randn(batch, 784), os.path.join(out_dir, "fmnist_mlp.onnx"), 15)
    fixture(TinyDilated(), "tiny_dilated", torch.randn(batch, 3, 12, 12), torch.tensor([2, 9]), out_dir, 15,
            ["atrous.weight", "depthwise.weight", "depthwise.bias", "wide.weight"])
    fixture(TinySe(), "tiny_se", torch.randn(batch, 3, 10, 10), torch.tensor([4, 0]), out_dir, 13,
            ["depthwise.weight", "se1.fc1.weight", "se1.fc2.bias", "se2.fc1.weight", "se2.fc2.weight"])
    # Added after the others so their random draws (and files) stay as they were.
    fixture(tiny_vgg(), "tiny_vgg", torch.randn(batch, 3, 16, 16), torch.tensor([6, 1]), out_dir, 15,
            ["features.3.weight", "classifier.0.weight"])
    fixture(tiny_vit(), "tiny_vit", torch.randn(batch, 3, 16, 16), torch.tensor([0, 5]), out_dir, 17,
            ["conv_proj.weight", "encoder.pos_embedding", "encoder.layers.encoder_layer_0.self_attention.in_proj_weight",
             "encoder.layers.encoder_layer_1.mlp.0.weight"])
    fixture(TinyTorchvisionOps(), "tiny_torchvision_ops", torch.randn(batch, 3, 12, 12), torch.tensor([3, 8]), out_dir, 15,
            ["stem.0.weight", "branch.weight", "branch.bias", "se.fc1.weight", "se.fc2.bias", "layer_scale"])
    fixture(tiny_swin(), "tiny_swin", torch.randn(batch, 3, 32, 32), torch.tensor([7, 2]), out_dir, 15,
            ["features.1.0.attn.relative_position_bias_table", "features.1.1.attn.relative_position_bias_table",
             "features.3.1.attn.qkv.weight", "features.2.reduction.weight"])
    fixture(tiny_maxvit(), "tiny_maxvit", torch.randn(batch, 3, 16, 16), torch.tensor([5, 9]), out_dir, 15,
            ["blocks.0.layers.0.layers.window_attention.attn_layer.1.relative_position_bias_table",
             "blocks.1.layers.0.layers.grid_attention.attn_layer.1.relative_position_bias_table",
             "blocks.0.layers.0.layers.MBconv.layers.conv_b.0.weight"])


def fixture(model, name, x, labels, out_dir, opset, extra_grads=()):
    # The export traces a training-mode forward (which moves batch-norm running statistics):
    # export the initial state, then run the golden step from that same state.
    initial = copy.deepcopy(model.state_dict())
    export(model, x, os.path.join(out_dir, name + ".onnx"), opset)
    model.load_state_dict(initial)
    golden(model, name, x, labels, out_dir, extra_grads)


if __name__ == "__main__":
    main()
