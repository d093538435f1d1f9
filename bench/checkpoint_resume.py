#!/usr/bin/env python3
"""Periodic checkpoints (train --save-dir): what they cost, and whether killed runs resume exactly.

overhead  The GPT at its train defaults (2 blocks x 128, batch 32 x 64 characters), --steps N
          (default 300), without checkpoints and with --save-every 50, interleaved round by round
          (--rounds, default 3). Per configuration: the run's training seconds (train_seconds:
          the steps plus the snapshots taken between them), the median step, and per save the
          snapshot time (between steps, the only part training waits for) and the write time
          (on the writer thread, alongside the next steps). The overhead is the ratio of
          training seconds, median over the rounds.
kills     A small GPT (dropout 0.1, cosine schedule: both follow the step count; 300 steps,
          --save-every 10) per configuration (fp32, bf16, each with and without --checkpoint
          sqrt). An episode starts in a fresh folder and kills the run with SIGKILL at a uniformly
          random moment of an uninterrupted run's duration, restarting it until a restart reaches
          the end; that run's params_sha256 must equal the uninterrupted run's. Episodes repeat
          until --kills kills (default 20) have landed. Reports the episodes, kills, restarts
          that resumed a checkpoint, and the episodes that ended equal.

Prints markdown tables and writes JSON (--json-out).

  python3 bench/checkpoint_resume.py [MEMPLAN] [--steps 300] [--rounds 3] [--kills 20]
      [--threads 0] [--json-out bench_checkpoint_resume.json]
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(cmd):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + out.stderr[-2000:])
    return json.loads(out.stdout)


def overhead(memplan, steps, rounds, threads, workdir):
    base = [memplan, "train", "--model", "gpt", "--steps", str(steps), "--eval-samples", "0", "--json",
            "--threads", str(threads), "--quiet"]
    runs = {"none": [], "every 50": []}
    for r in range(rounds):
        for name in runs:
            cmd = list(base)
            if name != "none":
                d = os.path.join(workdir, f"overhead_{r}")
                shutil.rmtree(d, ignore_errors=True)
                cmd += ["--save-dir", d, "--save-every", "50"]
            runs[name].append(run_json(cmd))
    # The same parameters with and without saving: a save changes nothing the run computes.
    shas = {j["params_sha256"] for js in runs.values() for j in js}
    if len(shas) != 1:
        sys.exit("checkpointing changed the trained parameters: " + ", ".join(sorted(shas)))
    rows = []
    plain = statistics.median(j["train_seconds"] for j in runs["none"])
    for name, js in runs.items():
        saves = [s for j in js for s in j.get("checkpoints", {}).get("saved", [])]
        seconds = statistics.median(j["train_seconds"] for j in js)
        rows.append({
            "config": name,
            "train_seconds": seconds,
            "step_ms_median": statistics.median(j["step_time_ms_median"] for j in js),
            "overhead": seconds / plain - 1.0,
            "saves_per_run": len(saves) // len(js),
            "shard_bytes": saves[0]["bytes"] if saves else 0,
            "snapshot_ms_median": statistics.median(s["snapshot_seconds"] * 1e3 for s in saves) if saves else 0.0,
            "write_ms_median": statistics.median(s["write_seconds"] * 1e3 for s in saves) if saves else 0.0,
        })
    return rows


def kills(memplan, count, threads, workdir, seed):
    small = [memplan, "train", "--model", "gpt", "--layers", "2", "--width", "32", "--heads", "2", "--seq", "32",
             "--batch", "4", "--dropout", "0.1", "--lr-schedule", "cosine", "--steps", "300", "--eval-samples", "0",
             "--json", "--threads", str(threads)]
    configs = {"fp32": [], "bf16": ["--dtype", "bf16"], "fp32 + recompute": ["--checkpoint", "sqrt"],
               "bf16 + recompute": ["--dtype", "bf16", "--checkpoint", "sqrt"]}
    rng = random.Random(seed)
    rows = []
    for name, extra in configs.items():
        t0 = time.time()
        expected = run_json(small + extra + ["--quiet"])["params_sha256"]
        whole = time.time() - t0
        if count == 0:
            continue
        # Episodes: a fresh folder, the run killed at random moments and restarted until one
        # restart reaches the end; then its parameters are compared.
        landed = resumed = episodes = equal = 0
        for episode in range(10 * count + 10):
            if landed >= count:
                break
            d = os.path.join(workdir, f"kills_{len(rows)}_{episode}")
            cmd = small + extra + ["--save-dir", d, "--save-every", "10"]
            episodes += 1
            while True:
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                time.sleep(rng.uniform(0.0, whole))
                killed = p.poll() is None
                if killed:
                    p.send_signal(signal.SIGKILL)
                    landed += 1
                out, err = p.communicate()
                resumed += "resuming from" in err
                if not killed:
                    equal += p.returncode == 0 and json.loads(out)["params_sha256"] == expected
                    break
            shutil.rmtree(d, ignore_errors=True)
        rows.append({"config": name, "episodes": episodes, "kills_landed": landed, "resumed": resumed,
                     "equal": equal, "uninterrupted_sha256": expected})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("memplan", nargs="?", default=os.path.join(ROOT, "build", "tools", "memplan"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json-out", default="bench_checkpoint_resume.json")
    args = ap.parse_args()
    if not os.access(args.memplan, os.X_OK):
        sys.exit(f"{args.memplan} is not an executable memplan; build first or name it")
    workdir = tempfile.mkdtemp(prefix="memplan_bench_ckpt_")
    try:
        over = overhead(args.memplan, args.steps, args.rounds, args.threads, workdir)
        killed = kills(args.memplan, args.kills, args.threads, workdir, args.seed)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"## Checkpoint overhead: GPT train defaults, {args.steps} steps, median of {args.rounds} rounds\n")
    print("| checkpoints | train s | overhead | median step ms | saves | shard | snapshot ms (waited) | write ms (alongside) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in over:
        print(f"| {r['config']} | {r['train_seconds']:.2f} | {100 * r['overhead']:+.1f}% | {r['step_ms_median']:.2f} | "
              f"{r['saves_per_run']} | {r['shard_bytes'] / 2**20:.2f} MiB | {r['snapshot_ms_median']:.2f} | {r['write_ms_median']:.1f} |")
    print(f"\n## Killed at random moments and restarted ({args.kills} kills a configuration)\n")
    print("| configuration | episodes | kills landed | restarts that resumed a checkpoint | episodes ending equal to the uninterrupted run |")
    print("|---|---|---|---|---|")
    for r in killed:
        print(f"| {r['config']} | {r['episodes']} | {r['kills_landed']} | {r['resumed']} | {r['equal']} of {r['episodes']} |")
    with open(args.json_out, "w") as f:
        json.dump({"overhead": over, "kills": killed, "steps": args.steps, "rounds": args.rounds,
                   "threads": args.threads, "memplan": args.memplan}, f, indent=2)
    if not all(r["equal"] == r["episodes"] for r in killed):
        sys.exit("a resumed run ended differently from the uninterrupted one")


if __name__ == "__main__":
    main()
