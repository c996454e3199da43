"""Core-aten -> IR converters of variances and norms: torch.var / std / var_mean (aten.var.correction,
with any correction: Bessel's 1 by default, 0 for unbiased=False) and torch.linalg.vector_norm of the
orders models use (2: F.normalize, 1, inf, -inf, 0, and any other p > 0).

- var(x; dims, correction) = sum((x - mean(x))^2) / max(0, N - correction) over the dims (two passes:
  the mean, then the squared deviations), N the number of elements reduced; std its square root.
  Its gradient through these ops is torch's 2 (x - mean) g / (N - correction) (the mean's own term
  is g times the deviations' sum, zero but for rounding).
- vector_norm: ord 2 sqrt(sum(x^2)), 1 sum(|x|), inf / -inf amax / amin of |x| (the gradient shared
  among ties, as torch's), 0 the count of nonzeros (no gradient), other p (sum(|x|^p))^(1/p)."""
from __future__ import annotations

import math

from ..ir import Value
from ..ops import Emitter
from .converters import aten, converts, unsupported


def _dims(x: Value, dim) -> tuple | None:
    return None if dim is None or len(dim) == 0 else tuple(int(d) % len(x.shape) for d in dim)


def _var(e: Emitter, x: Value, dim=None, correction=None, keepdim=False) -> tuple[Value, Value]:
    """(variance, mean) over dim, the mean kept with the reduced dims (1)."""
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in (dims if dims is not None else range(len(x.shape))))
    mean = e.emit("mean", x, dims=dims, keepdim=True)
    dev = e.emit("sub", x, mean)
    squares = e.emit("sum", e.emit("mul", dev, dev), dims=dims, keepdim=bool(keepdim))
    divisor = max(0.0, n - (1.0 if correction is None else float(correction)))
    return e.emit("div", squares, e.const(divisor, x.dtype)), mean


@converts(aten.var.correction)
def _variance(e, x, dim=None, *, correction=None, keepdim=False):
    return _var(e, x, dim, correction, keepdim)[0]


@converts(aten.std.correction)
def _std(e, x, dim=None, *, correction=None, keepdim=False):
    return e.emit("sqrt", _var(e, x, dim, correction, keepdim)[0])


@converts(aten.var_mean.correction)
def _var_mean(e, x, dim=None, *, correction=None, keepdim=False):
    var, mean = _var(e, x, dim, correction, keepdim)
    return var, mean if keepdim else e.emit("reshape", mean, shape=var.shape)


@converts(aten.linalg_vector_norm.default)
def _vector_norm(e, x, ord=2, dim=None, keepdim=False, dtype=None):
    p = float(ord)
    dims, keep = _dims(x, dim), bool(keepdim)
    if p == 2.0:
        return e.emit("sqrt", e.emit("sum", e.emit("mul", x, x), dims=dims, keepdim=keep))
    if p == 0.0:  # (a count: torch's gradient of it is zero, and a cast passes none)
        nonzero = e.emit("cast", e.emit("compare", x, e.const(0.0, x.dtype), cmp="ne"), dtype=x.dtype)
        return e.emit("sum", nonzero, dims=dims, keepdim=keep)
    size = e.emit("abs", x)
    if math.isinf(p):
        return e.emit("amax" if p > 0 else "amin", size, dims=dims, keepdim=keep)
    if p == 1.0:
        return e.emit("sum", size, dims=dims, keepdim=keep)
    if p < 0:
        unsupported(f"unsupported op aten.linalg_vector_norm with ord={ord} (a negative order)")
    total = e.emit("sum", e.emit("pow", size, exponent=p), dims=dims, keepdim=keep)
    return e.emit("pow", total, exponent=1.0 / p)
