"""memplan.torch: a torch.nn.Module planned directly equals `memplan fit --onnx` on the same
export, with torch's parameter count; the module is left as it was; an op memplan does not
import is a ValueError naming it and the module it comes from.

Needs Debian's python3-torch (and python3-torchvision for ResNet-18), which scripts/test.sh installs.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import torch
from torch import nn

import memplan
import memplan.torch

CLI = os.environ["MEMPLAN_CLI"]


def fit_onnx_file(onnx_bytes, *flags):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        with open(path, "wb") as f:
            f.write(onnx_bytes)
        r = subprocess.run([CLI, "fit", "--onnx", path, *flags, "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(r.stderr)
        return json.loads(r.stdout)


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and a GELU MLP, as GPT-2 builds them."""

    def __init__(self, dim=32, heads=4, vocab=50):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.heads = heads
        self.scale = 1.0 / math.sqrt(dim // heads)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        x = x + self.mlp(self.ln2(x))
        return self.out(x)


class WithSoftplus(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Softplus())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.body(x))


def parameters(module):
    return sum(p.numel() for p in module.parameters())


class TorchBridge(unittest.TestCase):
    def check(self, module, example, **flags):
        answer = memplan.torch.fit(module, example, **flags)
        self.assertEqual(answer.parameter_count, parameters(module))
        onnx = memplan.torch.export_onnx(module, example)
        batch = str(flags.get("batch", example.shape[0]))
        expected = fit_onnx_file(onnx, "--batch", batch, "--device-memory", flags["device_memory"])
        got = answer.to_dict()
        self.assertEqual(got.pop("model"), f"<torch {type(module).__name__}>")
        expected.pop("model")
        self.assertEqual(got, expected)
        return answer

    def test_memplan_torch_without_its_own_import(self):
        """`import memplan; memplan.torch.fit(...)` in a fresh interpreter: the package loads its
        torch module on first use, and not before (import memplan alone imports no torch)."""
        script = (
            "import sys, memplan\n"
            "assert 'torch' not in sys.modules, 'import memplan imported torch'\n"
            "import torch\n"
            "answer = memplan.torch.fit(torch.nn.Linear(8, 4), torch.randn(2, 8), device_memory='1GiB')\n"
            "assert answer.fits and answer.to_dict()['parameter_count'] == 36, answer.to_dict()\n"
            "print('ok')\n")
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "ok")
        with self.assertRaises(AttributeError) as caught:
            memplan.no_such_thing  # noqa: B018
        self.assertIn("no attribute 'no_such_thing'", str(caught.exception))

    def test_a_small_cnn(self):
        torch.manual_seed(0)
        model = SmallCnn()
        answer = self.check(model, torch.randn(4, 3, 16, 16), device_memory="1GiB")
        self.assertTrue(answer.fits)
        self.assertEqual(answer.batch, 4)
        larger = memplan.torch.fit(model, torch.randn(4, 3, 16, 16), batch=64, device_memory="1GiB")
        self.assertGreater(larger.breakdown.activations, answer.breakdown.activations)

    def test_a_transformer_block(self):
        torch.manual_seed(0)
        model = TransformerBlock()
        self.check(model, torch.randint(0, 50, (2, 16)), device_memory="1GiB")
        self.assertGreater(len(memplan.torch.plan(model, torch.randint(0, 50, (2, 16))).buffers), 0)

    def test_resnet18_from_torchvision(self):
        try:
            import torchvision
        except ImportError:
            self.skipTest("python3-torchvision is not installed (scripts/test.sh installs it)")
        model = torchvision.models.resnet18()
        answer = self.check(model, torch.randn(2, 3, 224, 224), batch=32, device_memory="24GiB")
        self.assertEqual(answer.parameter_count, 11689512)

    def test_torchvision_models_with_pad_ceil_pooling_and_hard_activations(self):
        """DenseNet (Pad before its transition pools), SqueezeNet (ceil-mode MaxPool) and
        MobileNetV3 (HardSwish, HardSigmoid gates) import with torch's parameter counts
        (bench/torchvision_onnx.py runs every torchvision classification model)."""
        try:
            import torchvision
        except ImportError:
            self.skipTest("python3-torchvision is not installed (scripts/test.sh installs it)")
        torch.manual_seed(0)
        models = {
            "densenet": torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16),
            "squeezenet1_1": torchvision.models.squeezenet1_1(),
            "mobilenet_v3_small": torchvision.models.mobilenet_v3_small(),
        }
        for name, model in models.items():
            with self.subTest(model=name):
                answer = self.check(model, torch.randn(2, 3, 64, 64), batch=4, device_memory="4GiB")
                self.assertEqual(answer.parameter_count, parameters(model))

    def test_the_module_is_left_as_it_was(self):
        torch.manual_seed(0)
        model = SmallCnn()
        model.eval()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        example = torch.randn(4, 3, 16, 16)
        rng = torch.random.get_rng_state()
        memplan.torch.fit(model, example, device_memory="1GiB")
        self.assertFalse(model.training)
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)
        self.assertTrue(torch.equal(torch.random.get_rng_state(), rng))

    def test_an_unsupported_op_names_the_module(self):
        with self.assertRaises(ValueError) as caught:
            memplan.torch.fit(WithSoftplus(), torch.randn(2, 8), device_memory="1GiB")
        message = str(caught.exception)
        self.assertIn("Softplus", message)
        self.assertIn("body.1 (Softplus)", message)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            memplan.torch.fit("not a module", torch.randn(2, 8), device_memory="1GiB")
        with self.assertRaises(ValueError):
            memplan.torch.fit(SmallCnn(), torch.randn(2, 3, 8, 8), model="gpt2", device_memory="1GiB")


if __name__ == "__main__":
    unittest.main()
