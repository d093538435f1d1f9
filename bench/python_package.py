#!/usr/bin/env python3
"""The Python package's own costs: import time, what a call adds over the command it runs, and
how soon Ctrl-C stops a long search.

    PYTHONPATH=build/python python3 bench/python_package.py [--cli build/tools/memplan] \
        [--json-out bench/results/python_package.json]

- import: `import memplan` in a fresh interpreter (median of 15), against the interpreter alone.
- call overhead: a call's wall time in Python minus the time the command took inside memplan
  (parsing its flags, planning, writing its JSON: what `memplan fit --json` does in C++), median
  of 30 calls per case; the CLI as a process is shown for reference (it also pays exec and load).
- Ctrl-C: SIGINT sent 1 s into a search that runs for minutes; time from the signal to
  KeyboardInterrupt (5 tries).
Prints a table and writes JSON (with the machine's CPU).
"""

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time

import memplan

CASES = [
    ("mlp", dict(model="mlp", device_memory="1GiB")),
    ("gpt2 bf16 b8 T1024", dict(model="gpt2", batch=8, seq=1024, dtype="bf16", device_memory="80GiB")),
    ("llama2-7b bf16 b4 T4096", dict(model="llama2-7b", batch=4, seq=4096, dtype="bf16", device_memory="80GiB")),
]
LONG_FIT = dict(model="llama2-70b", dtype="bf16", devices=64, zero=3, seq=4096, device_memory="80GiB", max_batch=True)


def flags_of(kwargs):
    out = []
    for k, v in kwargs.items():
        out += ["--" + k.replace("_", "-")] + ([] if v is True else [str(v)])
    return out


def import_times(runs=15):
    code = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
    def once(stmt):
        r = subprocess.run([sys.executable, "-c", code.format(stmt=stmt)], capture_output=True, text=True,
                           env=dict(os.environ), check=True)
        return float(r.stdout)
    memplan_s = statistics.median(once("import memplan") for _ in range(runs))
    total = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import memplan"], check=True, env=dict(os.environ))
        total.append(time.perf_counter() - t)
    bare = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
    return memplan_s, statistics.median(total), statistics.median(bare)


def call_overheads(cli, runs=30):
    rows = []
    for name, kwargs in CASES:
        memplan.fit(**kwargs)  # warm: the first call loads the model tables
        wall, inside = [], []
        for _ in range(runs):
            t = time.perf_counter()
            r = memplan.fit(**kwargs)
            wall.append(time.perf_counter() - t)
            inside.append(r.seconds)
        cli_wall = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([cli, "fit", *flags_of(kwargs), "--json"], check=True, capture_output=True)
            cli_wall.append(time.perf_counter() - t)
        over = [w - i for w, i in zip(wall, inside)]
        rows.append(dict(case=name, python_call_ms=1e3 * statistics.median(wall),
                         command_ms=1e3 * statistics.median(inside), overhead_ms=1e3 * statistics.median(over),
                         overhead_max_ms=1e3 * max(over), cli_process_ms=1e3 * statistics.median(cli_wall)))
    return rows


def interrupt_latencies(tries=5):
    out = []
    for _ in range(tries):
        sent = []
        timer = threading.Timer(1.0, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
        timer.start()
        try:
            memplan.fit(**LONG_FIT)
            raise SystemExit("the long search finished before the signal: it is not long enough to measure")
        except KeyboardInterrupt:
            out.append(time.perf_counter() - sent[0])
        timer.join()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", default="build/tools/memplan")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()

    imp, imp_process, bare_process = import_times()
    rows = call_overheads(args.cli)
    stops = interrupt_latencies()

    print(f"import memplan: {1e3 * imp:.1f} ms (a fresh `python3 -c 'import memplan'` {1e3 * imp_process:.0f} ms, "
          f"`python3 -c pass` {1e3 * bare_process:.0f} ms)\n")
    print(f"| fit case | Python call (ms) | command inside memplan (ms) | overhead median (ms) | overhead max (ms) | CLI process (ms) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['case']} | {r['python_call_ms']:.2f} | {r['command_ms']:.2f} | {r['overhead_ms']:.2f} | "
              f"{r['overhead_max_ms']:.2f} | {r['cli_process_ms']:.1f} |")
    print(f"\nCtrl-C 1 s into a long search: KeyboardInterrupt after {', '.join(f'{1e3 * s:.0f}' for s in stops)} ms "
          f"(max {1e3 * max(stops):.0f} ms)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(python=sys.version.split()[0], executable=sys.executable, cpu=platform.processor() or platform.machine(),
                           cores=os.cpu_count(), import_seconds=imp, import_process_seconds=imp_process,
                           bare_process_seconds=bare_process, fit_calls=rows, interrupt_seconds=stops), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
