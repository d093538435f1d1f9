"""memplan.torch: a torch.nn.Module's training step planned directly, without an ONNX file.

    import torch, torchvision, memplan.torch
    model = torchvision.models.resnet18()
    answer = memplan.torch.fit(model, torch.randn(32, 3, 224, 224), device_memory="24GiB", max_batch=True)

The module is exported through torch.onnx in training mode into memory (batch-norm statistics
and dropout as training uses them; the first dimension of every input is the batch, so
``max_batch=True`` can vary it) and planned by memplan's ONNX importer: the same as
``memplan fit --onnx`` on that export. The module is left as it was: its buffers (batch-norm
running statistics, which the export's trace updates) and torch's random state are restored.
An op memplan does not import is a ValueError naming it and the module it comes from.
"""

import io as _io
import re as _re

import memplan as _memplan

__all__ = ["fit", "plan", "compare", "export_onnx"]


def _as_tuple(example_inputs):
    import torch

    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs)
    raise ValueError("memplan.torch: example_inputs must be a tensor or a tuple of tensors, "
                     f"not {type(example_inputs).__name__}")


def export_onnx(module, example_inputs, opset_version=15):
    """The module's ONNX export (bytes) in training mode, every input's first dimension the batch."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"memplan.torch: expected a torch.nn.Module, not {type(module).__name__}")
    inputs = _as_tuple(example_inputs)
    names = [f"input{i}" for i in range(len(inputs))]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    rng = torch.random.get_rng_state()
    was_training = module.training
    out = _io.BytesIO()
    try:
        torch.onnx.export(module, inputs, out, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          opset_version=opset_version, input_names=names, output_names=["output"],
                          dynamic_axes={n: {0: "batch"} for n in names})
    finally:
        module.train(was_training)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        torch.random.set_rng_state(rng)
    return out.getvalue()


def _module_path(module, node):
    """The module an exported node came from: '/layer1/layer1.0/conv1/Conv' -> 'layer1.0.conv1'."""
    parts = [p for p in node.split("/") if p][:-1]
    path = []
    for p in parts:
        if path and p.startswith(".".join(path) + "."):
            path = p.split(".")
        else:
            path += p.split(".")
    name = ".".join(path)
    modules = dict(module.named_modules())
    if name in modules:
        return f"{name} ({type(modules[name]).__name__})" if name else f"the top module ({type(module).__name__})"
    return None


def _run(command, module, example_inputs, flags):
    inputs = _as_tuple(example_inputs)
    if "onnx" in flags or "model" in flags or "config" in flags:
        raise ValueError(f"memplan.torch.{command}: the module is the model; model=, config= and onnx= are not taken")
    flags = dict(flags)
    if "batch" not in flags and inputs and hasattr(inputs[0], "shape") and len(inputs[0].shape) > 0:
        flags["batch"] = int(inputs[0].shape[0])
    label = f"<torch {type(module).__name__}>"
    onnx = export_onnx(module, inputs, opset_version=flags.pop("opset_version", 15))
    try:
        return _memplan._model_command(command, _RESULTS[command], None, dict(flags, onnx=label), {label: onnx})
    except ValueError as e:
        message = str(e)
        m = _re.search(r"node '([^']*)'", message)
        where = _module_path(module, m.group(1)) if m else None
        if where:
            raise ValueError(f"{message}\n(in module {where})") from None
        raise


_RESULTS = {"fit": _memplan.FitResult, "plan": _memplan.PlanResult, "compare": _memplan.CompareResult}


def fit(module, example_inputs, loss="cross_entropy", optimizer="adamw", **flags):
    """memplan.fit for a torch.nn.Module: does its training step fit device_memory=?

    example_inputs: a tensor or tuple of tensors as the module's forward takes them; batch= (the
    first dimension) defaults to theirs. Other keywords as memplan.fit (device_memory, dtype,
    checkpoint, max_batch, ...).
    """
    return _run("fit", module, example_inputs, dict(flags, loss=loss, optimizer=optimizer))


def plan(module, example_inputs, loss="cross_entropy", optimizer="adamw", **flags):
    """memplan.plan for a torch.nn.Module: every tensor of its training step in one arena."""
    return _run("plan", module, example_inputs, dict(flags, loss=loss, optimizer=optimizer))


def compare(module, example_inputs, loss="cross_entropy", optimizer="adamw", **flags):
    """memplan.compare for a torch.nn.Module: the static plan against caching allocators."""
    return _run("compare", module, example_inputs, dict(flags, loss=loss, optimizer=optimizer))
