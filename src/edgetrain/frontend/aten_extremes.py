"""Core-aten -> IR converters of the largest and smallest elements: torch.amax / amin and torch.max
/ min over all elements (ops/reduce.py's amax and amin), x.max(dim) / x.min(dim) (values and
positions), torch.argmin, and torch.maximum / minimum of two tensors (ops/elementwise.py).

x.max(dim) is the argmax along dim (the first maximum, as torch's) and a gather of x at it, so its
gradient goes to that one element as torch's does; x.min(dim) and argmin take the argmax of -x,
whose first maximum is x's first minimum (negation is exact, and a NaN stays a NaN)."""
from __future__ import annotations

from ..ir import Value
from ..ops import Emitter
from .aten import binary_converter
from .converters import CONVERTERS, aten, converts


def _dims(dim) -> tuple | None:
    return tuple(int(d) for d in dim) if dim else None


for _op in ("amax", "amin"):
    CONVERTERS[getattr(aten, _op).default] = (
        lambda op: lambda e, x, dim=(), keepdim=False: e.emit(op, x, dims=_dims(dim), keepdim=bool(keepdim)))(_op)
CONVERTERS[aten.max.default] = lambda e, x: e.emit("amax", x, dims=None)
CONVERTERS[aten.min.default] = lambda e, x: e.emit("amin", x, dims=None)
for _op, _torch in (("maximum", "max"), ("minimum", "min")):
    CONVERTERS[getattr(aten, _op).default] = CONVERTERS[getattr(aten, _torch).other] = binary_converter(_op)


def _first_max(e: Emitter, x: Value, largest: bool, **dims) -> Value:
    return e.emit("argmax", x if largest else e.emit("neg", x), **dims)


def _along(largest: bool):
    def conv(e: Emitter, x: Value, dim: int, keepdim: bool = False):
        if not x.shape:  # a 0-d tensor along dim 0 or -1, as torch allows: itself, at position 0
            return x, e.const(0, "int64")
        at = _first_max(e, x, largest, dim=int(dim), keepdim=True)
        values = e.emit("gather", x, at, dim=int(dim))
        if not keepdim:
            kept = tuple(s for i, s in enumerate(x.shape) if i != int(dim) % len(x.shape))
            values, at = (e.emit("reshape", v, shape=kept) for v in (values, at))
        return values, at

    return conv


CONVERTERS[aten.max.dim] = _along(True)
CONVERTERS[aten.min.dim] = _along(False)


@converts(aten.argmin.default)
def _argmin(e: Emitter, x, dim=None, keepdim=False):
    return _first_max(e, x, False, dim=None if dim is None else int(dim), keepdim=bool(keepdim))


# --- topk and sort: positions (topk_indices, ops/compare.py) and a gather of x at them ---------------
def _picked(e: Emitter, x: Value, k: int, dim: int, largest: bool) -> tuple[Value, Value]:
    if not x.shape:  # a 0-d tensor: itself, at position 0
        return x, e.const(0, "int64")
    at = e.emit("topk_indices", x, k=int(k), dim=int(dim) % len(x.shape), largest=bool(largest))
    return e.emit("gather", x, at, dim=int(dim) % len(x.shape)), at


@converts(aten.topk.default)
def _topk(e: Emitter, x, k, dim=-1, largest=True, sorted=True):
    """torch.topk: the k largest (smallest) along dim, in order (sorted=False too: an order is a
    valid answer); equal values in the order of their positions, where torch's own order among
    them is unspecified (its gradient then goes to positions holding the same value)."""
    return _picked(e, x, k, dim, largest)


@converts(aten.sort.default)
def _sort(e: Emitter, x, dim=-1, descending=False):
    """torch.sort: a stable sort (equal values in the order of their positions), NaN the largest."""
    return _picked(e, x, x.shape[int(dim) % len(x.shape)] if x.shape else 1, dim, descending)


@converts(aten.sort.stable)
def _sort_stable(e: Emitter, x, *, stable=None, dim=-1, descending=False):
    return _sort(e, x, dim, descending)
