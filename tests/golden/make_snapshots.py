#!/usr/bin/env python3
"""Writes small PyTorch-memory-snapshot-shaped pickles for the replay tests (tests/data/snapshots/).

Run from the repository root with Debian's python3 (no torch needed):
    python3 tests/golden/make_snapshots.py

The files have the layout torch.cuda.memory._dump_snapshot() writes (segments, device_traces,
allocator_settings, external_annotations), pickled by CPython's own pickler, so the tests read
what a real pickler emits (memo references, frames, protocols 2, 4 and 5). The scenarios follow
PyTorch's caching-allocator rules by hand (docs/caching_allocator.md); the expected numbers are
worked out in tests/snapshot_replay_test.cpp from those rules, not from memplan's output.
"""
import os
import pickle

MiB = 1 << 20
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "snapshots")

SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
}


def frames(file, line, name):
    # Innermost first, as PyTorch lists them: C++ frames, a library frame, then the user's frame.
    return [
        {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "filename": "??", "line": 0},
        {"name": "_call_impl", "filename": "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "line": 1750},
        {"name": name, "filename": file, "line": line},
        {"name": "<module>", "filename": "/home/user/train.py", "line": 99},
    ]


FORWARD = frames("/home/user/model.py", 10, "forward")
BACKWARD = frames("/home/user/model.py", 20, "backward")


def ev(action, addr, size, stack=None):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0}
    e["frames"] = stack if stack is not None else []
    return e


