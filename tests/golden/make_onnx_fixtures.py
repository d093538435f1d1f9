#!/usr/bin/python3
"""ONNX fixtures for memplan's importer tests: small torch models (random weights, nothing is
downloaded) exported with torch.onnx.export, plus torch's forward output and loss gradients for
a fixed input, written as JSON next to the .onnx files (NAME_golden.json).

Usage: python3 tests/golden/make_onnx_fixtures.py OUT_DIR [--large]
  OUT_DIR    where to write (tests/data/onnx for the committed fixtures)
  --large    instead export full-size torchvision ResNet-50 (224x224) and ViT-B/16 (224x224) for
             measurements (hundreds of MB: write them to /tmp, never commit them)
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


def golden(model, name, x, labels, out_dir):
    """One training-mode step (batch statistics, as memplan's training step) with mean
    cross-entropy over every position: the input, labels, output, loss, parameter count and the
    gradients of the first and last parameters, as JSON next to the .onnx file."""
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
        "grad": {n: p.grad.reshape(-1).tolist() for n, p in (named[0], named[-1])},
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
        r18 = torchvision.models.resnet18(num_classes=10)
        r18.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
        export(r18, torch.randn(2, 1, 28, 28), os.path.join(out_dir, "resnet18_fmnist.onnx"), 15)
        return
    batch = 2
    cnn = SmallCnn()
    x = torch.randn(batch, 1, 12, 12)
    fixture(cnn, "small_cnn", x, torch.tensor([3, 7]), out_dir, 15)
    gpt = TinyGpt()
    ids = torch.randint(0, 32, (batch, 8))
    fixture(gpt, "tiny_gpt", ids, torch.randint(0, 32, (batch, 8)), out_dir, 17)


def fixture(model, name, x, labels, out_dir, opset):
    # The export traces a training-mode forward (which moves batch-norm running statistics):
    # export the initial state, then run the golden step from that same state.
    initial = copy.deepcopy(model.state_dict())
    export(model, x, os.path.join(out_dir, name + ".onnx"), opset)
    model.load_state_dict(initial)
    golden(model, name, x, labels, out_dir)


if __name__ == "__main__":
    main()
