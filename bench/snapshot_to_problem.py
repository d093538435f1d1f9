#!/usr/bin/env python3
"""A PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) as a MiniMalloc problem, the
form of bench/data/real-traces: id,lower,upper,size; time = event index in the device trace;
a block lives from its alloc to its free_completed, blocks still alive at the end close one
past the last event, blocks allocated before recording began are left out.
usage: snapshot_to_problem.py SNAPSHOT.pickle [DEVICE] > problem.csv   (needs no torch)
"""
import pickle
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: snapshot_to_problem.py SNAPSHOT.pickle [DEVICE]")
    with open(sys.argv[1], "rb") as f:
        snapshot = pickle.load(f)
    trace = snapshot["device_traces"][int(sys.argv[2]) if len(sys.argv) == 3 else 0]
    live, rows = {}, []
    for t, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = (t, event["size"])
        elif event["action"] == "free_completed" and event["addr"] in live:
            start, size = live.pop(event["addr"])
            rows.append((start, t, size))
    rows += [(start, len(trace), size) for start, size in live.values()]
    rows.sort()
    print("id,lower,upper,size")
    for i, (a, b, s) in enumerate(rows):
        print(f"{i},{a},{b},{s}")


if __name__ == "__main__":
    main()
