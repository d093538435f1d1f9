#!/usr/bin/python3
"""PyTorch reference for bench/model_step.cpp: the same model, batch, optimizer (AdamW, lr 1e-3)
and step (forward, cross-entropy, backward, update) in eager mode on the CPU, for memplan's three
reference models at the shapes bench/model_step.cpp uses:
  mlp: 784-256-256-10, ReLU;  cnn: ResNet, stem 3x3 16, stages 16/32/64 (one basic block each,
  1x1 conv shortcut when the shape changes), batch norm, on 1x28x28;  gpt: 2 blocks, width 128,
  4 heads, context 64, vocab 96, GELU, tied head.
Prints one JSON object: median and mean step time in ms over --steps steps after --warmup steps."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="mlp")
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
args = parser.parse_args()
if args.threads > 0:
    torch.set_num_threads(args.threads)
torch.manual_seed(0)


class ConvBn(nn.Sequential):
    def __init__(self, cin, cout, k, stride):
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = ConvBn(cin, cout, 3, stride)
        self.b = ConvBn(cout, cout, 3, 1)
        self.down = ConvBn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        h = self.b(torch.relu(self.a(x)))
        return torch.relu(h + (self.down(x) if self.down is not None else x))


class Cnn(nn.Module):
    def __init__(self, widths=(16, 32, 64), classes=10):
        super().__init__()
        self.stem = ConvBn(1, widths[0], 3, 1)
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(Block(cin, w, 2 if i > 0 else 1))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        h = self.blocks(torch.relu(self.stem(x.view(-1, 1, 28, 28))))
        return self.fc(h.mean(dim=(2, 3)))


class Gpt(nn.Module):
    def __init__(self, vocab=96, context=64, layers=2, heads=4, width=128):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "ln_1": nn.LayerNorm(width), "q": nn.Linear(width, width), "k": nn.Linear(width, width),
                "v": nn.Linear(width, width), "proj": nn.Linear(width, width), "ln_2": nn.LayerNorm(width),
                "fc": nn.Linear(width, 4 * width), "out": nn.Linear(4 * width, width)}))
        self.ln_f = nn.LayerNorm(width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))
        for name, p in self.named_parameters():  # GPT-2's initialisation, as memplan's
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" not in name:
                nn.init.normal_(p, std=0.02)

    def forward(self, x):
        b, t = x.shape
        h = self.wte(x) + self.wpe.weight[:t]
        c, nh = h.shape[-1], self.heads
        for blk in self.blocks:
            a = blk["ln_1"](h)
            q, k, v = (blk[m](a).view(b, t, nh, c // nh).transpose(1, 2) for m in ("q", "k", "v"))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (c // nh) ** 0.5)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            h = h + blk["proj"](y)
            h = h + blk["out"](F.gelu(blk["fc"](blk["ln_2"](h))))
        return self.ln_f(h).view(b * t, c) @ self.wte.weight.t()


if args.model == "mlp":
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.rand(args.batch, 784), torch.randint(0, 10, (args.batch,))
elif args.model == "cnn":
    model = Cnn()
    x, y = torch.rand(args.batch, 784), torch.randint(0, 10, (args.batch,))
else:
    model = Gpt()
    x, y = torch.randint(0, 96, (args.batch, 64)), torch.randint(0, 96, (args.batch * 64,))
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

times, losses = [], []
for step in range(args.warmup + args.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    t1 = time.perf_counter()
    losses.append(float(loss))
    if step >= args.warmup:
        times.append((t1 - t0) * 1000.0)
# The BLAS library PyTorch's GEMMs went to: Debian's python3-torch calls whichever libblas.so.3
# the alternatives system names, the reference BLAS unless OpenBLAS (libopenblas0) is installed.
with open("/proc/self/maps") as maps:
    blas = sorted({path for path in (line.split()[-1] for line in maps)
                   if "blas" in os.path.basename(path) or "mkl" in os.path.basename(path)})
print(json.dumps({"torch_version": torch.__version__, "blas": ", ".join(blas) or "none found",
                  "threads": torch.get_num_threads(), "model": args.model,
                  "batch": args.batch, "step_time_ms_median": statistics.median(times),
                  "step_time_ms_mean": statistics.fmean(times),
                  "first_loss": losses[0], "final_loss": losses[-1]}))
