#!/usr/bin/python3
"""Golden data for memplan's GPT from an independent implementation (PyTorch, CPU).

Writes tests/data/gpt_golden.json for the config the test builds (vocabulary 13, context 8,
2 blocks, 2 heads, width 16, tied head, no dropout, batch 3): token ids, labels, weights,
the logits, the loss and every parameter gradient. The model is GPT-2's: token + position
embeddings, pre-LN blocks of causal self-attention and an erf-GELU MLP on the residual stream,
a final layer norm, logits from the token embedding. Weights are random, biases and layer-norm
affines included, so the test exercises every parameter.
It also writes tests/data/gpt_autocast_golden.json: the same step under PyTorch's CPU autocast at
bf16 (torch.autocast("cpu", dtype=torch.bfloat16): the linear layers and matmuls in bf16, the
parameters and their gradients in fp32), the reference for memplan's bf16 mixed precision.
Run once with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_gpt_golden.py
The test (tests/golden_gpt_test.cpp) needs only the JSON, never torch.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(2024)
torch.set_default_dtype(torch.float32)

V, T, L, NH, C, B = 13, 8, 2, 2, 16, 3
HD = C // NH
EPS = 1e-5

params = {}  # in the order memplan's model creates them


def param(name, shape, scale):
    params[name] = (scale * torch.randn(shape)).requires_grad_()


param("wte.weight", (V, C), 0.3)
param("wpe.weight", (T, C), 0.3)
for l in range(L):
    n = f"h.{l}"
    param(n + ".ln_1.weight", (C,), 0.2)
    params[n + ".ln_1.weight"].data += 1
    param(n + ".ln_1.bias", (C,), 0.1)
    for m in ("q", "k", "v"):
        param(f"{n}.attn.{m}.weight", (C, C), 0.3)
        param(f"{n}.attn.{m}.bias", (C,), 0.1)
    param(n + ".attn.proj.weight", (C, C), 0.2)
    param(n + ".attn.proj.bias", (C,), 0.1)
    param(n + ".ln_2.weight", (C,), 0.2)
    params[n + ".ln_2.weight"].data += 1
    param(n + ".ln_2.bias", (C,), 0.1)
    param(n + ".mlp.fc.weight", (4 * C, C), 0.3)
    param(n + ".mlp.fc.bias", (4 * C,), 0.1)
    param(n + ".mlp.proj.weight", (C, 4 * C), 0.2)
    param(n + ".mlp.proj.bias", (C,), 0.1)
param("ln_f.weight", (C,), 0.2)
params["ln_f.weight"].data += 1
param("ln_f.bias", (C,), 0.1)

x = torch.randint(0, V, (B, T))
labels = torch.randint(0, V, (B * T,))
p = params


def forward():
    h = p["wte.weight"][x] + p["wpe.weight"][None, :, :]  # [B, T, C]
    h = h.reshape(B * T, C)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        n = f"h.{l}"
        a = F.layer_norm(h, (C,), p[n + ".ln_1.weight"], p[n + ".ln_1.bias"], EPS)

        def heads(m):
            y = F.linear(a, p[f"{n}.attn.{m}.weight"], p[f"{n}.attn.{m}.bias"])
            return y.reshape(B, T, NH, HD).permute(0, 2, 1, 3)

        q, k, v = heads("q"), heads("k"), heads("v")
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).permute(0, 2, 1, 3).reshape(B * T, C)
        h = h + F.linear(y, p[n + ".attn.proj.weight"], p[n + ".attn.proj.bias"])
        m = F.layer_norm(h, (C,), p[n + ".ln_2.weight"], p[n + ".ln_2.bias"], EPS)
        m = F.gelu(F.linear(m, p[n + ".mlp.fc.weight"], p[n + ".mlp.fc.bias"]))
        h = h + F.linear(m, p[n + ".mlp.proj.weight"], p[n + ".mlp.proj.bias"])
    h = F.layer_norm(h, (C,), p["ln_f.weight"], p["ln_f.bias"], EPS)
    return h @ p["wte.weight"].t()


logits = forward()
loss = F.cross_entropy(logits, labels)
loss.backward()


def flat(t):
    return [float(v) for v in t.detach().reshape(-1)]


golden = {
    "config": {"vocab": V, "context": T, "layers": L, "heads": NH, "width": C, "tied_head": True},
    "batch": B,
    "x": [int(v) for v in x.reshape(-1)],
    "labels": [int(v) for v in labels],
    "weights": {name: flat(t) for name, t in params.items()},
    "logits": flat(logits),
    "loss": float(loss),
    "grad": {name: flat(t.grad) for name, t in params.items()},
}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "gpt_golden.json")
with open(out, "w") as f:
    json.dump(golden, f)
print(f"wrote {out}: loss {float(loss):.6f}, {len(params)} parameters")

# The same weights, batch and labels under autocast at bf16.
for t in params.values():
    t.grad = None
with torch.autocast("cpu", dtype=torch.bfloat16):
    auto_logits = forward()
    auto_loss = F.cross_entropy(auto_logits.float(), labels)
auto_loss.backward()
autocast = {
    "dtype": "bf16",
    "torch": torch.__version__,
    "logits": flat(auto_logits.float()),
    "loss": float(auto_loss),
    "grad": {name: flat(t.grad) for name, t in params.items()},
}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "gpt_autocast_golden.json")
with open(out, "w") as f:
    json.dump(autocast, f)
print(f"wrote {out}: loss {float(auto_loss):.6f} (fp32 {float(loss):.6f}), logits {auto_logits.dtype}")
