"""The suite's memo of torch.export: a model captured once is not exported again in the same
test process, when a later test builds the same model anew (same classes and source files, same
attributes, same parameter and buffer names, shapes and values, same input shapes).

torch.export took about three quarters of the suite's time (each zoo model is exported by many
tests, 5-10 s a time); everything after it (capture's translation to our IR, the passes, the
backends) still runs in every test. On a hit the exported graph is reused with the new model's
own parameters and buffers, so a test that changed weights or buffers sees its own.

Only for the tests: a user's model can read globals, closures and helpers that no fingerprint
sees, so the package itself never skips an export. Here the fingerprint refuses (no memo) any
model with a class defined inside a function, a forward hook, or an attribute it cannot write
down (a function, an object without a value repr). A test about torch.export itself takes the
marker `fresh_capture`; EDGETRAIN_TEST_FRESH_CAPTURE=1 turns the memo off for a whole run."""
from __future__ import annotations

import enum
import hashlib
import importlib
import inspect
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

capture_module = importlib.import_module("edgetrain.frontend.capture")

#: exported programs kept per process (each holds the first model's tensors)
SIZE = 24
_memo: "OrderedDict[str, object]" = OrderedDict()
_files: dict[str, str] = {}
stats = {"hits": 0, "misses": 0, "refused": 0}
enabled = os.environ.get("EDGETRAIN_TEST_FRESH_CAPTURE", "") in ("", "0")


class Unmemoizable(Exception):
    """The model holds something the fingerprint cannot write down."""


def _file_hash(cls: type) -> str:
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:  # a builtin
        return "builtin"
    if path is None:
        raise Unmemoizable(f"no source file for {cls.__qualname__}")
    if path.startswith(capture_module._TORCH_DIR):
        return "torch"  # torch's own modules: fixed by torch.__version__
    if path not in _files:
        _files[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return _files[path]


def _tensor(t) -> str:
    a = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
    return f"T{tuple(a.shape)}{a.dtype}:{hashlib.sha256(a.tobytes()).hexdigest()}"


def _canon(v) -> str:
    if v is None or isinstance(v, (bool, int, float, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum)):
        return f"{type(v).__name__}:{v!r}"
    if isinstance(v, (torch.Tensor, np.ndarray)):
        return _tensor(v)
    if isinstance(v, (tuple, list)):
        return f"{type(v).__name__}[" + ",".join(_canon(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(sorted(f"{_canon(k)}={_canon(x)}" for k, x in v.items())) + "}"
    if isinstance(v, (set, frozenset)):
        return "set{" + ",".join(sorted(_canon(x) for x in v)) + "}"
    if isinstance(v, torch.nn.Module) or callable(v):
        raise Unmemoizable(f"an attribute {type(v).__name__}")
    r = repr(v)
    if " at 0x" in r or r.startswith("<"):  # an object without a value repr (an address)
        raise Unmemoizable(f"an attribute {type(v).__name__} without a value repr")
    return f"{type(v).__module__}.{type(v).__qualname__}:{r}"


#: nn.Module's own bookkeeping, written down separately (parameters, buffers, submodules) or
#: not affecting the exported graph (state-dict and backward hooks)
_OWN = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}
_FORWARD_HOOKS = ("_forward_hooks", "_forward_pre_hooks")


def fingerprint(model: torch.nn.Module, args: tuple) -> str:
    h = hashlib.sha256()
    put = lambda *s: h.update(("\x00".join(map(str, s)) + "\x01").encode())  # noqa: E731
    put(torch.__version__, torch.get_default_dtype(), torch.is_grad_enabled())
    for name, m in model.named_modules(remove_duplicate=False):
        cls = type(m)
        for c in cls.__mro__:
            if "<locals>" in c.__qualname__:
                raise Unmemoizable(f"{c.__qualname__} is defined inside a function")
        put("module", name, cls.__module__, cls.__qualname__, *(_file_hash(c) for c in cls.__mro__ if c is not object))
        for k in _FORWARD_HOOKS:
            if getattr(m, k, None):
                raise Unmemoizable(f"{name or 'the model'} has a forward hook")
        for k, v in sorted(vars(m).items()):
            if k in _OWN or "hook" in k:
                continue
            put("attr", k, _canon(v))
        put("non-persistent", sorted(m._non_persistent_buffers_set))
    storage: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tied = storage.setdefault(p.data_ptr(), name)
        put("param", name, tuple(p.shape), p.dtype, p.requires_grad, tied)
    for name, b in model.named_buffers(remove_duplicate=False):
        put("buffer", name, _tensor(b))
    for a in args:
        t = torch.as_tensor(a)
        put("arg", tuple(t.shape), t.dtype)
    return h.hexdigest()


def _resolve(model: torch.nn.Module, fqn: str):
    obj = model
    for part in fqn.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.Tensor) else None


class Reused:
    """What capture() reads of an ExportedProgram, with `model`'s own parameters and buffers
    (and its tensor attributes torch.export lifted as constants; constants that forward itself
    made are the first export's: the same code made them)."""

    def __init__(self, ep, model: torch.nn.Module):
        self.graph, self.graph_signature, self.call_spec = ep.graph, ep.graph_signature, ep.call_spec
        self.state_dict = {k: _resolve(model, k) for k in ep.state_dict}
        missing = [k for k, v in self.state_dict.items() if v is None]
        if missing:
            raise KeyError(f"the model has no tensor {missing[0]}")
        self.constants = {}
        for k, v in ep.constants.items():
            own = _resolve(model, k)
            self.constants[k] = v if own is None else own


#: set by the conftest for a test marked `fresh_capture`
fresh = False


def exported(model: torch.nn.Module, args: tuple, export):
    """export(model, args), or the program exported before for a model of the same fingerprint."""
    if not enabled or fresh:
        return export(model, args)
    try:
        key = fingerprint(model, args)
    except Unmemoizable:
        stats["refused"] += 1
        return export(model, args)
    ep = _memo.get(key)
    if ep is not None:
        try:
            out = Reused(ep, model)
        except KeyError:
            out = None
        if out is not None:
            _memo.move_to_end(key)
            stats["hits"] += 1
            return out
    stats["misses"] += 1
    ep = export(model, args)
    _memo[key] = ep
    while len(_memo) > SIZE:
        _memo.popitem(last=False)
    return ep


def install() -> None:
    """Put the memo around capture's torch.export call (once per process)."""
    real = capture_module._export_decomposed
    if getattr(real, "memoized", False):
        return

    def memoized(model, args):
        return exported(model, args, real)

    memoized.memoized = True
    capture_module._export_decomposed = memoized
