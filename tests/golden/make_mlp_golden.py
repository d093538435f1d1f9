#!/usr/bin/python3
"""Golden data for memplan's MLP from an independent implementation (PyTorch, CPU).

Writes tests/data/mlp_golden.json: inputs, labels, initial weights, the loss, every gradient and
the parameters after one AdamW step, for a small MLP (12-16-8-5, ReLU, batch 6). Run once with
Debian's python3-torch:  /usr/bin/python3 tests/golden/make_mlp_golden.py
The test (tests/golden_mlp_test.cpp) needs only the JSON, never torch.
"""
import json
import os

import torch

torch.manual_seed(1234)
torch.set_default_dtype(torch.float32)

SIZES = [12, 16, 8, 5]
BATCH = 6
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.05

layers = []
for i in range(len(SIZES) - 1):
    layers.append(torch.nn.Linear(SIZES[i], SIZES[i + 1]))
params = {}
for i, layer in enumerate(layers):
    params[f"fc{i + 1}.weight"] = layer.weight
    params[f"fc{i + 1}.bias"] = layer.bias

x = torch.randn(BATCH, SIZES[0])
labels = torch.randint(0, SIZES[-1], (BATCH,), dtype=torch.int32)
initial = {name: p.detach().clone() for name, p in params.items()}

h = x
for i, layer in enumerate(layers):
    h = layer(h)
    if i + 1 < len(layers):
        h = torch.relu(h)
loss = torch.nn.functional.cross_entropy(h, labels.long())
loss.backward()

opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
opt.step()


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


out = {
    "generator": f"torch {torch.__version__}",
    "sizes": SIZES,
    "batch": BATCH,
    "adamw": {"lr": LR, "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS, "weight_decay": WEIGHT_DECAY},
    "x": flat(x),
    "labels": [int(v) for v in labels.tolist()],
    "loss": float(loss),
    "initial": {n: flat(t) for n, t in initial.items()},
    "grad": {n: flat(p.grad) for n, p in params.items()},
    "after_step": {n: flat(p) for n, p in params.items()},
}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "mlp_golden.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", os.path.normpath(path))
