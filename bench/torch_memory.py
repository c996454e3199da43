"""Peak memory of one PyTorch eager training step, metered tensor by tensor.

`StorageMeter` is a TorchDispatchMode: every aten op that runs under it (forward,
the autograd engine's backward ops, gradient accumulation, optimizer arithmetic, `zero_grad`)
goes through `__torch_dispatch__`, which registers each output storage it has not seen
before (keyed by `data_ptr`) with its byte size and a `weakref.finalize` on the storage
object. Storages keep their Python object for as long as any tensor (a view, a tensor
saved for backward, a `.grad`) still uses them, so the finalizer runs exactly when the
memory is released; the meter keeps the running total of live bytes and its maximum.

Counted: every storage an aten op returns during the step (activations, tensors saved
for backward, gradients, outputs of optimizer ops, temporaries; each at its full size
from the moment the op returns until its last reference dies), plus storages declared
live up front (`hold`: input and labels). Not counted: views and in-place results
(they alias a storage already counted or held), storages that existed before the step
(parameters and buffers, reported separately), scratch memory that a kernel allocates
and frees inside a single op (im2col / oneDNN workspaces) since no tensor escapes the
op, allocator caching and fragmentation, and non-tensor objects (the autograd graph,
Python frames).
"""
from __future__ import annotations

import itertools
import statistics
import time
import weakref
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: timed repeats of the step (without the meter); the median is reported
REPEATS = 5


def _storage(t) -> Optional[torch.UntypedStorage]:
    if not isinstance(t, torch.Tensor) or t.is_sparse or t.device.type == "meta":
        return None
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without a storage (nested, ...)
        return None
    return s if s.data_ptr() != 0 and s.nbytes() > 0 else None


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and tied tensors once)."""
    seen = {}
    for t in tensors:
        s = _storage(t)
        if s is not None:
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class StorageMeter(TorchDispatchMode):
    """Meters live tensor storage created under it (see the module docstring).

    `exclude`: tensors whose storages exist already and must not be counted when an op
    returns them or a view of them (weights). `hold`: tensors counted as live from the
    start to the end (input, labels held by the caller). After the `with` block:
    `peak` (bytes), `peak_op` (the aten op whose outputs reached it), `live` (bytes live
    now: releases after the block still update it), and with `trace=True` `events`: (op, bytes its outputs
    allocated, live bytes after it) per op, and ("(freed)", -bytes, live bytes after)
    per storage released; `peak_live`: (creating op, bytes) of each storage live at the
    peak.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = (), hold: Iterable[torch.Tensor] = (), trace: bool = False):
        super().__init__()
        self._excluded = {s.data_ptr() for s in map(_storage, exclude) if s is not None}
        self._live: dict[int, tuple[int, int, str]] = {}  # data_ptr -> (token, nbytes, creating op)
        self._tokens = itertools.count()
        self.held = 0
        for t in hold:
            s = _storage(t)
            if s is not None and s.data_ptr() not in self._excluded and s.data_ptr() not in self._live:
                self._live[s.data_ptr()] = (-1, s.nbytes(), "(held)")  # never released: held throughout
                self.held += s.nbytes()
        self.current = self.peak = self.held
        self.peak_op = "(held)"
        self.trace = trace
        self.events: list[tuple[str, int, int]] = []
        self.peak_live: list[tuple[str, int]] = []

    def _release(self, ptr: int, token: int) -> None:
        entry = self._live.get(ptr)
        if entry is not None and entry[0] == token:
            del self._live[ptr]
            self.current -= entry[1]
            if self.trace:
                self.events.append(("(freed)", -entry[1], self.current))

    @property
    def live(self) -> int:
        return self.current

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {s.data_ptr() for s in map(_storage, tree_flatten((args, kwargs))[0]) if s is not None}
        added = 0
        for t in tree_flatten(out)[0]:
            s = _storage(t)
            if s is None:
                continue
            ptr = s.data_ptr()
            if ptr in self._live or ptr in self._excluded or ptr in inputs:
                continue  # a view or in-place result of a storage counted, held or excluded
            token = next(self._tokens)
            self._live[ptr] = (token, s.nbytes(), str(func))
            weakref.finalize(s, self._release, ptr, token)
            added += s.nbytes()
        self.current += added
        if self.current > self.peak:
            self.peak, self.peak_op = self.current, str(func)
            if self.trace:
                self.peak_live = [(op, n) for _, n, op in self._live.values()]
        if self.trace:
            self.events.append((str(func), added, self.current))
        return out


def measure_torch_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, trained: Optional[set[str]],
                       lr: float = 0.01, trace: bool = False) -> dict:
    """One SGD training step of PyTorch eager, metered with `StorageMeter`.

    The model runs in eval mode (batch norm on running statistics, dropout off: what
    edgetrain compiles); parameters named in `trained` (all if None) require grad, the
    others do not; loss `F.cross_entropy`, then `torch.optim.SGD(lr).step()` and
    `zero_grad(set_to_none=True)`. The model is trained in place (the metered step and
    `REPEATS` timed ones); `requires_grad` flags are restored afterwards.

    Returns bytes: `activation_bytes` = peak of live non-weight storage during the step
    (input and labels held throughout, activations, saved tensors, gradients,
    temporaries); `trained_weights_bytes`; `peak_bytes` = their sum; `weights_bytes` (all
    parameters and buffers); plus `first_loss` (loss of the metered step, from the
    weights as given), `peak_op`, and `step_ms`, the median of `REPEATS` steps timed
    without the meter on one thread. With `trace=True` also `events` and `peak_live`
    (see StorageMeter).
    """
    model.eval()
    params = dict(model.named_parameters())
    trained = set(params) if trained is None else set(trained)
    unknown = trained - set(params)
    if unknown:
        raise KeyError(f"not parameters of the model: {sorted(unknown)}")
    was = {n: p.requires_grad for n, p in params.items()}
    for n, p in params.items():
        p.requires_grad_(n in trained)
        p.grad = None
    train_params = [params[n] for n in sorted(trained)]
    opt = torch.optim.SGD(train_params, lr=lr) if train_params else None
    weights = list(params.values()) + [b for _, b in model.named_buffers()]

    def step() -> float:
        loss = F.cross_entropy(model(x), y)
        if opt is not None:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        meter = StorageMeter(exclude=weights, hold=(x, y), trace=trace)
        with meter:
            first_loss = step()
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
        for n, p in params.items():
            p.requires_grad_(was[n])
    trained_bytes = storage_bytes(train_params)
    res = {"peak_bytes": meter.peak + trained_bytes, "activation_bytes": meter.peak,
           "weights_bytes": storage_bytes(weights), "trained_weights_bytes": trained_bytes,
           "step_ms": 1000 * statistics.median(times), "first_loss": first_loss, "peak_op": meter.peak_op,
           "held_bytes": meter.held, "leftover_bytes": meter.live - meter.held}
    if trace:
        res["events"], res["peak_live"] = meter.events, meter.peak_live
    return res
