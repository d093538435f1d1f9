#!/usr/bin/python3
"""Golden data for memplan's sliding-window attention from an independent implementation (PyTorch, CPU).

Writes tests/data/window_golden.json: for each case, queries q [B, H, T, D], keys and values k, v
[B, KH, T, D] (grouped-query attention: query head h reads key/value head h // (H // KH)), a
weighting R of the output, the output y, the loss sum(y * R) and the gradients of q, k and v.

The attention is written here as transformers' eager attention computes it for Mistral with a
sliding window: scores q k^T / sqrt(D), a mask that keeps key j for query i when
i - window < j <= i (causal, and the window: MistralModel's sliding-window causal mask), a softmax
in fp32, then the values.
Run once with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_window_golden.py
The test (tests/attention_test.cpp) needs only the JSON, never torch.
"""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float32)


def window_case(name, seed, B, H, KH, T, D, window):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g).requires_grad_()
    q, k, v = rand(B, H, T, D), rand(B, KH, T, D), rand(B, KH, T, D)
    R = torch.randn(B, H, T, D, generator=g)
    kr = k.repeat_interleave(H // KH, dim=1)
    vr = v.repeat_interleave(H // KH, dim=1)
    scores = q @ kr.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    keep = (j <= i) & (j > i - window)
    scores = scores.masked_fill(~keep, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ vr
    loss = (y * R).sum()
    loss.backward()
    flat = lambda t: [float(f"{float(x):.8g}") for x in t.detach().reshape(-1)]
    return {"name": name, "batch": B, "heads": H, "kv_heads": KH, "seq": T, "head_dim": D, "window": window,
            "q": flat(q), "k": flat(k), "v": flat(v), "R": flat(R), "y": flat(y), "loss": float(loss),
            "grads": {"q": flat(q.grad), "k": flat(k.grad), "v": flat(v.grad)}}


def main():
    cases = [
        # Grouped queries, a window of 6 over 20 positions.
        window_case("gqa window 6 of 20", 1, 2, 4, 2, 20, 8, 6),
        # 300 positions, a window of 60: past the CPU kernel's 128-key tiles, so whole key tiles
        # fall outside later queries' windows.
        window_case("window 60 of 300", 2, 1, 2, 1, 300, 4, 60),
    ]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "window_golden.json")
    with open(out, "w") as f:
        json.dump({"source": "tests/golden/make_window_golden.py (PyTorch " + torch.__version__ + ", CPU)", "cases": cases}, f)
    print("wrote", out)


if __name__ == "__main__":
    main()