def seg(address, total, blocks, large=True):
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    requested = sum(b.get("requested_size", 0) for b in blocks if b["state"] == "active_allocated")
    return {"device": 0, "address": address, "total_size": total, "allocated_size": allocated,
            "active_size": allocated, "requested_size": requested, "stream": 0,
            "segment_type": "large" if large else "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks}


def block(address, size, state, requested=0, stack=None):
    b = {"address": address, "size": size, "requested_size": requested, "state": state}
    b["frames"] = stack if stack is not None else []
    return b


def fresh():
    """From an empty cache: every segment is created in the trace (see the test for the rules)."""
    S, L, M = 0x7F0000000000, 0x7F0000200000, 0x7F0001600000
    t = [
        ev("segment_alloc", S, 2 * MiB),
        ev("alloc", S, 1000000, FORWARD),                 # 1000448-byte block
        ev("alloc", S + 1000448, 4, FORWARD),              # 512-byte block
        ev("segment_alloc", L, 20 * MiB),
        ev("alloc", L, 3 * MiB, FORWARD),
        ev("alloc", L + 3 * MiB, 5 * MiB, FORWARD),
        ev("free_requested", S, 1000000, BACKWARD),
        ev("free_completed", S, 1000000, BACKWARD),
        ev("alloc", S, 600, BACKWARD),                     # best fit: the freed 1000448 block, split
        ev("alloc", L + 8 * MiB, 12 * MiB, BACKWARD),      # exactly the 12 MiB rest of L
        ev("segment_alloc", M, 20 * MiB),
        ev("alloc", M, 3 * MiB, BACKWARD),                 # nothing cached fits: a new 20 MiB segment
        ev("free_requested", L, 3 * MiB), ev("free_completed", L, 3 * MiB),
        ev("free_requested", L + 3 * MiB, 5 * MiB), ev("free_completed", L + 3 * MiB, 5 * MiB),
        ev("alloc", L, 7 * MiB, BACKWARD),                 # the merged 8 MiB block, not split (rest 1 MiB)
    ]
    segments = [
        seg(S, 2 * MiB, [block(S, 1024, "active_allocated", 600, BACKWARD),
                         block(S + 1024, 1000448 - 1024, "inactive"),
                         block(S + 1000448, 512, "active_allocated", 4, FORWARD),
                         block(S + 1000960, 2 * MiB - 1000960, "inactive")], large=False),
        seg(L, 20 * MiB, [block(L, 8 * MiB, "active_allocated", 7 * MiB, BACKWARD),
                          block(L + 8 * MiB, 12 * MiB, "active_allocated", 12 * MiB, BACKWARD)]),
        seg(M, 20 * MiB, [block(M, 3 * MiB, "active_allocated", 3 * MiB, BACKWARD),
                          block(M + 3 * MiB, 17 * MiB, "inactive")]),
    ]
    return {"segments": segments, "device_traces": [t], "allocator_settings": SETTINGS,
            "external_annotations": []}


def late_start():
    """Recording began after the model was built: segments P (20 MiB), Q (64 MiB) and R (20 MiB)
    existed, with blocks allocated before the first event."""
    P, Q, R = 0x7F1000000000, 0x7F1001400000, 0x7F1005400000
    t = [
        # P: a 6 MiB block allocated before recording is freed; the 4 MiB block before it stays.
        ev("free_requested", P + 4 * MiB, 6 * MiB), ev("free_completed", P + 4 * MiB, 6 * MiB),
        ev("alloc", P + 4 * MiB, 10 * MiB, FORWARD),       # front of the merged 16 MiB free block
        # Q: blocks of 39 MiB and (requested) 4 MiB from before; the 4 MiB one holds 5 MiB, since
        # the allocator did not split off a 1 MiB rest. The free space after it is 20 MiB, as
        # large as R: best fit takes the lower address, Q + 44 MiB.
        ev("alloc", Q + 44 * MiB, 8 * MiB, FORWARD),
        ev("free_requested", Q, 39 * MiB), ev("free_completed", Q, 39 * MiB),
        ev("free_requested", Q + 39 * MiB, 4 * MiB), ev("free_completed", Q + 39 * MiB, 4 * MiB),
        ev("alloc", Q, 30 * MiB, BACKWARD),                # the merged 44 MiB block at Q, split
    ]
    segments = [
        seg(P, 20 * MiB, [block(P, 4 * MiB, "active_allocated", 4 * MiB, FORWARD),
                          block(P + 4 * MiB, 10 * MiB, "active_allocated", 10 * MiB, FORWARD),
                          block(P + 14 * MiB, 6 * MiB, "inactive")]),
        seg(Q, 64 * MiB, [block(Q, 30 * MiB, "active_allocated", 30 * MiB, BACKWARD),
                          block(Q + 30 * MiB, 14 * MiB, "inactive"),
                          block(Q + 44 * MiB, 8 * MiB, "active_allocated", 8 * MiB, FORWARD),
                          block(Q + 52 * MiB, 12 * MiB, "inactive")]),
        seg(R, 20 * MiB, [block(R, 20 * MiB, "inactive")]),
    ]
    return {"segments": segments, "device_traces": [t], "allocator_settings": SETTINGS,
            "external_annotations": []}


def oom():
    """An allocation that failed: PyTorch records `oom` with the device's free bytes."""
    A = 0x7F2000000000
    settings = dict(SETTINGS, max_split_size=64 * MiB, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:64")
    t = [
        ev("segment_alloc", A, 40 * MiB),
        ev("alloc", A, 40 * MiB, FORWARD),
        {"action": "oom", "addr": 0, "device_free": 30 * MiB, "size": 50 * MiB, "stream": 0, "time_us": 0,
         "frames": BACKWARD},
    ]
    segments = [seg(A, 40 * MiB, [block(A, 40 * MiB, "active_allocated", 40 * MiB, FORWARD)])]
    return {"segments": segments, "device_traces": [t], "allocator_settings": settings,
            "external_annotations": []}


def two_streams():
    """Blocks are cached per stream: a block freed on stream 0 does not serve stream 7."""
    A, B = 0x7F3000000000, 0x7F3001400000
    t = [
        ev("segment_alloc", A, 20 * MiB),
        ev("alloc", A, 4 * MiB, FORWARD),
        ev("free_requested", A, 4 * MiB), ev("free_completed", A, 4 * MiB),
        dict(ev("segment_alloc", B, 20 * MiB), stream=7),
        dict(ev("alloc", B, 4 * MiB, BACKWARD), stream=7),   # A's free block belongs to stream 0
        ev("alloc", A, 4 * MiB, FORWARD),                      # stream 0 reuses it
    ]
    segments = [
        seg(A, 20 * MiB, [block(A, 4 * MiB, "active_allocated", 4 * MiB, FORWARD), block(A + 4 * MiB, 16 * MiB, "inactive")]),
        dict(seg(B, 20 * MiB, [block(B, 4 * MiB, "active_allocated", 4 * MiB, BACKWARD),
                              block(B + 4 * MiB, 16 * MiB, "inactive")]), stream=7),
    ]
    return {"segments": segments, "device_traces": [t], "allocator_settings": SETTINGS,
            "external_annotations": []}


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {
        "fresh_protocol2.pickle": (fresh(), 2),
        "fresh_protocol4.pickle": (fresh(), 4),
        "fresh_protocol5.pickle": (fresh(), 5),
        "late_start.pickle": (late_start(), 4),
        "oom.pickle": (oom(), 4),
        "two_streams.pickle": (two_streams(), 4),
    }
    for name, (value, protocol) in files.items():
        with open(os.path.join(OUT, name), "wb") as f:
            pickle.dump(value, f, protocol=protocol)
        print("wrote", name)


if __name__ == "__main__":
    main()
