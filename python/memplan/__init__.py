"""memplan from Python: plan a training step's memory before it runs.

One call per command of the ``memplan`` CLI, with keyword arguments named as its flags
(``--device-memory`` is ``device_memory=``, ``--max-batch`` is ``max_batch=True``)::

    import memplan
    answer = memplan.fit(model="gpt2", batch=8, seq=1024, dtype="bf16", device_memory="80GiB")
    print(answer)                 # the CLI's answer, as `memplan fit` prints it
    answer.fits, answer.arena_bytes, answer.breakdown.activations
    answer.to_dict()              # equal to `memplan fit ... --json`

- ``fit``, ``plan``, ``compare``: a model from ``model=`` (the zoo's names, ``gpt``, ``mlp``,
  ``cnn``), ``config=`` (a Hugging Face config.json path, or the dict itself) or ``onnx=`` (a
  path, or the file's bytes). ``memplan.torch`` plans a ``torch.nn.Module`` directly; it is
  loaded on first use (``import memplan`` does not import PyTorch).
- ``replay``: a PyTorch memory snapshot, as a path or as the dict
  ``torch.cuda.memory._snapshot()`` returns (nothing is written to disk).
- ``solve``: buffers (id, lower, upper, size) packed into one arena, as ``memplan solve`` does.

The commands run in this process, with the CLI's own flag checks and JSON: a bad argument is a
``ValueError`` carrying the CLI's message, the GIL is released while memplan works, and Ctrl-C
stops a long search with ``KeyboardInterrupt``. ``memplan.help("fit")`` is the CLI's ``--help``.
Results show as HTML in a notebook (``compare``, ``replay``); ``plan(...).svg()`` draws the arena.
"""

import copy as _copy
import json as _json
import os as _os
import pickle as _pickle
import warnings as _warnings

from . import _memplan

__all__ = ["fit", "plan", "compare", "replay", "solve", "help", "Result", "Figures"]
__version__ = "0.1.0"

# Names under which inputs given in memory are handed to the command (they appear where the CLI
# would show a path: JSON "model"/"input", messages).
_CONFIG_DICT = "<config dict>"
_ONNX_BYTES = "<onnx bytes>"
_SNAPSHOT_DICT = "<snapshot dict>"
_SNAPSHOT_BYTES = "<snapshot bytes>"
_BUFFERS = "<buffers>"
_REPORT = "<report>"

_options_cache = {}


def _options(command):
    """{flag name without '--': (takes a value, takes several)} of a CLI command."""
    if command not in _options_cache:
        _options_cache[command] = {n: (value, many) for n, value, many in _memplan.command_options(command)}
    return _options_cache[command]


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _os.PathLike):
        return _os.fspath(value)
    return str(value)


def _command_line(command, flags, positional=None):
    """The CLI's argument list for `flags` (keyword arguments named as the flags)."""
    options = _options(command)
    args = [command]
    if positional is not None:
        args.append(positional)
    for key, value in flags.items():
        if value is None:
            continue
        name = key.replace("_", "-")
        if name not in options or name in ("json",):
            known = ", ".join(sorted(n.replace("-", "_") for n in options if n not in ("json", "file", "input")))
            raise ValueError(f"memplan.{command}: no argument {key!r} (memplan {command} has no --{name}); "
                             f"arguments: {known}")
        takes_value, many = options[name]
        if not takes_value:
            if value is True:
                args.append("--" + name)
            elif value is not False:
                raise ValueError(f"memplan.{command}: {key} is a switch: True or False, not {value!r}")
        elif many and isinstance(value, (list, tuple)):
            args.append("--" + name)
            args.extend(_text(v) for v in value)
        else:
            args.append(f"--{name}={_text(value)}")
    return args


def _message(err):
    """The CLI's message without CLI11's pointer to --help."""
    lines = [line for line in err.strip().splitlines() if line and not line.startswith("Run with --help")]
    return "\n".join(lines) if lines else "memplan failed without a message"


