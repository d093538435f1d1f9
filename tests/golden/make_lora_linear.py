"""Golden values for tests/lora_test.cpp: one LoRA linear layer as PEFT computes it
(peft/tuners/lora/layer.py: result = base(x) + lora_B(lora_A(dropout(x))) * scaling), forward and
gradients, computed by PyTorch in float64 from fixed values and written to tests/data/lora_linear_golden.json.

    python3 tests/golden/make_lora_linear.py   # Debian's python3-torch
"""
import json
import os

import torch

torch.manual_seed(7)
n, d_in, d_out, r, alpha = 4, 6, 5, 2, 4.0
x = (torch.rand(n, d_in, dtype=torch.float64) * 2 - 1)
w = (torch.rand(d_out, d_in, dtype=torch.float64) * 2 - 1) * 0.5
a = (torch.rand(r, d_in, dtype=torch.float64) * 2 - 1) * 0.5
b = (torch.rand(d_out, r, dtype=torch.float64) * 2 - 1) * 0.5  # nonzero: a trained adapter
weights = torch.rand(n, d_out, dtype=torch.float64)           # the loss: sum(y * weights)
a.requires_grad_(True)
b.requires_grad_(True)
x.requires_grad_(True)

base = torch.nn.functional.linear(x, w)  # the frozen layer
y = base + torch.nn.functional.linear(torch.nn.functional.linear(x, a), b) * (alpha / r)
loss = (y * weights).sum()
loss.backward()

out = {
    "n": n, "in": d_in, "out": d_out, "rank": r, "alpha": alpha,
    "x": x.detach().flatten().tolist(), "w": w.flatten().tolist(), "a": a.detach().flatten().tolist(),
    "b": b.detach().flatten().tolist(), "weights": weights.flatten().tolist(),
    "y": y.detach().flatten().tolist(), "grad_a": a.grad.flatten().tolist(), "grad_b": b.grad.flatten().tolist(),
    "grad_x": x.grad.flatten().tolist(), "torch": torch.__version__,
}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "lora_linear_golden.json"), "w") as f:
    json.dump(out, f, indent=1)
