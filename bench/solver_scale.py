#!/usr/bin/env python3
"""Offset assignment at the size of long recordings, side by side for two memplan binaries.

Real training-step traces (bench/data/real-traces, MiniMalloc CSV: medium_128_training, whose
greedy packing is at its bound, and medium_512_training, which needs the search) are repeated in
time to 10k, 30k, 100k and 300k buffers, as a recording of several steps is:
  independent  the copies one after another, nothing alive across them;
  shared       plus 2% more buffers alive across every copy (parameters, blocks allocated
               before the recording began), sizes drawn from the trace's;
  edges        (--variants edges) plus 1% more buffers alive from the recording's start into
               its first step, or from its last step to the end.
Each instance is solved by `memplan solve --json --time-limit T` with each binary, minimising
the height and, once more, with the budget set to the lower bound (can the binary prove the
bound is reachable, and does it say honestly why it stopped). Prints a markdown table (height
over the lower bound, the solver's seconds (solve_ms) and the command's (reading the CSV and
validating the packing too)) and writes JSON.

  python3 bench/solver_scale.py NEW_MEMPLAN [OLD_MEMPLAN] [--sizes 10000,30000,100000,300000]
      [--time-limit 10] [--traces A.csv,B.csv] [--json-out bench_solver_scale.json]
"""
import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_trace(path):
    buffers = []
    with open(path) as f:
        for row in csv.DictReader(f):
            buffers.append((int(row["lower"]), int(row["upper"]), int(row["size"])))
    return buffers


def with_edges(trace, buffers, share, seed=11):
    span = max(u for _, u, _ in trace) + 1
    end = max(u for _, u, _ in buffers)
    rng = random.Random(seed)
    sizes = [s for _, _, s in trace]
    out = list(buffers)
    for _ in range(int(share * len(buffers))):
        if rng.random() < 0.5:
            out.append((0, rng.randrange(1, span), rng.choice(sizes)))
        else:
            out.append((rng.randrange(end - span, end - 1), end, rng.choice(sizes)))
    return out


def repeated(trace, target, shared_share, seed=7):
    span = max(u for _, u, _ in trace) + 1
    copies = max(1, -(-target // len(trace)))
    out = []
    for c in range(copies):
        for lo, up, size in trace:
            out.append((lo + c * span, up + c * span, size))
    out = out[:target]
    if shared_share > 0:
        rng = random.Random(seed)
        end = max(u for _, u, _ in out)
        sizes = [s for _, _, s in trace]
        for _ in range(int(shared_share * len(out))):
            out.append((0, end, rng.choice(sizes)))
    return out


def write_csv(path, buffers):
    with open(path, "w") as f:
        f.write("id,lower,upper,size\n")
        for i, (lo, up, size) in enumerate(buffers):
            f.write(f"{i},{lo},{up},{size}\n")


def solve(binary, path, time_limit, budget=None):
    cmd = [binary, "solve", "--input", path, "--json", "--stats", "--time-limit", str(time_limit)]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    try:
        out = json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"exit": r.returncode, "wall_s": wall, "error": (r.stderr or r.stdout)[-400:]}
    out["exit"] = r.returncode
    out["wall_s"] = wall
    out["message"] = r.stderr.strip()
    return out


def ratio(run):
    if run.get("height") is None or not run.get("lower_bound"):
        return None
    return run["height"] / run["lower_bound"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new")
    ap.add_argument("old", nargs="?")
    ap.add_argument("--sizes", default="10000,30000,100000,300000")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--traces", default=",".join(os.path.join(ROOT, "bench/data/real-traces", f)
                                                 for f in ("medium_128_training.csv", "medium_512_training.csv")))
    ap.add_argument("--variants", default="independent,shared")
    ap.add_argument("--json-out", default="bench_solver_scale.json")
    args = ap.parse_args()
    binaries = [("new", args.new)] + ([("old", args.old)] if args.old else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for trace_path in args.traces.split(","):
            trace = read_trace(trace_path)
            for variant in args.variants.split(","):
                for target in (int(s) for s in args.sizes.split(",")):
                    buffers = repeated(trace, target, 0.02 if variant == "shared" else 0.0)
                    if variant == "edges":
                        buffers = with_edges(trace, buffers, 0.01)
                    path = os.path.join(tmp, f"{variant}_{target}.csv")
                    write_csv(path, buffers)
                    row = {"variant": variant, "buffers": len(buffers), "trace": os.path.basename(trace_path)}
                    for name, binary in binaries:
                        free = solve(binary, path, args.time_limit)
                        row[name] = free
                        if free.get("lower_bound"):
                            row[name + "_at_bound"] = solve(binary, path, args.time_limit, budget=free["lower_bound"])
                        print(f"  {row['trace']} {variant} {len(buffers)} {name}: {ratio(free)} in {free['wall_s']:.1f} s",
                              file=sys.stderr)
                    rows.append(row)

    def cell(run):
        r = ratio(run)
        return "-" if r is None else f"{r:.4f}"

    def bound_cell(run):
        if run is None:
            return "-"
        if run.get("height") is not None:
            return f"found, {run.get('solve_ms', 0) / 1000:.2f} s"
        return f"{run.get('status')} (stopped: {run.get('stopped', 'not said')}), {run.get('solve_ms', 0) / 1000:.2f} s"

    def seconds(run):
        solve_ms = run.get("solve_ms")
        return f"{solve_ms / 1000:.2f} ({run['wall_s']:.1f})" if solve_ms is not None else f"- ({run['wall_s']:.1f})"

    head = "| trace | variant | buffers |" + "".join(
        f" {n}: height / LB | {n}: solver s (command s) | {n}: parts | {n}: budget = LB |" for n, _ in binaries)
    print(head)
    print("|" + " --- |" * (3 + 4 * len(binaries)))
    for row in rows:
        line = f"| {row['trace']} | {row['variant']} | {row['buffers']} |"
        for name, _ in binaries:
            run = row[name]
            parts = run.get("stats", {}).get("distinct_parts")
            parts_cell = f"{run.get('parts', 1)} ({parts} distinct)" if parts is not None else "-"
            line += f" {cell(run)} | {seconds(run)} | {parts_cell} | {bound_cell(row.get(name + '_at_bound'))} |"
        print(line)
    with open(args.json_out, "w") as f:
        json.dump({"time_limit_s": args.time_limit, "binaries": dict(binaries), "rows": rows}, f, indent=1)
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
