"""Core-aten -> IR converters of group and instance normalisation (they register into converters.CONVERTERS).

- nn.GroupNorm -> aten.native_group_norm: the group_norm op (ops/groupnorm.py).
- nn.InstanceNorm1d/2d without running statistics (or in train mode) -> x viewed as
  (1, N * C, ...), aten._native_batch_norm_legit.no_stats with the affine weight and bias
  repeated N times (aten.repeat): batch statistics of a batch of one, which is group_norm with
  one channel per group. Where that view and repeat are recognised, group_norm runs on the
  (N, C, ...) input with the module's own weight and bias (update schemes see them as a norm
  layer's); otherwise on the view, the repeated weight's gradient flowing back through the
  repeat (an expand and a reshape). A no_stats batch norm of a real batch
  (BatchNorm with track_running_stats=False) is batch_norm_train, as torch_backend gives it.
- InstanceNorm with running statistics in eval mode -> _native_batch_norm_legit_no_training
  with the statistics repeated: the existing batch_norm converter (aten_layers.py).
  _native_batch_norm_legit.default (running statistics passed, training False) is the same.
"""
from __future__ import annotations

from ..ir import Value
from ..ops import Emitter
from .aten_layers import convert_batch_norm
from .converters import CONVERTERS, aten, converts, unsupported


def _affine(e: Emitter, x: Value, w, b) -> tuple:
    """(w, b), (w,) or (): a missing weight beside a bias as ones (the op's operands are positional)."""
    if w is None and b is not None:
        w = e.emit("expand", e.const(1.0, x.dtype), shape=(x.shape[1],))
    return tuple(v for v in (w, b) if v is not None)


@converts(aten.native_group_norm.default)
def _group_norm(e, x, w, b, n, c, hw, groups, eps):
    y = e.emit("group_norm", x, *_affine(e, x, w, b), groups=int(groups), eps=float(eps))
    return y, None, None  # the saved mean and rstd: unused after the forward


@converts(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(e, x, w, b, training, momentum, eps):
    """Batch statistics without running ones: instance norm (a batch of one) as group_norm with
    one channel per group, a real batch as batch_norm_train."""
    if len(x.shape) < 2:
        unsupported(f"unsupported op aten._native_batch_norm_legit.no_stats of a rank-{len(x.shape)} input")
    if x.shape[0] == 1:
        whole = _instance_norm(e, x, w, b, eps)
        if whole is not None:
            return whole, None, None
        return _group_norm(e, x, w, b, 1, x.shape[1], 0, x.shape[1], eps)
    if (w is None) != (b is None):
        c = (x.shape[1],)
        w = w if w is not None else e.emit("expand", e.const(1.0, x.dtype), shape=c)
        b = b if b is not None else e.emit("expand", e.const(0.0, x.dtype), shape=c)
    affine = (w, b) if w is not None else ()
    return e.emit("batch_norm_train", x, *affine, eps=float(eps)), None, None


def _producer(e: Emitter, v: Value):
    """The node of `e` that computed v (None for a graph input)."""
    return next((n for n in reversed(e.nodes) if v in n.outputs), None)


def _unrepeated(e: Emitter, v, times: int, c: int):
    """The (c,) tensor that `_repeat` tiled `times` times into v (v itself when times is 1); None
    when v is no such tiling. Absent (None) stays absent."""
    if v is None or v.shape == (c,) and times == 1:
        return v, True
    r1 = _producer(e, v)
    ex = _producer(e, r1.inputs[0]) if r1 is not None and r1.op == "reshape" else None
    r0 = _producer(e, ex.inputs[0]) if ex is not None and ex.op == "expand" else None
    if r0 is None or r0.op != "reshape" or r0.inputs[0].shape != (c,) or ex.out.shape != (times, c):
        return None, False
    return r0.inputs[0], True


def _instance_norm(e: Emitter, x: Value, w, b, eps):
    """InstanceNorm as torch.export writes it (x = view(x0, (1, N * C, ...)), the affine repeated
    N times) as group_norm on x0 with one group per channel and the module's own weight and
    bias, viewed back as x: the same values, and the weight and bias stay the parameters an
    update scheme finds (trainable/layers.py). None when x and the affine are not that pattern."""
    view = _producer(e, x)
    if view is None or view.op != "reshape" or len(view.inputs[0].shape) != len(x.shape):
        return None
    x0 = view.inputs[0]
    n, c = x0.shape[:2]
    if n * c != x.shape[1] or x0.shape[2:] != x.shape[2:]:
        return None
    (w0, w_ok), (b0, b_ok) = _unrepeated(e, w, n, c), _unrepeated(e, b, n, c)
    if not (w_ok and b_ok):
        return None
    y = e.emit("group_norm", x0, *_affine(e, x0, w0, b0), groups=c, eps=float(eps))
    return e.emit("reshape", y, shape=x.shape)


@converts(aten._native_batch_norm_legit.default)
def _batch_norm_legit(e, x, w, b, running_mean, running_var, training, momentum, eps):
    """With running statistics: in eval mode (training False) normalised by them, as
    _native_batch_norm_legit_no_training; training mode would also update them in place."""
    if training:
        unsupported("unsupported op aten._native_batch_norm_legit with training=True (batch statistics that "
                    "update running statistics): capture the model in eval mode")
    return convert_batch_norm(e, x, w, b, running_mean, running_var, momentum, eps)


def _repeat(e: Emitter, x: Value, repeats) -> Value:
    """torch's x.repeat(r0, r1, ...): x tiled r_i times along each dim (leading new dims for
    extra repeats), as an expand of x with a size-r_i dim before each of its dims, then a reshape
    merging each pair; the expand's gradient sums the tiles back."""
    reps = [int(r) for r in repeats]
    if len(reps) < len(x.shape):
        raise ValueError(f"repeat: {len(reps)} repeats for a rank-{len(x.shape)} tensor")
    shape = (1,) * (len(reps) - len(x.shape)) + tuple(x.shape)
    if all(r == 1 for r in reps):
        return x if shape == x.shape else e.emit("reshape", x, shape=shape)
    pairs = tuple(d for s in shape for d in (1, s))
    tiled = tuple(d for r, s in zip(reps, shape) for d in (r, s))
    y = e.emit("expand", e.emit("reshape", x, shape=pairs), shape=tiled)
    return e.emit("reshape", y, shape=tuple(r * s for r, s in zip(reps, shape)))


CONVERTERS.setdefault(aten.repeat.default, _repeat)  # another family may already convert it
