"""Loading models from Python source: KernelBench files and `module:Class` targets.

Importing a .py file executes it (its top level, Model.__init__, get_inputs and forward), unlike
loading a project file, which never runs code. Only import files you trust.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..errors import ImportFailure
from ..ir import Program
from ..ops.common import torch_dtype
from ..reference import draw
from .trace import _first_line
from .hints import init_hint, observed_inputs, probe_hints
from .packages import missing_package
from .module import import_nn_module

# Above this many input elements get_inputs() is not run for real (KernelBench has 17 GB inputs):
# the model is traced on fake tensors, and hints come from a probe with capped dimensions.
INPUT_ELEMENT_LIMIT = 1 << 26


def load_source(path) -> object:
    """Execute a .py file as a fresh module; ImportFailure with a one-line cause on any error."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ImportFailure(f"cannot read {path}: {e.strerror or e}") from None
    try:
        code = compile(text, str(path), "exec")
    except SyntaxError as e:
        raise ImportFailure(f"{path.name}: syntax error at line {e.lineno}: {e.msg}") from None
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    name = f"_stitchcuda_import_{path.stem.replace('-', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look the module up while it runs
    try:
        exec(code, mod.__dict__)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ImportFailure(missing_package(e, path.name, path.parent)
                            or f"{path.name}: running the file failed: {_first_line(e)}") from None
    return mod


def _call(fn, what: str, seed: int):
    torch.manual_seed(seed)
    try:
        out = fn()
    except Exception as e:
        raise ImportFailure(missing_package(e, what) or f"{what} raised {_first_line(e)}") from None
    return out


def _numel(values) -> int:
    return sum(v.numel() for v in values if isinstance(v, torch.Tensor))


def example_inputs(get_inputs, seed: int, *, fake_mode: FakeTensorMode | None = None,
                   meta: bool = False, where: str = "get_inputs()"):
    """(forward args, init hints) from a get_inputs function, without creating huge tensors."""
    try:
        torch.manual_seed(seed)
        with torch.device("meta"):
            shapes = list(get_inputs())
    except Exception:
        shapes = None
    if not meta and (shapes is None or _numel(shapes) <= INPUT_ELEMENT_LIMIT):
        try:
            return observed_inputs(get_inputs, seed)
        except Exception as e:
            raise ImportFailure(missing_package(e, where) or f"{where} raised {_first_line(e)}") from None
    if shapes is None:
        raise ImportFailure(f"{where} cannot run on the meta device, so its inputs cannot be shaped without "
                            f"creating them")
    hints = probe_hints(get_inputs, seed, len(shapes))
    if meta:
        return shapes, hints
    fake_mode = fake_mode or FakeTensorMode()
    with fake_mode:
        args = [torch.empty(tuple(s.shape), dtype=s.dtype) if isinstance(s, torch.Tensor) else s for s in shapes]
    return args, hints


def build_model(cls, init_args, seed: int, *, weights: bool = True, what: str = "Model"):
    torch.manual_seed(seed)
    try:
        if weights:
            model = cls(*init_args)
        else:
            with torch.device("meta"):
                model = cls(*init_args)
    except Exception as e:
        raise ImportFailure(missing_package(e, f"{what}(*init_args)")
                            or f"{what}(*init_args) raised {_first_line(e)}") from None
    if not isinstance(model, torch.nn.Module):
        raise ImportFailure(f"{what} is not a torch.nn.Module (got {type(model).__name__})")
    return model.eval()


def import_file(path, *, init_args=None, seed: int = 0, weights: bool = True) -> Program:
    """A KernelBench-format file (Model, get_inputs, get_init_inputs) as a Program.

    weights=False builds the model on the meta device: parameters keep their shapes but no data
    (the reference then draws them), for models too large to hold in memory.
    """
    path = Path(path)
    mod = load_source(path)
    cls = getattr(mod, "Model", None)
    if cls is None:
        raise ImportFailure(f"{path.name} defines no Model class (a KernelBench file defines Model, get_inputs "
                            f"and get_init_inputs)")
    get_inputs = getattr(mod, "get_inputs", None)
    if get_inputs is None:
        raise ImportFailure(f"{path.name} defines no get_inputs() function")
    if init_args is None:
        gi = getattr(mod, "get_init_inputs", None)
        init_args = list(_call(gi, "get_init_inputs()", seed)) if gi is not None else []
    try:
        model = build_model(cls, init_args, seed, weights=weights)
    except ImportFailure:
        if weights:
            raise
        # a model whose __init__ reads a value (Swin's drop-path rates: linspace(...).item()) cannot be
        # built on the meta device: build it for real (its inputs are then made as usual, fake when large)
        model, weights = build_model(cls, init_args, seed), True
    args, hints = example_inputs(get_inputs, seed, meta=not weights)
    # the model is made here and dropped after: its weights become the program's without a copy
    # (copying 2_ShallowWideMLP's 8.6 GB was about 18 s of its import)
    program = import_nn_module(model, args, name=path.stem, hints=hints, copy_weights=False)
    program.metadata["source"] = {"kind": "kernelbench", "path": str(path), "init_args": _jsonable(init_args),
                                  "seed": seed, "weights": weights}
    return program


