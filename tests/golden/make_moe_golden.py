#!/usr/bin/python3
"""Golden data for memplan's mixture-of-experts layer from an independent implementation (PyTorch, CPU).

Writes tests/data/moe_golden.json: for each case, the layer's input x [N, C], its weights, a
weighting R of the output, the output y, the loss sum(y * R) (plus the load-balancing loss where
the case has one) and the gradient of every weight and of x.

The layer is written here as transformers writes MixtralSparseMoeBlock and Qwen2MoeSparseMoeBlock
(router linear, softmax in fp32, top-k, optional renormalisation, a loop over the experts each a
SwiGLU MLP, index_add of the weighted outputs; Qwen2-MoE's shared expert scaled by
sigmoid(x w)), with one addition transformers does not make: a capacity per expert, the first
`capacity` tokens routed to an expert in token order kept and the rest dropped for it (GShard's
and Switch's rule; None: every token kept, which is transformers' computation). The
load-balancing loss is transformers' load_balancing_loss_func for one layer.
Run once with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_moe_golden.py
The test (tests/decoder_families_test.cpp) needs only the JSON, never torch.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float32)


def moe_case(name, seed, N, C, E, k, Fe, normalize, capacity, shared=0, aux_coef=0.0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape, s=0.5: (s * torch.randn(*shape, generator=g)).requires_grad_()
    x = rand(N, C, s=1.0)
    w = {  # memplan's names and its stacked [E, out, in] layout
        "mlp.gate.weight": rand(E, C),
        "mlp.experts.gate_proj.weight": rand(E, Fe, C),
        "mlp.experts.up_proj.weight": rand(E, Fe, C),
        "mlp.experts.down_proj.weight": rand(E, C, Fe),
    }
    if shared:
        w["mlp.shared_expert.gate_proj.weight"] = rand(shared, C)
        w["mlp.shared_expert.up_proj.weight"] = rand(shared, C)
        w["mlp.shared_expert.down_proj.weight"] = rand(C, shared)
        w["mlp.shared_expert_gate.weight"] = rand(1, C)
    R = torch.randn(N, C, generator=g)

    logits = x @ w["mlp.gate.weight"].t()
    probs = F.softmax(logits, dim=1, dtype=torch.float)
    top, chosen = torch.topk(probs, k, dim=-1)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    y = torch.zeros(N, C)
    dropped = 0
    for e in range(E):
        tokens, slot = torch.where(chosen == e)  # ascending tokens: token order
        if capacity is not None:
            dropped += max(0, len(tokens) - capacity)
            tokens, slot = tokens[:capacity], slot[:capacity]
        xe = x[tokens]
        h = F.silu(xe @ w["mlp.experts.gate_proj.weight"][e].t()) * (xe @ w["mlp.experts.up_proj.weight"][e].t())
        out = (h @ w["mlp.experts.down_proj.weight"][e].t()) * top[tokens, slot, None]
        y = y.index_add(0, tokens, out)
    if shared:
        s = F.silu(x @ w["mlp.shared_expert.gate_proj.weight"].t()) * (x @ w["mlp.shared_expert.up_proj.weight"].t())
        s = s @ w["mlp.shared_expert.down_proj.weight"].t()
        y = y + torch.sigmoid(x @ w["mlp.shared_expert_gate.weight"].t()) * s
    loss = (y * R).sum()
    if aux_coef > 0:
        # load_balancing_loss_func for one layer's logits, no attention mask.
        expert_mask = F.one_hot(chosen, E)  # [N, k, E]
        tokens_per_expert = expert_mask.float().mean(dim=0)  # [k, E]
        router_prob_per_expert = probs.mean(dim=0)  # [E]
        loss = loss + aux_coef * (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * E
    loss.backward()
    flat = lambda t: [float(v) for v in t.detach().reshape(-1)]
    return {
        "name": name, "tokens": N, "width": C, "experts": E, "top_k": k, "expert_ffn": Fe,
        "normalize": normalize, "capacity": capacity if capacity is not None else N,
        "shared_ffn": shared, "aux_loss_coef": aux_coef, "dropped": dropped,
        "x": flat(x), "R": flat(R), "weights": {n: flat(t) for n, t in w.items()},
        "y": flat(y), "loss": float(loss),
        "grads": dict({n: flat(t.grad) for n, t in w.items()}, x=flat(x.grad)),
    }


cases = [
    # Mixtral: 2 of 4 renormalised, nothing dropped, the load-balancing loss.
    moe_case("mixtral", 1, N=12, C=8, E=4, k=2, Fe=6, normalize=True, capacity=None, aux_coef=0.1),
    # Qwen2-MoE: 2 of 4 not renormalised, a shared expert, 6 slots per expert (the balanced share
    # of 12 x 2 / 4): unbalanced routing drops tokens.
    moe_case("qwen2_moe", 2, N=12, C=8, E=4, k=2, Fe=5, normalize=False, capacity=6, shared=10),
    # Switch: the top 1 of 3 weighted by its probability, 3 slots per expert.
    moe_case("switch", 3, N=10, C=6, E=3, k=1, Fe=4, normalize=False, capacity=3),
]
for c in cases:
    print(f"{c['name']}: loss {c['loss']:.6f}, {c['dropped']} token copies dropped")
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "moe_golden.json")
with open(out, "w") as f:
    json.dump({"source": "tests/golden/make_moe_golden.py (PyTorch " + torch.__version__ + ")", "cases": cases}, f)
print("wrote", out)