def _run(args, inputs, outputs=()):
    r = _memplan.run(args, inputs, list(outputs))
    code = r["exit_code"]
    if code == _memplan.exit_cancelled:
        raise KeyboardInterrupt(_message(r["err"]))
    if code == 0 and r["err"].strip():
        # What the CLI would have said on stderr beside its answer (notes, resumptions).
        _warnings.warn(r["err"].strip(), RuntimeWarning, stacklevel=4)
    return r


def _json_of(command, args, inputs, outputs=()):
    r = _run(args + ["--json"], inputs, outputs)
    code = r["exit_code"]
    if code == _memplan.exit_usage:
        raise ValueError(_message(r["err"]))
    out = r["out"].strip()
    if code != 0 and not out:
        raise RuntimeError(_message(r["err"]))
    try:
        data = _json.loads(out)
    except ValueError as e:
        raise RuntimeError(f"memplan {command} printed no JSON: {out[:200]!r}") from e
    return data, r


class Figures:
    """A JSON object of a result with its keys as attributes (and as items)."""

    def __init__(self, data):
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name):
        data = object.__getattribute__(self, "_data")
        if name in data:
            return _wrap(data[name])
        raise AttributeError(f"{type(self).__name__} has no figure {name!r} (figures: {', '.join(data)})")

    def __getitem__(self, key):
        return _wrap(self._data[key])

    def __contains__(self, key):
        return key in self._data

    def __dir__(self):
        return list(self._data) + ["to_dict"]

    def keys(self):
        return self._data.keys()

    def to_dict(self):
        """A copy of the figures as plain dicts, lists and numbers (the CLI's JSON)."""
        return _copy.deepcopy(self._data)

    def __eq__(self, other):
        return isinstance(other, Figures) and other._data == self._data

    def __repr__(self):
        return f"Figures({self._data!r})"


