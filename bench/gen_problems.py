#!/usr/bin/env python3
"""Unseen members of the solver bench's two hard families, as MiniMalloc CSV files.

zero-slack SEED N: cut a 1048576 x T rectangle recursively (guillotine cuts, offsets on 512-byte
  steps) into N buffers; a packing at exactly 1048576 exists by construction. The piece cut next
  is drawn with odds growing with its area (pieces stay of similar sizes).
zero-slack-uniform SEED N: the same, the piece cut next drawn uniformly (deeper cuts: a few
  large pieces beside many slivers).
trace SEED N: an eager-execution-like allocation trace: a forward pass allocating activations
  kept until a mirrored backward pass, short-lived temporaries in between, a few long-lived
  buffers, sizes from a handful of classes (as real traces have).
"""
import random
import sys


def zero_slack(seed, n, uniform=False):
    rng = random.Random(seed)
    cap, span = 1048576, rng.choice([40, 80, 160])
    pieces = [(0, span, 0, cap)]  # (t0, t1, y0, y1)
    while len(pieces) < n:
        if uniform:
            k = rng.randrange(len(pieces))
        else:
            k = max(range(len(pieces)), key=lambda i: rng.random() * (pieces[i][1] - pieces[i][0]) * (pieces[i][3] - pieces[i][2]))
        t0, t1, y0, y1 = pieces[k]
        if rng.random() < 0.5 and t1 - t0 >= 2:
            t = rng.randint(t0 + 1, t1 - 1)
            new = [(t0, t, y0, y1), (t, t1, y0, y1)]
        elif (y1 - y0) // 512 >= 2:
            y = y0 + 512 * rng.randint(1, (y1 - y0) // 512 - 1)
            new = [(t0, t1, y0, y), (t0, t1, y, y1)]
        else:
            continue
        pieces[k:k + 1] = new
    rng.shuffle(pieces)
    return [(t0, t1, y1 - y0) for t0, t1, y0, y1 in pieces]


def trace(seed, n):
    rng = random.Random(seed)
    classes = [512 * rng.choice([1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384]) for _ in range(8)]
    rows, t, saved = [], 0, []
    for _ in range(max(1, n // 200)):  # long-lived: weights' gradients, optimizer state
        rows.append([t, None, rng.choice(classes) * 4])
        t += 1
    body = n - len(rows)
    for i in range(body // 3):  # forward: saved activations and temporaries
        saved.append(len(rows))
        rows.append([t, None, rng.choice(classes)])
        t += 1
        for _ in range(rng.randint(0, 2)):
            rows.append([t, t + rng.randint(1, 4), rng.choice(classes)])
            t += 1
    for k in reversed(saved):  # backward frees activations in reverse, with temporaries
        rows.append([t, t + rng.randint(1, 6), rng.choice(classes)])
        t += 1
        rows[k][1] = t
        t += 1
    end = t + 1
    return [(a, b if b is not None else end, s) for a, b, s in rows]


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("zero-slack", "zero-slack-uniform", "trace"):
        sys.exit("usage: gen_problems.py zero-slack|zero-slack-uniform|trace SEED N")
    seed, n = int(sys.argv[2]), int(sys.argv[3])
    if sys.argv[1] == "trace":
        rows = trace(seed, n)
    else:
        rows = zero_slack(seed, n, uniform=sys.argv[1] == "zero-slack-uniform")
    print("id,lower,upper,size")
    for i, (a, b, s) in enumerate(rows):
        print(f"b{i},{a},{b},{s}")


if __name__ == "__main__":
    main()
