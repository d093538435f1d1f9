#!/usr/bin/python3
"""PyTorch reference for bench/mlp_step.cpp: the same MLP (784-256-256-10, ReLU), batch,
optimizer (AdamW) and step (forward, cross-entropy, backward, update) in eager mode on the CPU.
Prints one JSON object: median step time in ms over --steps steps after --warmup steps."""
import argparse
import json
import statistics
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--sizes", default="784,256,256,10")
args = parser.parse_args()

torch.manual_seed(0)
sizes = [int(s) for s in args.sizes.split(",")]
layers = []
for i in range(len(sizes) - 1):
    layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
    if i + 2 < len(sizes):
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
x = torch.rand(args.batch, sizes[0])
y = torch.randint(0, sizes[-1], (args.batch,))

times = []
for step in range(args.warmup + args.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    t1 = time.perf_counter()
    if step >= args.warmup:
        times.append((t1 - t0) * 1000.0)
print(json.dumps({"torch_version": torch.__version__, "threads": torch.get_num_threads(),
                  "batch": args.batch, "step_time_ms_median": statistics.median(times),
                  "final_loss": float(loss)}))