def _wrap(value):
    if isinstance(value, dict):
        return Figures(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class Result(Figures):
    """A command's answer: its figures as attributes, to_dict() equal to the CLI's --json.

    str(result) is the answer as the CLI prints it without --json.
    """

    command = ""

    def __init__(self, data, args, inputs, seconds):
        super().__init__(data)
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_inputs", inputs)
        object.__setattr__(self, "_text", None)
        # How long the command took inside memplan (parsing its flags to its last output).
        object.__setattr__(self, "seconds", seconds)

    def __setattr__(self, name, value):
        raise AttributeError("memplan results are read-only")

    def _rerun(self, extra, outputs=()):
        r = _run(self._args + extra, self._inputs, outputs)
        if r["exit_code"] not in (0, _memplan.exit_failure):
            raise RuntimeError(_message(r["err"]))
        return r

    def __str__(self):
        if self._text is None:
            object.__setattr__(self, "_text", self._rerun([])["out"])
        return self._text.rstrip("\n")

    def __repr__(self):
        shown = {k: v for k, v in self._data.items() if not isinstance(v, (dict, list))}
        body = ", ".join(f"{k}={v!r}" for k, v in list(shown.items())[:8])
        return f"<memplan.{type(self).__name__} {body}>"

    def _report(self, flag):
        r = self._rerun([f"--{flag}={_REPORT}"], outputs=[_REPORT])
        report = r["outputs"].get(_REPORT)
        if report is None:
            raise RuntimeError(_message(r["err"]))
        return report.decode("utf-8")


class FitResult(Result):
    command = "fit"


class PlanResult(Result):
    command = "plan"

    def svg(self):
        """A picture of the arena (SVG text): every tensor at its offset over its lifetime."""
        return self._report("svg")

    def _repr_svg_(self):
        return self.svg()


class _WithHtmlReport(Result):
    """A result whose command writes an HTML report (--html) and layouts (--svg): a notebook shows it."""

    def html(self):
        """The self-contained HTML report the command writes with --html."""
        return self._report("html")

    def svg(self):
        """The layouts the command draws with --svg (SVG text)."""
        return self._report("svg")

    def _repr_html_(self):
        return self.html()


class CompareResult(_WithHtmlReport):
    command = "compare"


class ReplayResult(_WithHtmlReport):
    command = "replay"


class SolveResult(Result):
    command = "solve"

    def __init__(self, data, args, inputs, seconds, offsets):
        super().__init__(data, args, inputs, seconds)
        # {buffer id: offset} of the packing found (empty when none was).
        object.__setattr__(self, "offsets", offsets)


def _model_source(command, flags):
    """Moves config= and onnx= given in memory into inputs; returns (flags, inputs)."""
    flags = dict(flags)
    inputs = {}
    config = flags.get("config")
    if isinstance(config, dict):
        inputs[_CONFIG_DICT] = _json.dumps(config).encode("utf-8")
        flags["config"] = _CONFIG_DICT
    onnx = flags.get("onnx")
    if isinstance(onnx, (bytes, bytearray, memoryview)):
        inputs[_ONNX_BYTES] = bytes(onnx)
        flags["onnx"] = _ONNX_BYTES
    for key in ("config", "onnx"):
        if flags.get(key) is not None and not isinstance(flags[key], (str, _os.PathLike)):
            kind = "a path or a dict" if key == "config" else "a path or the file's bytes"
            raise ValueError(f"memplan.{command}: {key} must be {kind}, not {type(flags[key]).__name__}")
    return flags, inputs


def _model_command(command, cls, model, flags, inputs_extra=None):
    if model is not None:
        flags = dict(flags, model=model)
    flags, inputs = _model_source(command, flags)
    if inputs_extra:
        inputs.update(inputs_extra)
    args = _command_line(command, flags)
    data, r = _json_of(command, args, inputs)
    return cls(data, args, inputs, r["seconds"])


def fit(model=None, **flags):
    """Does a training step fit a device's memory, and what is the largest batch that does?

    Keyword arguments are `memplan fit`'s flags: model= | config= (path or dict) | onnx= (path or
    bytes), batch, seq, image_size, dtype, optimizer, device_memory (required: "80GiB" or bytes),
    device, checkpoint, devices, zero, tensor_parallel, sequence_parallel=True, expert_parallel, offload_optimizer,
    fused_loss="auto"|"on"|"off", schedule="auto"|"searched"|..., max_batch=True, minimum=True,
    suggest=True (the cheapest combination of levers that fits), ... (memplan.help("fit")).
    Returns a FitResult: fits, arena_bytes, total_bytes, breakdown, max_batch_by_checkpoint, ...
    """
    return _model_command("fit", FitResult, model, flags)


def plan(model=None, **flags):
    """Plans a model's training step: every tensor's offset, size and lifetime in one arena.

    Keyword arguments are `memplan plan`'s flags (memplan.help("plan")). Returns a PlanResult:
    arena_bytes, lower_bound_bytes, buffers, ...; .svg() draws the arena.
    """
    return _model_command("plan", PlanResult, model, flags)


def compare(model=None, **flags):
    """The static plan against PyTorch-style caching allocators on the same step.

    Keyword arguments are `memplan compare`'s flags (memplan.help("compare")). Returns a
    CompareResult; in a notebook it shows the HTML report (.html()).
    """
    return _model_command("compare", CompareResult, model, flags)


def replay(snapshot, **flags):
    """Replays a PyTorch memory snapshot through memplan's caching allocator and static plan.

    `snapshot` is a .pickle path, the dict torch.cuda.memory._snapshot() returns, or the pickle's
    bytes. Keyword arguments are `memplan replay`'s flags: alloc_conf="expandable_segments:True",
    device, exact_nodes, top. Returns a ReplayResult; in a notebook it shows the HTML report.
    """
    inputs = {}
    if isinstance(snapshot, dict):
        inputs[_SNAPSHOT_DICT] = _pickle.dumps(snapshot)
        source = _SNAPSHOT_DICT
    elif isinstance(snapshot, (bytes, bytearray, memoryview)):
        inputs[_SNAPSHOT_BYTES] = bytes(snapshot)
        source = _SNAPSHOT_BYTES
    elif isinstance(snapshot, (str, _os.PathLike)):
        source = _os.fspath(snapshot)
    else:
        raise ValueError("memplan.replay: snapshot must be a path, the dict torch.cuda.memory._snapshot() returns, "
                         f"or the pickle's bytes, not {type(snapshot).__name__}")
    args = _command_line("replay", flags, positional=source)
    data, r = _json_of("replay", args, inputs)
    return ReplayResult(data, args, inputs, r["seconds"])


def _buffers_csv(buffers):
    lines = ["id,lower,upper,size"]
    for row in buffers:
        if isinstance(row, dict):
            try:
                values = (row["id"], row["lower"], row["upper"], row["size"])
            except KeyError as e:
                raise ValueError(f"memplan.solve: a buffer needs id, lower, upper and size; {row!r} has no {e}") from None
        else:
            values = tuple(row)
            if len(values) != 4:
                raise ValueError(f"memplan.solve: a buffer is (id, lower, upper, size), not {row!r}")
        for v in values[1:]:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"memplan.solve: lower, upper and size are integers; {row!r} is not")
        ident = str(values[0])
        if any(c in ident for c in ",\n\r"):
            raise ValueError(f"memplan.solve: a buffer id may not hold commas or line breaks: {ident!r}")
        lines.append(f"{ident},{values[1]},{values[2]},{values[3]}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def solve(buffers, budget=None, **flags):
    """Assigns an offset to every buffer so that no two live at once overlap (memplan solve).

    `buffers` is a MiniMalloc CSV path or rows (id, lower, upper, size) as tuples or dicts, each
    live over [lower, upper). With `budget` (bytes, or "64MiB"): a packing within it; without: the
    lowest arena found. Returns a SolveResult: height, lower_bound, status, and offsets {id: offset}
    (empty when no packing was found).
    """
    if "output" in flags:
        raise ValueError("memplan.solve: output= is not taken: the result's offsets are the packing")
    inputs = {}
    if isinstance(buffers, (str, _os.PathLike)):
        source = _os.fspath(buffers)
    else:
        inputs[_BUFFERS] = _buffers_csv(buffers)
        source = _BUFFERS
    if budget is not None:
        if isinstance(budget, str):
            budget = _memplan.parse_byte_size(budget)
        flags = dict(flags, budget=budget)
    args = _command_line("solve", dict(flags, input=source))
    packing = "<packing>"
    data, r = _json_of("solve", args + [f"--output={packing}"], inputs, [packing])
    data.pop("output", None)  # the in-memory name of the packing, not a file the caller has
    offsets = {}
    written = r["outputs"].get(packing)
    if written:
        rows = written.decode("utf-8").splitlines()
        header = rows[0].split(",")
        i_id, i_off = header.index("id"), header.index("offset")
        for line in rows[1:]:
            cells = line.split(",")
            key = cells[i_id]
            offsets[int(key) if key.lstrip("-").isdigit() else key] = int(cells[i_off])
    return SolveResult(data, args, inputs, r["seconds"], offsets)


def help(command):  # noqa: A001 (the CLI's word)
    """The CLI's --help for a command: every keyword argument it takes, as a flag."""
    r = _memplan.run([command, "--help"], {}, [])
    if r["exit_code"] != 0:
        raise ValueError(_message(r["err"]))
    return r["out"]


def __getattr__(name):
    """``memplan.torch`` on first use, so that ``import memplan`` never imports PyTorch."""
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)  # also sets the package's attribute
    raise AttributeError(f"module 'memplan' has no attribute '{name}'")
