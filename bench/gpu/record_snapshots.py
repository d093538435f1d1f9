#!/usr/bin/env python3
"""Records PyTorch CUDA memory snapshots of varied runs, as fixtures for `memplan replay`.

Each scenario runs in a process of its own (a fresh caching allocator; expandable segments are
chosen by PYTORCH_CUDA_ALLOC_CONF before CUDA starts) and writes DIR/<scenario>.pickle with
torch.cuda.memory._dump_snapshot, plus DIR/manifest.json (PyTorch version, GPU, what each run did).
Nothing is downloaded: the models are built here with random weights and random data.

    python3 bench/gpu/record_snapshots.py --out DIR [--only NAME ...]

Scenarios (docs/memory_snapshots.md says what replay checks on them):
  gpt_step             three AdamW steps of a small GPT, recorded from the first allocation
  gpt_step_expandable  the same with expandable segments
  resnet               three SGD steps of torchvision's ResNet-18 at 64x64 (a conv net without torchvision)
  two_streams          matmuls on a side stream whose results the default stream frees (record_stream)
  mid_training         five steps unrecorded, then three recorded: the snapshot starts with live segments
  oom                  a memory cap, then tensors allocated until the allocator raises out-of-memory
"""
import argparse
import json
import os
import subprocess
import sys
import time

SCENARIOS = ["gpt_step", "gpt_step_expandable", "resnet", "two_streams", "mid_training", "oom"]
# --check-on-cpu runs the model scenarios' code on the CPU, recording nothing (a check of this
# script where no GPU is).
DEVICE = "cuda"


def start_recording(torch, max_entries=200000):
    if DEVICE != "cuda":
        return
    mem = torch.cuda.memory
    try:  # PyTorch >= 2.1
        mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    except TypeError:  # 2.0's signature
        mem._record_memory_history(True, trace_alloc_max_entries=max_entries, trace_alloc_record_context=True)


def gpt(torch, vocab=256, width=256, layers=4, heads=4, seq=256):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) / (c // heads) ** 0.5
                s = s.masked_fill(torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1), float("-inf"))
                a = s.softmax(-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)

        def forward(self, ids):
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.tok.weight.t()

    return Gpt()


def train_gpt(torch, steps_before, steps, batch=16, seq=256):
    torch.manual_seed(0)
    model = gpt(torch, seq=seq).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps_before + steps):
        if step == steps_before:
            start_recording(torch)
        ids = torch.randint(0, 256, (batch, seq + 1), device=DEVICE)
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return {"model": "GPT 4 layers, width 256, 4 heads, vocab 256", "batch": batch, "seq": seq,
            "steps_unrecorded": steps_before, "steps_recorded": steps, "optimizer": "AdamW"}


def run_resnet(torch):
    torch.manual_seed(0)
    try:
        import torchvision
        model, name = torchvision.models.resnet18(num_classes=10), "torchvision resnet18"
    except ImportError:
        nn = torch.nn
        model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
        name = "conv net (torchvision absent)"
    model = model.to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start_recording(torch)
    for _ in range(3):
        x = torch.randn(32, 3, 64, 64, device=DEVICE)
        y = torch.randint(0, 10, (32,), device=DEVICE)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return {"model": name, "batch": 32, "image": "3x64x64", "steps_recorded": 3, "optimizer": "SGD momentum"}


def run_two_streams(torch):
    torch.manual_seed(0)
    side = torch.cuda.Stream()
    start_recording(torch)
    w = torch.randn(1024, 1024, device=DEVICE)
    for i in range(8):
        x = torch.randn(2048, 1024, device=DEVICE)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x @ w  # allocated in the side stream's pool
            z = torch.relu(y)
        torch.cuda.current_stream().wait_stream(side)
        z.record_stream(torch.cuda.current_stream())  # freed for reuse only after the default stream's use
        s = (z * (i + 1)).sum()
        del x, y, z
        s.item()
    torch.cuda.synchronize()
    return {"what": "8 rounds: 2048x1024 input on the default stream, matmul and relu on a side stream, "
                    "result used and freed on the default stream (record_stream)"}


def run_oom(torch):
    free, total = torch.cuda.mem_get_info()
    cap_bytes = 2 << 30  # a 2 GiB cap
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total))
    start_recording(torch)
    kept, size, raised = [], 64 << 20, False
    try:
        for _ in range(1000):
            kept.append(torch.empty(size // 4, dtype=torch.float32, device=DEVICE))
            size = size * 3 // 2
    except torch.cuda.OutOfMemoryError:
        raised = True
    return {"cap_bytes": cap_bytes, "tensors_before_oom": len(kept), "raised_out_of_memory": raised,
            "what": "float32 tensors of 64 MiB growing by 1.5x, all kept, until the capped allocator raised"}


def scenario(name, out_dir):
    import torch
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: these recordings need a GPU")
    if name in ("gpt_step", "gpt_step_expandable"):
        info = train_gpt(torch, 0, 3)
    elif name == "mid_training":
        info = train_gpt(torch, 5, 3)
    elif name == "resnet":
        info = run_resnet(torch)
    elif name == "two_streams":
        info = run_two_streams(torch)
    elif name == "oom":
        info = run_oom(torch)
    else:
        sys.exit(f"unknown scenario {name}")
    path = os.path.join(out_dir, name + ".pickle")
    torch.cuda.memory._dump_snapshot(path)
    info.update({"file": name + ".pickle", "bytes": os.path.getsize(path),
                 "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                 "max_memory_reserved": torch.cuda.max_memory_reserved()})
    print(json.dumps(info))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the .pickle files and manifest.json")
    ap.add_argument("--only", nargs="*", choices=SCENARIOS, help="record these scenarios only")
    ap.add_argument("--scenario", help=argparse.SUPPRESS)  # internal: run one scenario in this process
    ap.add_argument("--check-on-cpu", action="store_true",
                    help="run the GPT and ResNet scenarios' code on the CPU, recording nothing (checks this script)")
    args = ap.parse_args()
    if args.check_on_cpu:
        global DEVICE
        DEVICE = "cpu"
        import torch
        for info in (train_gpt(torch, 1, 1, batch=2, seq=32), run_resnet(torch)):
            print(json.dumps(info))
        return None
    os.makedirs(args.out, exist_ok=True)
    if args.scenario:
        return scenario(args.scenario, args.out)
    import torch
    manifest = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "scenarios": {}}
    failed = []
    for name in args.only or SCENARIOS:
        env = dict(os.environ)
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True" if name.endswith("expandable") else ""
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, "--out", args.out, "--scenario", name], env=env,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            print(f"{name}: failed (exit {r.returncode})\n{r.stderr[-2000:]}", file=sys.stderr)
            failed.append(name)
            continue
        info = json.loads(r.stdout.strip().splitlines()[-1])
        info["seconds"] = round(time.time() - t0, 1)
        manifest["scenarios"][name] = info
        print(f"{name}: {info['bytes']} bytes, {info['seconds']} s")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
