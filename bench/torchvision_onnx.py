#!/usr/bin/env python3
"""Which of torchvision's classification models memplan imports: each is built (random weights),
exported in training mode (opset 15) with Debian's PyTorch, and given to `memplan fit --onnx`;
one row per model: imported with torch's and memplan's parameter counts and one training step on
the CPU (`train --onnx`, batch 2, Fashion-MNIST resampled to the model's input), or the refusal
(memplan's or the exporter's). Stochastic depth is switched off (p = 0) because PyTorch 1.13's exporter
cannot export its Bernoulli sampling in training mode. Images are 64 x 64 but for the models that
need more (AlexNet's and VGG's adaptive pools, ViT, Swin, MaxViT: 224; Inception-v3: 299).

Usage: python3 bench/torchvision_onnx.py [--cli build/tools/memplan] [--max-params 100e6]
       python3 bench/torchvision_onnx.py --min-params 100e6 --max-params 1e9 --no-train --out torchvision_onnx_large.json
Prints a table and writes bench/results/torchvision_onnx.json (or --out, in bench/results/). The
second form fits the models the first skips, without their training step (minutes each on CPUs).
"""
import argparse
import json
import math
import os
import subprocess
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torchvision.models as M  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def model_names():
    skip = {"get_weight", "get_model", "get_model_builder", "list_models", "get_model_weights"}
    return sorted(n for n in dir(M) if not n.startswith("_") and n.islower() and callable(getattr(M, n)) and n not in skip)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(HERE, "..", "build", "tools", "memplan"))
    ap.add_argument("--max-params", type=float, default=100e6, help="skip larger models (export time and memory)")
    ap.add_argument("--min-params", type=float, default=0, help="skip smaller models")
    ap.add_argument("--no-train", action="store_true", help="fit only: no training step")
    ap.add_argument("--out", default="torchvision_onnx.json", help="the JSON's name in bench/results/")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in model_names():
            row = {"model": name}
            kwargs = {"aux_logits": False, "init_weights": False} if name in ("inception_v3", "googlenet") else {}
            model = getattr(M, name)(**kwargs)
            for module in model.modules():
                if type(module).__name__ == "StochasticDepth":
                    module.p = 0.0
            row["torch_parameters"] = sum(p.numel() for p in model.parameters())
            if row["torch_parameters"] < args.min_params:
                continue
            if row["torch_parameters"] > args.max_params:
                row["result"] = "skipped (size)"
                rows.append(row)
                print(f"{name:22s} skipped ({row['torch_parameters']:,} parameters)", flush=True)
                continue
            size = 299 if name == "inception_v3" else 224 if name.startswith(("alexnet", "vit", "swin", "maxvit", "vgg")) else 64
            row["image_size"] = size
            path = os.path.join(tmp, name + ".onnx")
            model.train()
            try:
                torch.onnx.export(model, torch.randn(2, 3, size, size), path, opset_version=15, input_names=["input"],
                                  output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
            except Exception as e:  # the exporter's limits, not memplan's
                row["result"] = "torch export failed"
                row["reason"] = str(e).splitlines()[0][:160]
                rows.append(row)
                print(f"{name:22s} torch export failed: {row['reason'][:100]}", flush=True)
                continue
            start = time.time()
            r = subprocess.run([args.cli, "fit", "--onnx", path, "--batch", "2", "--device-memory", "80GiB", "--json"],
                               capture_output=True, text=True)
            row["fit_s"] = round(time.time() - start, 2)
            if r.returncode == 0:
                row["memplan_parameters"] = json.loads(r.stdout)["parameter_count"]
                row["result"] = "imported" if row["memplan_parameters"] == row["torch_parameters"] else "imported, counts differ"
                # One training step on the CPU, on Fashion-MNIST resampled to the model's input.
                if args.no_train:
                    os.remove(path)
                    rows.append(row)
                    print(f"{name:22s} {row['result']:24s} {row['memplan_parameters']:>12} (fit {row['fit_s']} s)", flush=True)
                    continue
                start = time.time()
                t = subprocess.run([args.cli, "train", "--onnx", path, "--steps", "1", "--batch", "2", "--eval-samples", "0",
                                    "--threads", "2", "--json", "--quiet"], capture_output=True, text=True)
                row["train_step_s"] = round(time.time() - start, 2)
                if t.returncode == 0 and math.isfinite(json.loads(t.stdout)["final_loss"]):
                    row["trained"] = True
                    row["train_loss"] = json.loads(t.stdout)["final_loss"]
                else:
                    row["trained"] = False
                    row["train_error"] = (t.stdout + t.stderr).strip()[:200]
            else:
                row["result"] = "refused by memplan"
                row["reason"] = (r.stdout + r.stderr).strip().replace("memplan fit: --onnx: ", "")[:200]
            os.remove(path)
            rows.append(row)
            trained = {True: "trains", False: "TRAIN FAILED", None: ""}[row.get("trained")]
            print(f"{name:22s} {row['result']:24s} {row.get('memplan_parameters', '')!s:>12} {trained:12s} "
                  f"{row.get('reason', row.get('train_error', ''))[:110]}", flush=True)
    imported = sum(r["result"] == "imported" for r in rows)
    trained = sum(bool(r.get("trained")) for r in rows)
    tried = sum(r["result"] != "skipped (size)" for r in rows)
    steps = "fit only, no training step" if args.no_train else f"{trained} train a step"
    print(f"\n{imported} of {tried} models tried import with torch's parameter count, {steps} "
          f"({len(rows) - tried} skipped for size)")
    with open(os.path.join(HERE, "results", args.out), "w") as f:
        json.dump({"torch": torch.__version__, "imported": imported, "trained": trained, "tried": tried, "models": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
