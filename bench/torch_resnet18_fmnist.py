#!/usr/bin/env python3
"""PyTorch's side of the ONNX training check: one epoch of torchvision's ResNet-18 (1-channel 7x7
stem, 10 classes) on Fashion-MNIST with the recipe `memplan train --onnx resnet18_fmnist.onnx
--epochs 1` runs by default: AdamW lr 1e-3, no weight decay, batch 64, pixels / 255, shuffled once
per epoch, test accuracy with running batch-norm statistics. `--schedule cosine --warmup N` is
`--lr-schedule cosine --warmup N`: the learning rate times (s + 1) / N for the first N steps, then
0.5 (1 + cos(pi (s - N) / (S - N))) over the S steps (a LambdaLR of 0-based step s). Debian's python3-torch and
python3-torchvision; nothing is downloaded.

  /usr/bin/python3 bench/torch_resnet18_fmnist.py [--batch 64] [--threads 1] [--seed 0] [--data DIR]
      [--schedule constant|cosine] [--warmup 0]
"""
import argparse
import gzip
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torchvision


def read_idx(path):
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    if data[3] == 3:  # images
        n, rows, cols = (int.from_bytes(data[i:i + 4], "big") for i in (4, 8, 12))
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, rows, cols).astype(np.float32) / 255
    return np.frombuffer(data, np.uint8, offset=8).astype(np.int64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--warmup", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    d = a.data + "/"
    x_train, y_train = read_idx(d + "train-images-idx3-ubyte.gz"), read_idx(d + "train-labels-idx1-ubyte.gz")
    x_test, y_test = read_idx(d + "t10k-images-idx3-ubyte.gz"), read_idx(d + "t10k-labels-idx1-ubyte.gz")
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    order = np.random.default_rng(a.seed).permutation(len(x_train))
    steps = len(x_train) // a.batch

    def factor(s):
        if s < a.warmup:
            return (s + 1) / a.warmup
        if a.schedule == "constant":
            return 1.0
        return 0.5 * (1 + math.cos(math.pi * (s - a.warmup) / (steps - a.warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    start = time.time()
    model.train()
    for s in range(steps):
        i = order[s * a.batch:(s + 1) * a.batch]
        loss = nn.functional.cross_entropy(model(torch.from_numpy(x_train[i])), torch.from_numpy(y_train[i]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    train_s = time.time() - start
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(x_test), 500):
            correct += int((model(torch.from_numpy(x_test[s:s + 500])).argmax(1).numpy() == y_test[s:s + 500]).sum())
    print(json.dumps({"framework": "pytorch " + torch.__version__, "batch": a.batch, "seed": a.seed,
                      "schedule": a.schedule, "warmup": a.warmup,
                      "test_accuracy": correct / len(x_test), "train_seconds": round(train_s, 1)}))


if __name__ == "__main__":
    main()
