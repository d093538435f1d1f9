#!/usr/bin/python3
"""Joins bench_gpu_step's and torch_step.py's JSON into bench/results/gpu.json and a markdown
table (bench/results/gpu.md). The PyTorch columns say "n/a" when torch did not run."""
import argparse
import json
import os

MiB = 2 ** 20


def mib(v):
    return "n/a" if v is None else f"{v / MiB:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-md", required=True)
    args = ap.parse_args()
    mp = json.load(open(args.memplan))
    th = json.load(open(args.torch)) if os.path.exists(args.torch) else {"results": []}
    by_model = {r["model"]: r for r in th.get("results", [])}
    rows = []
    for r in mp["results"]:
        t = by_model.get(r["model"], {})
        rows.append({
            "model": r["model"], "batch": r["batch"],
            "memplan_step_ms": r["step_ms_median"], "torch_step_ms": t.get("step_ms_median"),
            "memplan_arena_bytes": r["arena_bytes"], "torch_max_memory_reserved_bytes": t.get("max_memory_reserved_bytes"),
            "measured_device_bytes_delta": r["measured_device_bytes_delta"],
            "device_used_bytes_total": r["device_used_bytes_total"],
            "fit_predicted_total_bytes": r["fit_predicted_total_bytes"],
            "device_allocations_during_steps": r["device_allocations_during_steps"],
            "budget_bytes": r["budget_bytes"], "batch_limit": r["batch_limit"],
            "max_batch_memplan_plan": r["max_batch_planned"], "max_batch_torch": t.get("max_batch"),
        })
    doc = {"device": mp.get("device"), "torch_version": th.get("torch_version"), "rows": rows}
    with open(args.out_json, "w") as f:
        json.dump(doc, f, indent=2)
    lines = [
        f"GPU: {doc['device']}; PyTorch {doc['torch_version'] or 'not run'} (eager, FP32, no TF32). "
        "Step: forward, cross-entropy, backward, AdamW. Max batch: the largest batch within the budget "
        "(memplan: planned arena <= budget; PyTorch: survives two steps under set_per_process_memory_fraction).",
        "",
        "| model | batch | memplan ms | PyTorch ms | memplan arena MiB | PyTorch max reserved MiB | measured use MiB "
        "| device used MiB (fit predicts) | allocs/step | budget GiB | max batch memplan | max batch PyTorch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ts = "n/a" if r["torch_step_ms"] is None else f"{r['torch_step_ms']:.2f}"
        mbt = "n/a" if r["max_batch_torch"] is None else str(r["max_batch_torch"])
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['memplan_step_ms']:.2f} | {ts} | {mib(r['memplan_arena_bytes'])} "
            f"| {mib(r['torch_max_memory_reserved_bytes'])} | {mib(r['measured_device_bytes_delta'])} "
            f"| {mib(r['device_used_bytes_total'])} ({mib(r['fit_predicted_total_bytes'])}) "
            f"| {r['device_allocations_during_steps']} | {r['budget_bytes'] / 2**30:.2f} "
            f"| {r['max_batch_memplan_plan']} | {mbt} |")
    with open(args.out_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
