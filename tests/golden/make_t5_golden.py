#!/usr/bin/python3
"""Golden data for memplan's T5 (models/t5.h) from an independent implementation (PyTorch, CPU).

Writes tests/data/t5_golden.json:
- "buckets": transformers' _relative_position_bucket over distances -600..600 for the encoder's
  (bidirectional) and the decoder's (causal) setting at T5's 32 buckets / 128 max distance and at
  the small cases' settings, computed with torch's float32 log as transformers does;
- "cases": a whole small T5ForConditionalGeneration forward and backward, written here as
  transformers writes it (T5LayerNorm, T5Attention with unscaled scores plus the relative bias of
  the first block shared by the stack, T5DenseActDense / T5DenseGatedActDense, the tied head's
  d_model^-0.5 rescale), dropout 0: the encoder's and decoder's token ids, labels, every weight,
  the mean cross-entropy loss, the logits and every weight's gradient.

Run once with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_t5_golden.py
The test (tests/t5_test.cpp) needs only the JSON, never torch.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float32)


def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    # transformers' T5Attention._relative_position_bucket
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def compute_bias(table, q_len, k_len, bidirectional, num_buckets, max_distance):
    context = torch.arange(q_len, dtype=torch.long)[:, None]
    memory = torch.arange(k_len, dtype=torch.long)[None, :]
    buckets = relative_position_bucket(memory - context, bidirectional, num_buckets, max_distance)
    values = F.embedding(buckets, table)  # [q, k, H]
    return values.permute([2, 0, 1]).unsqueeze(0)  # [1, H, q, k]


def rms(x, w, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def t5_case(name, seed, V, C, D, H, Fd, L, Ld, NB, MD, B, S, T, act, gated, tied):
    g = torch.Generator().manual_seed(seed)
    w = {}

    def param(n, *shape, s=0.3):
        w[n] = (s * torch.randn(*shape, generator=g)).requires_grad_()
        return w[n]

    inner = H * D
    param("shared.weight", V, C, s=1.0)

    def attention(x, kv, prefix, bias, causal):
        q = x @ param(prefix + ".q.weight", inner, C).t()
        k = kv @ param(prefix + ".k.weight", inner, C).t()
        v = kv @ param(prefix + ".v.weight", inner, C).t()
        heads = lambda t: t.view(B, -1, H, D).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(3, 2)  # T5: no 1/sqrt(D)
        if bias is not None:
            scores = scores + bias
        if causal:
            tq, tk = scores.shape[-2:]
            mask = torch.triu(torch.ones(tq, tk, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores.float(), dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(B, -1, inner)
        return out @ param(prefix + ".o.weight", C, inner).t()

    act_fn = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[act]

    def mlp(x, prefix):
        if gated:
            h = act_fn(x @ param(prefix + ".wi_0.weight", Fd, C).t()) * (x @ param(prefix + ".wi_1.weight", Fd, C).t())
        else:
            h = act_fn(x @ param(prefix + ".wi.weight", Fd, C).t())
        return h @ param(prefix + ".wo.weight", C, Fd).t()

    def param_norm(prefix):  # T5LayerNorm's weight, around one
        w[prefix + ".weight"] = (1.0 + 0.3 * torch.randn(C, generator=g)).requires_grad_()
        return w[prefix + ".weight"]

    x_ids = torch.randint(0, V, (B, S), generator=g)
    y_ids = torch.randint(0, V, (B, T), generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)

    # encoder
    table_e = param("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", NB, H)
    bias_e = compute_bias(table_e, S, S, True, NB, MD)
    h = F.embedding(x_ids, w["shared.weight"])
    for l in range(L):
        n = "encoder.block.%d.layer." % l
        a_in = rms(h, param_norm(n + "0.layer_norm"), 1e-6)
        h = h + attention(a_in, a_in, n + "0.SelfAttention", bias_e, False)
        m_in = rms(h, param_norm(n + "1.layer_norm"), 1e-6)
        h = h + mlp(m_in, n + "1.DenseReluDense")
    encoded = rms(h, param_norm("encoder.final_layer_norm"), 1e-6)

    # decoder
    table_d = param("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", NB, H)
    bias_d = compute_bias(table_d, T, T, False, NB, MD)
    h = F.embedding(y_ids, w["shared.weight"])
    for l in range(Ld):
        n = "decoder.block.%d.layer." % l
        a_in = rms(h, param_norm(n + "0.layer_norm"), 1e-6)
        h = h + attention(a_in, a_in, n + "0.SelfAttention", bias_d, True)
        c_in = rms(h, param_norm(n + "1.layer_norm"), 1e-6)
        h = h + attention(c_in, encoded, n + "1.EncDecAttention", None, False)
        m_in = rms(h, param_norm(n + "2.layer_norm"), 1e-6)
        h = h + mlp(m_in, n + "2.DenseReluDense")
    h = rms(h, param_norm("decoder.final_layer_norm"), 1e-6)
    if tied:
        h = h * (C ** -0.5)
        head = w["shared.weight"]
    else:
        head = param("lm_head.weight", V, C)
    logits = h @ head.t()
    loss = F.cross_entropy(logits.view(-1, V), labels.view(-1))
    loss.backward()
    flat = lambda t: [float(v) for v in t.detach().reshape(-1)]
    return {
        "name": name,
        "vocab": V, "width": C, "head_size": D, "heads": H, "ffn": Fd, "layers": L, "decoder_layers": Ld,
        "buckets": NB, "max_distance": MD, "batch": B, "seq": S, "target_seq": T,
        "act": act, "gated": gated, "tied": tied,
        "x": [int(v) for v in x_ids.reshape(-1)],
        "decoder_x": [int(v) for v in y_ids.reshape(-1)],
        "labels": [int(v) for v in labels.reshape(-1)],
        "weights": {k: flat(v) for k, v in w.items()},
        "loss": float(loss),
        "logits": flat(logits),
        "grads": {k: flat(v.grad) for k, v in w.items()},
    }


def main():
    out = {"torch": torch.__version__, "buckets": [], "cases": []}
    distances = torch.arange(-600, 601, dtype=torch.long)
    for nb, md, bidirectional in [(32, 128, True), (32, 128, False), (8, 10, True), (8, 10, False)]:
        out["buckets"].append({
            "buckets": nb, "max_distance": md, "bidirectional": bidirectional, "first": -600,
            "values": [int(v) for v in relative_position_bucket(distances, bidirectional, nb, md)],
        })
    # Distances up to 12 > max_distance 10 reach the exact, logarithmic and last buckets; a head
    # size apart from the width; more encoder than decoder blocks.
    out["cases"].append(t5_case("t5 relu tied", 11, V=23, C=16, D=4, H=3, Fd=20, L=2, Ld=1, NB=8, MD=10,
                                B=2, S=13, T=9, act="relu", gated=False, tied=True))
    out["cases"].append(t5_case("gated silu untied", 12, V=19, C=12, D=5, H=2, Fd=14, L=1, Ld=2, NB=8, MD=10,
                                B=2, S=7, T=11, act="silu", gated=True, tied=False))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "t5_golden.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