def _resolve(target: str):
    """(python module, class or object) for 'pkg.mod:Class' or 'path/file.py:Class'."""
    if ":" not in target:
        raise ImportFailure(f"'{target}' is not of the form module:Class or file.py:Class")
    where, _, attr = target.rpartition(":")
    if where.endswith(".py") or "/" in where or "\\" in where:
        mod = load_source(where)
    else:
        try:
            mod = importlib.import_module(where)
        except Exception as e:
            itself = isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == where.split(".")[0]
            raise ImportFailure((None if itself else missing_package(e, f"module '{where}'"))
                                or f"cannot import module '{where}': {_first_line(e)}") from None
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ImportFailure(f"'{where}' has no attribute '{attr}'")
    return mod, obj


def _spec_inputs(inputs, seed: int):
    """Tensors from a list of tensors, numbers or specs ((shape), dtype[, init hint])."""
    gen = torch.Generator().manual_seed(seed)
    args, hints = [], []
    for item in inputs:
        if isinstance(item, torch.Tensor):
            args.append(item)
            hints.append(init_hint(item))
        elif isinstance(item, (tuple, list)) and item and isinstance(item[0], (tuple, list, torch.Size)):
            shape, dtype = tuple(item[0]), item[1] if len(item) > 1 else "float32"
            hint = item[2] if len(item) > 2 else None
            try:
                torch_dtype(dtype)
            except KeyError:
                raise ImportFailure(f"unknown dtype '{dtype}' in input spec {item!r}") from None
            if math.prod(shape) > INPUT_ELEMENT_LIMIT:
                with FakeTensorMode():
                    args.append(torch.empty(shape, dtype=torch_dtype(dtype)))
            else:
                args.append(draw(shape, dtype, hint, gen))
            hints.append(hint)
        else:
            args.append(item)
            hints.append(None)
    return args, hints


def import_module(target: str, *, inputs=None, init_args=None, seed: int = 0) -> Program:
    """'pkg.mod:Class' or 'path/file.py:Class' (a class, or a module instance) as a Program.

    inputs: forward's arguments as tensors, numbers, or specs like [((16, 32), "float32")]; by
    default the target module's get_inputs(). init_args default to its get_init_inputs(), or none.
    """
    mod, obj = _resolve(target)
    if isinstance(obj, torch.nn.Module):
        model = obj.eval()
    elif isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        if init_args is None:
            gi = getattr(mod, "get_init_inputs", None)
            init_args = list(_call(gi, "get_init_inputs()", seed)) if gi is not None else []
        model = build_model(obj, init_args, seed, what=target.rpartition(":")[2])
    else:
        raise ImportFailure(f"'{target}' is neither a torch.nn.Module subclass nor a module instance")
    if inputs is None:
        gi = getattr(mod, "get_inputs", None)
        if gi is None:
            raise ImportFailure(f"'{target}': give inputs (tensors or specs like [((16, 32), 'float32')]); "
                                f"its module has no get_inputs()")
        args, hints = example_inputs(gi, seed)
    else:
        args, hints = _spec_inputs(inputs, seed)
    name = target.rpartition(":")[2].split(".")[-1]
    program = import_nn_module(model, args, name=name, hints=hints)
    program.metadata["source"] = {"kind": "module", "target": target, "init_args": _jsonable(init_args or []),
                                  "seed": seed}
    return program


def _jsonable(values) -> list:
    out = []
    for v in values:
        if isinstance(v, (bool, int, float, str)) or v is None:
            out.append(v)
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float, str)) for x in v):
            out.append(list(v))
        else:
            out.append(repr(v))
    return out
