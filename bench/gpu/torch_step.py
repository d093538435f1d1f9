#!/usr/bin/python3
"""PyTorch eager on the GPU, for bench/gpu/run.sh: the same models, batches and optimizer
(AdamW) as bench_gpu_step. Per model: median step time (forward, cross-entropy, backward,
AdamW step; synchronized), torch.cuda.max_memory_reserved() over the timed run, and the largest
batch that survives a step under torch.cuda.set_per_process_memory_fraction(budget / total)
(doubling, then bisection, capped at the same limit memplan's search uses).
Reads bench_gpu_step's JSON (--memplan) for the cases; writes one JSON object (--out)."""
import argparse
import gc
import json
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch_step.py: PyTorch is not installed here; the comparison columns stay empty", file=sys.stderr)
    sys.exit(3)


class ConvBN(nn.Module):
    def __init__(self, cin, cout, k, stride):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = ConvBN(cin, cout, 3, stride)
        self.b = ConvBN(cout, cout, 3, 1)
        self.down = ConvBN(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        h = self.b(F.relu(self.a(x)))
        return F.relu(h + (self.down(x) if self.down is not None else x))


class ResNet(nn.Module):
    """memplan's CNN: conv-BN-ReLU stem, one block per stage, stages after the first halve the
    resolution, global average pooling, a linear layer."""

    def __init__(self, widths=(16, 32, 64), classes=10):
        super().__init__()
        self.stem = ConvBN(1, widths[0], 3, 1)
        blocks, c = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(Block(c, w, 2 if i > 0 else 1))
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        h = self.blocks(F.relu(self.stem(x.view(-1, 1, 28, 28))))
        return self.fc(h.mean(dim=(2, 3)))


class GPT(nn.Module):
    """GPT-2: token + position embeddings, pre-LN blocks (causal attention, erf-GELU MLP), final
    layer norm, logits from the token embedding (tied head)."""

    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "ln_1": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width), "proj": nn.Linear(width, width),
                "ln_2": nn.LayerNorm(width), "fc": nn.Linear(width, 4 * width), "out": nn.Linear(4 * width, width)}))
        self.ln_f = nn.LayerNorm(width)
        for m in self.modules():  # GPT-2's initialisation, as memplan's model uses
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x):
        B, T = x.shape
        h = self.wte(x) + self.wpe(torch.arange(T, device=x.device))
        C = h.shape[-1]
        for blk in self.blocks:
            a = blk["ln_1"](h)
            q, k, v = blk["qkv"](a).split(C, dim=-1)
            q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
            # Fused attention (no [T, T] tensor kept), as memplan's default: PyTorch's own
            # scaled_dot_product_attention, which picks its memory-efficient kernel for FP32.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            h = h + blk["proj"](y)
            h = h + blk["out"](F.gelu(blk["fc"](blk["ln_2"](h))))
        return (self.ln_f(h) @ self.wte.weight.t()).view(B * T, -1)


def make(case, batch, device):
    name = case["model"]
    if name.startswith("mlp"):
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        x = torch.rand(batch, 784, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
    elif name.startswith("cnn"):
        model = ResNet()
        x = torch.rand(batch, 784, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
    elif name.startswith("gpt"):
        model = GPT(96, 64, 2, 4, 128)
        x = torch.randint(0, 96, (batch, 64), device=device)
        y = torch.randint(0, 96, (batch * 64,), device=device)
    else:  # GPT-2 124M
        model = GPT(50257, 1024, 12, 12, 768)
        x = torch.randint(0, 50257, (batch, 1024), device=device)
        y = torch.randint(0, 50257, (batch * 1024,), device=device)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    return model, opt, x, y


def step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def release():
    gc.collect()
    torch.cuda.empty_cache()


def survives(case, batch, device):
    try:
        model, opt, x, y = make(case, batch, device)
        step(model, opt, x, y)
        step(model, opt, x, y)  # the second step holds AdamW's state too
        torch.cuda.synchronize()
        ok = True
    except torch.cuda.OutOfMemoryError:
        ok = False
    model = opt = x = y = None
    release()
    return ok


def max_batch(case, device):
    limit = case["batch_limit"]
    if not survives(case, 1, device):
        return 0
    lo, hi = 1, 2
    while hi <= limit and survives(case, hi, device):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if survives(case, mid, device) else (lo, mid)
    return lo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", required=True, help="bench_gpu_step's JSON: the cases to run")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_step.py: torch sees no CUDA device", file=sys.stderr)
        sys.exit(3)
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # plain FP32 GEMMs, as memplan runs them
    torch.backends.cudnn.allow_tf32 = False
    cases = json.load(open(args.memplan))["results"]
    total = torch.cuda.get_device_properties(0).total_memory
    out = {"torch_version": torch.__version__, "device": torch.cuda.get_device_name(0), "results": []}
    for case in cases:
        torch.manual_seed(0)
        release()
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.reset_peak_memory_stats()
        model, opt, x, y = make(case, case["batch"], device)
        times = []
        for i in range(3 + case.get("steps", 10)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step(model, opt, x, y)
            loss.item()
            t1 = time.perf_counter()
            if i >= 3:
                times.append((t1 - t0) * 1000.0)
        reserved = torch.cuda.max_memory_reserved()
        model = opt = x = y = None
        release()
        torch.cuda.set_per_process_memory_fraction(min(1.0, case["budget_bytes"] / total))
        mb = max_batch(case, device)
        torch.cuda.set_per_process_memory_fraction(1.0)
        out["results"].append({"model": case["model"], "batch": case["batch"], "step_ms_median": statistics.median(times),
                               "max_memory_reserved_bytes": reserved, "budget_bytes": case["budget_bytes"],
                               "max_batch": mb, "final_loss": float(loss)})
        print(f"{case['model']}: {statistics.median(times):.2f} ms, reserved {reserved / 2**20:.1f} MiB, max batch {mb}",
              file=sys.stderr)
    json.dump(out, open(args.out, "w"), indent=2)


if __name__ == "__main__":
    main()
