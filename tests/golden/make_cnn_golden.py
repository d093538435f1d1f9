#!/usr/bin/python3
"""Golden data for memplan's CNN (small ResNet) from an independent implementation (PyTorch, CPU).

Writes tests/data/cnn_golden.json for the config the test builds (8x8 images, 1 channel, stage
widths 4 and 8, one block per stage, 5 classes, batch 4): inputs, labels, initial weights, the
training-mode loss, every parameter gradient, the batch-norm running statistics after that
forward pass, and the evaluation-mode logits computed from those running statistics.
Run once with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_cnn_golden.py
The test (tests/golden_cnn_test.cpp) needs only the JSON, never torch.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(4321)
torch.set_default_dtype(torch.float32)

IMAGE, IN_CHANNELS, WIDTHS, BLOCKS, CLASSES, BATCH = 8, 1, [4, 8], 1, 5, 4
MOMENTUM, EPS = 0.1, 1e-5

params = {}
buffers = {}


def uniform(shape, fan_in):
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape) * 2 - 1) * bound


def conv_bn_params(name, cin, cout, k):
    params[name + ".conv.weight"] = uniform((cout, cin, k, k), cin * k * k).requires_grad_()
    # Random affine values (not PyTorch's 1/0 defaults) so the test exercises them.
    params[name + ".bn.weight"] = (1 + 0.2 * torch.randn(cout)).requires_grad_()
    params[name + ".bn.bias"] = (0.1 * torch.randn(cout)).requires_grad_()
    buffers[name + ".bn.running_mean"] = torch.zeros(cout)
    buffers[name + ".bn.running_var"] = torch.ones(cout)


def conv_bn(x, name, stride, training, bufs):
    w = params[name + ".conv.weight"]
    h = F.conv2d(x, w, stride=stride, padding=w.shape[2] // 2)
    return F.batch_norm(h, bufs[name + ".bn.running_mean"], bufs[name + ".bn.running_var"],
                        params[name + ".bn.weight"], params[name + ".bn.bias"],
                        training=training, momentum=MOMENTUM, eps=EPS)


# Parameters in the order the model creates them.
layout = []  # (block name, cin, cout, stride)
conv_bn_params("stem", IN_CHANNELS, WIDTHS[0], 3)
channels = WIDTHS[0]
for s, width in enumerate(WIDTHS):
    for b in range(BLOCKS):
        stride = 2 if s > 0 and b == 0 else 1
        name = f"stage{s + 1}.block{b + 1}"
        conv_bn_params(name + ".a", channels, width, 3)
        conv_bn_params(name + ".b", width, width, 3)
        if stride != 1 or channels != width:
            conv_bn_params(name + ".down", channels, width, 1)
        layout.append((name, channels, width, stride))
        channels = width
params["fc.weight"] = uniform((CLASSES, channels), channels).requires_grad_()
params["fc.bias"] = uniform((CLASSES,), channels).requires_grad_()


def forward(x, training, bufs):
    h = x.reshape(BATCH, IN_CHANNELS, IMAGE, IMAGE)
    h = torch.relu(conv_bn(h, "stem", 1, training, bufs))
    for name, cin, cout, stride in layout:
        a = torch.relu(conv_bn(h, name + ".a", stride, training, bufs))
        a = conv_bn(a, name + ".b", 1, training, bufs)
        short = conv_bn(h, name + ".down", stride, training, bufs) if stride != 1 or cin != cout else h
        h = torch.relu(a + short)
    h = h.mean(dim=(2, 3))
    return F.linear(h, params["fc.weight"], params["fc.bias"])


x = torch.randn(BATCH, IN_CHANNELS * IMAGE * IMAGE)
labels = torch.randint(0, CLASSES, (BATCH,), dtype=torch.int32)
initial = {n: p.detach().clone() for n, p in params.items()}

logits = forward(x, True, buffers)  # updates the running statistics in place
loss = F.cross_entropy(logits, labels.long())
loss.backward()
with torch.no_grad():
    eval_logits = forward(x, False, buffers)


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


out = {
    "generator": f"torch {torch.__version__}",
    "config": {"image": IMAGE, "in_channels": IN_CHANNELS, "widths": WIDTHS, "blocks_per_stage": BLOCKS,
               "classes": CLASSES, "bn_momentum": MOMENTUM},
    "batch": BATCH,
    "x": flat(x),
    "labels": [int(v) for v in labels.tolist()],
    "loss": float(loss),
    "logits": flat(logits),
    "initial": {n: flat(t) for n, t in initial.items()},
    "grad": {n: flat(p.grad) for n, p in params.items()},
    "running_after_step": {n: flat(t) for n, t in buffers.items()},
    "eval_logits": flat(eval_logits),
}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "cnn_golden.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", os.path.normpath(path))
