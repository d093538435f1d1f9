"""The memplan Python package against the memplan CLI: every call's to_dict() is the CLI's --json
for the same arguments, inputs given in memory equal their files, reports equal the CLI's
files, and bad input raises ValueError with the CLI's message.

Run by ctest with PYTHONPATH at the build's python/ folder and MEMPLAN_CLI naming the CLI.
"""

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import memplan

CLI = os.environ["MEMPLAN_CLI"]
SOURCE = os.environ["MEMPLAN_SOURCE_DIR"]
SNAPSHOTS = os.path.join(SOURCE, "tests", "data", "snapshots")
ONNX = os.path.join(SOURCE, "tests", "data", "onnx")
CONFIGS = os.path.join(SOURCE, "models", "configs")


def cli(*args, check=True):
    r = subprocess.run([CLI, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"memplan {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def cli_json(*args):
    return json.loads(cli(*args, "--json").stdout)


def without_times(value):
    """The JSON without wall-clock figures, which differ between any two runs."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items()
                if not (k.endswith("_ms") or k.endswith("_seconds") or k == "seconds")}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


class Commands(unittest.TestCase):
    def test_fit_equals_the_cli(self):
        cases = [
            (dict(model="gpt2", batch=8, seq=1024, dtype="bf16", device_memory="80GiB"),
             ["--model", "gpt2", "--batch", "8", "--seq", "1024", "--dtype", "bf16", "--device-memory", "80GiB"]),
            (dict(model="gpt", device_memory="64MiB", max_batch=True, checkpoint="sqrt"),
             ["--model", "gpt", "--device-memory", "64MiB", "--max-batch", "--checkpoint", "sqrt"]),
            (dict(model="mlp", hidden=[64, 32], batch=16, device_memory=1 << 30, optimizer="sgd", device="cpu"),
             ["--model", "mlp", "--hidden", "64", "32", "--batch", "16", "--device-memory", str(1 << 30),
              "--optimizer", "sgd", "--device", "cpu"]),
            (dict(model="gpt2", devices=8, zero=3, batch=8, seq=512, device_memory="24GiB"),
             ["--model", "gpt2", "--devices", "8", "--zero", "3", "--batch", "8", "--seq", "512",
              "--device-memory", "24GiB"]),
            (dict(model="gpt2", devices=8, tensor_parallel=2, zero=1, batch=8, seq=512, device_memory="24GiB"),
             ["--model", "gpt2", "--devices", "8", "--tensor-parallel", "2", "--zero", "1", "--batch", "8", "--seq",
              "512", "--device-memory", "24GiB"]),
            (dict(model="gpt", batch=16, device_memory="16MiB", device="cpu", suggest=True),
             ["--model", "gpt", "--batch", "16", "--device-memory", "16MiB", "--device", "cpu", "--suggest"]),
            (dict(model="gpt", batch=4, device="cpu", device_memory="1GiB", lora="8:16", lora_targets=["q", "v"],
                  freeze=["wpe.*"]),
             ["--model", "gpt", "--batch", "4", "--device", "cpu", "--device-memory", "1GiB", "--lora", "8:16",
              "--lora-targets", "q,v", "--freeze", "wpe.*"]),
        ]
        for kwargs, flags in cases:
            with self.subTest(flags=" ".join(flags)):
                answer = memplan.fit(**kwargs)
                self.assertEqual(answer.to_dict(), cli_json("fit", *flags))
                self.assertEqual(answer.fits, answer.to_dict()["fits"])
                if "suggest" not in kwargs:
                    self.assertEqual(answer.breakdown.arena, answer.arena_bytes)

    def test_sizes_are_text_or_bytes(self):
        a = memplan.fit(model="mlp", device_memory="1GiB")
        b = memplan.fit(model="mlp", device_memory=1 << 30)
        self.assertEqual(a.to_dict(), b.to_dict())

    def test_str_is_the_cli_answer(self):
        answer = memplan.fit(model="gpt2", batch=8, seq=1024, dtype="bf16", device_memory="80GiB")
        text = cli("fit", "--model", "gpt2", "--batch", "8", "--seq", "1024", "--dtype", "bf16",
                   "--device-memory", "80GiB").stdout
        self.assertEqual(str(answer), text.rstrip("\n"))
        self.assertIn("FITS", str(answer))

    def test_config_dict_equals_its_file(self):
        path = os.path.join(CONFIGS, "llama-3.2-1b.json")
        with open(path) as f:
            config = json.load(f)
        from_dict = memplan.fit(config=config, batch=2, seq=512, device_memory="24GiB").to_dict()
        from_file = memplan.fit(config=path, batch=2, seq=512, device_memory="24GiB").to_dict()
        self.assertEqual(from_file, cli_json("fit", "--config", path, "--batch", "2", "--seq", "512",
                                             "--device-memory", "24GiB"))
        self.assertEqual(from_dict.pop("model"), "<config dict>")
        from_file.pop("model")
        self.assertEqual(from_dict, from_file)

    def test_onnx_bytes_equal_the_file(self):
        path = os.path.join(ONNX, "small_cnn.onnx")
        with open(path, "rb") as f:
            data = f.read()
        from_bytes = memplan.fit(onnx=data, batch=4, device_memory="1GiB").to_dict()
        from_file = memplan.fit(onnx=path, batch=4, device_memory="1GiB").to_dict()
        self.assertEqual(from_file, cli_json("fit", "--onnx", path, "--batch", "4", "--device-memory", "1GiB"))
        from_bytes.pop("model")
        from_file.pop("model")
        self.assertEqual(from_bytes, from_file)

    def test_plan_and_its_svg_equal_the_cli(self):
        planned = memplan.plan(model="mlp", batch=8)
        self.assertEqual(without_times(planned.to_dict()), without_times(cli_json("plan", "--model", "mlp", "--batch", "8")))
        self.assertGreater(len(planned.buffers), 0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.svg")
            cli("plan", "--model", "mlp", "--batch", "8", "--svg", path)
            with open(path) as f:
                self.assertEqual(planned.svg(), f.read())
        self.assertIn("<svg", planned.svg())

    def test_compare_and_its_html_equal_the_cli(self):
        flags = ["--model", "mlp", "--batch", "8", "--steps", "2"]
        compared = memplan.compare(model="mlp", batch=8, steps=2)
        self.assertEqual(without_times(compared.to_dict()), without_times(cli_json("compare", *flags)))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "compare.html")
            cli("compare", *flags, "--html", path)
            with open(path) as f:
                self.assertEqual(compared._repr_html_(), f.read())

    def test_replay_of_a_snapshot_dict_equals_its_file(self):
        for name in ("fresh_protocol4.pickle", "two_streams.pickle", "late_start.pickle"):
            with self.subTest(snapshot=name):
                path = os.path.join(SNAPSHOTS, name)
                from_file = memplan.replay(path, alloc_conf="expandable_segments:True")
                self.assertEqual(without_times(from_file.to_dict()),
                                 without_times(cli_json("replay", path, "--alloc-conf", "expandable_segments:True")))
                with open(path, "rb") as f:
                    snapshot = pickle.load(f)
                self.assertIsInstance(snapshot, dict)
                from_dict = without_times(memplan.replay(snapshot, alloc_conf="expandable_segments:True").to_dict())
                expected = without_times(from_file.to_dict())
                for key in ("input", "file"):
                    if key in expected:
                        self.assertEqual(from_dict.pop(key), "<snapshot dict>")
                        expected.pop(key)
                self.assertEqual(from_dict, expected)

    def test_replay_html_equals_the_cli(self):
        path = os.path.join(SNAPSHOTS, "fresh_protocol4.pickle")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "replay.html")
            cli("replay", path, "--html", out)
            with open(out) as f:
                self.assertEqual(memplan.replay(path)._repr_html_(), f.read())

    def test_solve_returns_a_valid_packing(self):
        rows = [("a", 0, 3, 100), ("b", 1, 4, 50), ("c", 3, 6, 100), ("d", 4, 8, 70), ("e", 0, 8, 8)]
        solved = memplan.solve(rows)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "buffers.csv")
            with open(path, "w") as f:
                f.write("id,lower,upper,size\n" + "".join(f"{i},{lo},{hi},{s}\n" for i, lo, hi, s in rows))
            expected = without_times(cli_json("solve", "--input", path))
        got = without_times(solved.to_dict())
        self.assertEqual(got.pop("input"), "<buffers>")
        expected.pop("input")
        self.assertEqual(got, expected)
        self.assertEqual(sorted(solved.offsets), ["a", "b", "c", "d", "e"])
        for i, (n1, lo1, hi1, s1) in enumerate(rows):
            o1 = solved.offsets[n1]
            self.assertLessEqual(o1 + s1, solved.height)
            for n2, lo2, hi2, s2 in rows[i + 1:]:
                o2 = solved.offsets[n2]
                if lo1 < hi2 and lo2 < hi1:  # live together: no overlap
                    self.assertTrue(o1 + s1 <= o2 or o2 + s2 <= o1, f"{n1} and {n2} overlap")
        within = memplan.solve([dict(id=r[0], lower=r[1], upper=r[2], size=r[3]) for r in rows],
                               budget=solved.height)
        self.assertIn(within.status, ("found", "optimal"))
        self.assertEqual(within.offsets.keys(), solved.offsets.keys())
        with self.assertRaises(ValueError):
            memplan.solve([("a", 0, 1)])


class Errors(unittest.TestCase):
    def assert_cli_message(self, call, flags):
        """The ValueError carries the CLI's own message for the same flags."""
        r = cli(*flags, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        with self.assertRaises(ValueError) as caught:
            call()
        first = r.stderr.strip().splitlines()[0]
        self.assertIn(first, str(caught.exception))

    def test_bad_values_raise_the_clis_message(self):
        self.assert_cli_message(lambda: memplan.fit(model="gpt2", dtype="bf17", device_memory="80GiB"),
                                ["fit", "--model", "gpt2", "--dtype", "bf17", "--device-memory", "80GiB"])
        self.assert_cli_message(lambda: memplan.fit(model="gpt2", device_memory="eighty"),
                                ["fit", "--model", "gpt2", "--device-memory", "eighty"])
        self.assert_cli_message(lambda: memplan.fit(model="no-such-model", device_memory="1GiB"),
                                ["fit", "--model", "no-such-model", "--device-memory", "1GiB"])
        self.assert_cli_message(lambda: memplan.fit(model="gpt2"), ["fit", "--model", "gpt2"])
        self.assert_cli_message(lambda: memplan.fit(model="gpt2", devices=3, batch=8, device_memory="1GiB"),
                                ["fit", "--model", "gpt2", "--devices", "3", "--batch", "8", "--device-memory", "1GiB"])

    def test_unknown_arguments_are_named(self):
        with self.assertRaises(ValueError) as caught:
            memplan.fit(model="gpt2", device_memory="80GiB", batchsize=8)
        self.assertIn("batchsize", str(caught.exception))
        self.assertIn("batch", str(caught.exception))
        with self.assertRaises(ValueError):
            memplan.fit(model="gpt2", device_memory="80GiB", max_batch="yes")
        with self.assertRaises(ValueError):
            memplan.fit(config=42, device_memory="80GiB")

    def test_hostile_inputs_raise_naming_them(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(ValueError) as caught:
                memplan.replay(d)
            self.assertIn(d, str(caught.exception))
            garbage = os.path.join(d, "garbage.pickle")
            with open(garbage, "wb") as f:
                f.write(b"\x80\x04not a snapshot at all")
            with self.assertRaises(ValueError) as caught:
                memplan.replay(garbage)
            self.assertIn(garbage, str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            memplan.replay(b"\x80\x04\x95garbage")
        self.assertIn("<snapshot bytes>", str(caught.exception))
        # A pickle that calls a function is refused, not run.
        with self.assertRaises(ValueError) as caught:
            memplan.replay(pickle.dumps({"segments": os.system}))
        self.assertIn("<snapshot bytes>", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            memplan.fit(config={"model_type": "no_such_family"}, device_memory="1GiB")
        self.assertIn("no_such_family", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            memplan.fit(onnx=b"not an onnx file", device_memory="1GiB")
        self.assertIn("<onnx bytes>", str(caught.exception))

    def test_help_is_the_clis(self):
        self.assertEqual(memplan.help("fit"), cli("fit", "--help").stdout.replace(CLI, "memplan"))
        with self.assertRaises(ValueError):
            memplan.help("no-such-command")


# A search that runs for minutes: a 70B model on 64 devices, largest batch for three strategies.
LONG_FIT = dict(model="llama2-70b", dtype="bf16", devices=64, zero=3, seq=4096, device_memory="80GiB", max_batch=True)


class Interrupts(unittest.TestCase):
    def test_ctrl_c_stops_a_long_search_and_the_next_call_works(self):
        pid = os.getpid()
        timer = threading.Timer(1.0, lambda: os.kill(pid, signal.SIGINT))
        start = time.monotonic()
        timer.start()
        with self.assertRaises(KeyboardInterrupt):
            memplan.fit(**LONG_FIT)
        stopped = time.monotonic() - start
        timer.join()
        # The search takes minutes; stopped soon after the signal at 1 s (bench/python_package.py
        # measures how soon).
        self.assertLess(stopped, 30.0)
        self.assertTrue(memplan.fit(model="mlp", device_memory="1GiB").fits)

    def test_calls_from_several_threads_take_turns(self):
        path = os.path.join(SNAPSHOTS, "fresh_protocol4.pickle")
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
        expected = without_times(memplan.replay(snapshot).to_dict())
        results, errors = [], []

        def call():
            try:
                results.append(without_times(memplan.replay(snapshot).to_dict()))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(results, [expected] * 4)

    def test_the_gil_is_released_while_planning(self):
        done = threading.Event()
        ticks = []

        def count():
            while not done.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.005)

        counter = threading.Thread(target=count)
        counter.start()
        try:
            start = time.monotonic()
            memplan.fit(model="gpt2", batch=16, seq=1024, device_memory="80GiB", max_batch=True)
            took = time.monotonic() - start
        finally:
            done.set()
            counter.join()
        during = [t for t in ticks if start < t < start + took]
        # With the GIL held for the whole call the counter could not tick at all.
        self.assertGreater(took, 0.2)
        self.assertGreater(len(during), 10, f"{len(during)} ticks in {took:.2f} s")


if __name__ == "__main__":
    unittest.main()
