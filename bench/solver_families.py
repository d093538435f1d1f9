#!/usr/bin/env python3
"""Two memplan builds side by side on the solver's hard families, in one run (the machine is
shared and noisy: compare the columns of one run, not runs of different days).

traces (no budget): height/LB at --time-limit 0.1, 1 and 10 s; time to LB from the 10 s run.
zero-slack (--budget = LB): solved or not within 20 s, and the time; minimalloc (MiniMalloc's
challenging files, --budget 1048576): the same within 60 s, the no-regression check.
usage: solver_families.py --new MEMPLAN --old MEMPLAN [--out PREFIX] FAMILY:FILE...
"""
import argparse
import json
import subprocess


def solve(binary, path, limit, budget=None):
    cmd = [binary, "solve", "--input", path, "--time-limit", str(limit), "--json"]
    if budget:
        cmd += ["--budget", str(budget)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 120).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", required=True)
    ap.add_argument("--old", required=True)
    ap.add_argument("--out", default="solver_families")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    rows = []
    for spec in args.files:
        family, path = spec.split(":", 1)
        row = {"family": family, "file": path.rsplit("/", 1)[-1]}
        for tag, binary in (("old", args.old), ("new", args.new)):
            if family.endswith("zero-slack") or family == "minimalloc":
                # Both families' capacity is 1048576; MiniMalloc's files get a minute.
                d = solve(binary, path, 60 if family == "minimalloc" else 20, budget=1048576)
                # zero-slack: at the lower bound; minimalloc: within the capacity.
                ok = ("optimal", "feasible") if family == "minimalloc" else ("optimal",)
                row[tag] = {"solved": d["status"] in ok, "status": d["status"], "ms": d["solve_ms"],
                            "nodes": d.get("nodes")}
            else:
                r = {}
                for limit in (0.1, 1, 10):
                    d = solve(binary, path, limit)
                    r[str(limit)] = d["height"] / d["lower_bound"]
                    if limit == 10:
                        r["to_lb_ms"] = d["solve_ms"] if d["height"] == d["lower_bound"] else None
                row[tag] = r
            print(json.dumps(row), flush=True)
        rows.append(row)
    lines = ["| family | file | old h/LB 0.1 s | new | old 1 s | new | old 10 s | new | old time to LB | new |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        o, n = row["old"], row["new"]
        if row["family"].endswith("zero-slack") or row["family"] == "minimalloc":
            t = lambda r: f"{r['ms'] / 1000:.2f} s" if r["solved"] else "not solved"
            lines.append(f"| {row['family']} | {row['file']} | - | - | - | - | - | - | {t(o)} | {t(n)} |")
        else:
            t = lambda r: f"{r['to_lb_ms'] / 1000:.2f} s" if r["to_lb_ms"] is not None else "> 10 s"
            c = " | ".join(f"{o[k]:.4f} | {n[k]:.4f}" for k in ("0.1", "1", "10"))
            lines.append(f"| {row['family']} | {row['file']} | {c} | {t(o)} | {t(n)} |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump({"bench": "solver_families", "results": rows}, f, indent=2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
