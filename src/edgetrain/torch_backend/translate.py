"""AOTAutograd's aten graphs -> IR: the forward graph, and the backward graph's aten
backward ops mapped onto our gradient ops (convolution_backward -> conv2d_grad_input /
conv2d_grad_weight / sum, threshold_backward -> relu_grad, ...).

Forward ops go through frontend/aten.py's table. Two kinds of placeholder stand for
tensors our graphs never materialize:

- `Transposed(v)`: aten.t of a matrix. `addmm(b, x, t(w))` becomes linear(x, w, b) (so
  update schemes find the layer), `mm(t(g), x)` linear_grad_weight, `t(t(v))` is v, and a
  saved t(w) is the weight itself: no transposed copy of a weight in memory.
- `Unused(what)`: a secondary output that our backward ops recompute or never read (batch
  norm's saved statistics in eval mode, layer norm's mean and rstd, max pooling's
  indices). The forward hands AOTAutograd an empty placeholder for it; any use other than
  by the backward op that ignores it is an error.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch

from ..frontend.aten import CONVERTERS, registrar
from ..frontend.aten import _adaptive_avg as _adaptive_avg_fwd
from ..frontend.aten import _avg_pool, _bn, _layer_norm, _max_pool, _pair
from ..frontend.capture import TORCH_DTYPES, CaptureError, UnsupportedOpError, source_line
from ..ir import Value
from ..ops import Emitter
from ..ops.conv import _partial_weight_grad

aten = torch.ops.aten


@dataclass(frozen=True, eq=False)
class Transposed:
    value: Value  # a 2-D value, read transposed

    @property
    def shape(self):
        return self.value.shape[::-1]


@dataclass(frozen=True, eq=False)
class Unused:
    what: str
    info: Mapping[str, Any] = field(default_factory=dict)


#: hints for ops a training graph meets when the model is not ready for edgetrain
HINTS = {
    "_native_batch_norm_legit_functional": "batch norm in training mode (batch statistics): edgetrain trains "
    "batch norm on its running statistics, as on-device fine-tuning at batch 1 does; call model.eval() "
    "before the training loop",
    "_native_batch_norm_legit": "batch norm in training mode (batch statistics): call model.eval()",
    "native_dropout": "dropout in training mode: call model.eval() (dropout off)",
    "bernoulli": "random sampling (dropout in training mode?): call model.eval()",
    "copy_": "an in-place update of an input or buffer",
}

MARKER_AWARE: dict[Any, Callable] = {}  # converters taking the Translator and raw (unmaterialized) args


marker_aware = registrar(MARKER_AWARE)


class Translator:
    """Translates FX graphs into one emitter's node list; `env` maps FX node names to
    Values, markers, Python numbers or tuples of them."""

    def __init__(self, selects: Optional[Mapping[str, object]] = None):
        self.e = Emitter()
        self.env: dict[str, Any] = {}
        self.selects = dict(selects or {})  # weight name -> ChannelSelect (gradient of some channels only)
        self._transposed: dict[int, Value] = {}
        self.log_softmax_of: dict[Value, Value] = {}  # log_softmax(x, dim=1) -> x, for nll_loss
        self.labels: dict[Value, int] = {}  # class labels read by a loss -> the number of classes

    def value(self, x):
        """A Value for `x`, materializing a Transposed marker (once)."""
        if isinstance(x, Transposed):
            key = id(x.value)
            if key not in self._transposed:
                self._transposed[key] = self.e.emit("permute", x.value, perm=(1, 0))
            return self._transposed[key]
        if isinstance(x, Unused):
            raise CaptureError(f"{x.what} is not computed by edgetrain, but the graph reads it")
        if isinstance(x, NllGrad):
            raise UnsupportedOpError("unsupported use of aten.nll_loss_backward's result (edgetrain fuses it "
                                     "with the log_softmax backward into cross_entropy_grad)")
        if isinstance(x, (list, tuple)):
            return type(x)(self.value(v) for v in x)
        return x

    def run(self, graph: torch.fx.Graph) -> list:
        """Translate the call_function nodes of `graph` (its placeholders bound in `env`
        beforehand) and return its outputs (Values, markers, numbers or None)."""
        for node in graph.nodes:
            if node.op == "placeholder":
                if node.name not in self.env:
                    raise CaptureError(f"placeholder {node.name} is not bound")
            elif node.op == "call_function":
                self.env[node.name] = self._convert(node)
            elif node.op == "output":
                return [self._arg(a) for a in node.args[0]]
            elif node.op != "get_attr":
                raise UnsupportedOpError(f"unsupported FX node {node.op} {node.target}")
            else:
                raise UnsupportedOpError(f"unsupported constant tensor {node.target} in the graph "
                                         f"(at {where(node)})")
        raise CaptureError("the graph has no output node")

    def _arg(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return a

    def _convert(self, node):
        args = self._arg(tuple(node.args))
        kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
        try:
            if node.target in MARKER_AWARE:
                return MARKER_AWARE[node.target](self, *args, **kwargs)
            fn = CONVERTERS.get(node.target)
            if fn is None:
                name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
                hint = HINTS.get(name)
                raise UnsupportedOpError(f"unsupported op {node.target}" + (f": {hint}" if hint else ""))
            return fn(self.e, *self.value(args), **{k: self.value(v) for k, v in kwargs.items()})
        except UnsupportedOpError as err:
            raise UnsupportedOpError(f"{err} (at {where(node)})") from None
        except CaptureError as err:
            raise CaptureError(f"cannot translate {node.target} at {where(node)}: {err}") from None
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise CaptureError(f"cannot translate {node.target} at {where(node)}: "
                               f"{type(err).__name__}: {err}") from err


def where(node) -> str:
    """The model source line of an FX node, or else the module it belongs to."""
    line = source_line(node)
    stack = node.meta.get("nn_module_stack") or {}
    if line == "unknown source line" and stack:
        path, kind = list(stack.values())[-1]
        name = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1].strip("'>"))
        path = re.sub(r"^L\['[^']*'\]\.?|^L__self___", "", str(path)) or "the model"
        return f"module {path} ({name})"
    return line


def unsupported(what: str):
    raise UnsupportedOpError(f"unsupported op {what}")


# --- plumbing that keeps markers -------------------------------------------------------------
@marker_aware(operator.getitem)
def _getitem(t, xs, i):
    return xs[i]


@marker_aware(aten.detach.default, aten.alias.default, aten.clone.default, aten.lift_fresh_copy.default)
def _identity(t, x, *args, **kw):
    return x


def _swap(x):
    return x.value if isinstance(x, Transposed) else Transposed(x)


@marker_aware(aten.t.default)
def _t(t, x):
    return x if len(x.shape) < 2 else _swap(x)


@marker_aware(aten.transpose.int)
def _transpose(t, x, d0, d1):
    if len(x.shape) == 2 and {d0 % 2, d1 % 2} == {0, 1}:
        return _swap(x)
    return CONVERTERS[aten.transpose.int](t.e, t.value(x), d0, d1)


@marker_aware(aten.permute.default)
def _permute(t, x, perm):
    if len(perm) == 2 and tuple(p % 2 for p in perm) == (1, 0):
        return _swap(x)
    return CONVERTERS[aten.permute.default](t.e, t.value(x), perm)


@marker_aware(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(t, x, shape):
    if isinstance(x, Transposed) and tuple(int(d) for d in shape) == tuple(x.shape):
        return x
    return CONVERTERS[aten.view.default](t.e, t.value(x), shape)


@marker_aware(aten.addmm.default)
def _addmm(t, bias, a, b, beta=1, alpha=1):
    if (isinstance(b, Transposed) and isinstance(a, Value) and isinstance(bias, Value) and beta == 1
            and alpha == 1 and bias.shape == (b.value.shape[0],)):
        return t.e.emit("linear", a, b.value, bias)
    return CONVERTERS[aten.addmm.default](t.e, t.value(bias), t.value(a), t.value(b), beta, alpha)


@marker_aware(aten.mm.default)
def _mm(t, a, b):
    if isinstance(a, Value) and isinstance(b, Transposed):
        return t.e.emit("linear", a, b.value)  # a @ w.T
    if isinstance(a, Transposed) and isinstance(b, Value):
        return t.e.emit("linear_grad_weight", b, a.value)  # g.T @ x
    return t.e.emit("matmul", t.value(a), t.value(b))


# --- forward ops whose secondary outputs only the backward reads ------------------------------
@marker_aware(aten._native_batch_norm_legit_no_training.default)
def _bn_eval(t, *args):
    y = _bn(t.e, *t.value(args))[0]
    return y, Unused("batch norm's saved mean"), Unused("batch norm's saved inverse std")


@marker_aware(aten.native_layer_norm.default)
def _ln(t, x, shape, w, b, eps):
    y = _layer_norm(t.e, t.value(x), shape, t.value(w), t.value(b), eps)[0]
    return y, Unused("layer norm's mean", {"eps": float(eps)}), Unused("layer norm's rstd", {"eps": float(eps)})


@marker_aware(aten.max_pool2d_with_indices.default)
def _max_pool_fwd(t, x, *args):
    return _max_pool(t.e, t.value(x), *args)[0], Unused("max pooling's indices")


# --- backward ops -------------------------------------------------------------------------------
@marker_aware(aten.convolution_backward.default)
def _conv_backward(t, g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask):
    g, x, w = t.value((g, x, w))
    if transposed or len(x.shape) != 4:
        unsupported("aten.convolution_backward (transposed or not 2-d)")
    geo = {"stride": _pair(stride), "padding": _pair(padding), "dilation": _pair(dilation), "groups": int(groups)}
    e = t.e
    gx = e.emit("conv2d_grad_input", g, w, input_shape=x.shape, **geo) if mask[0] else None
    gw = None
    if mask[1]:
        sel = t.selects.get(w.name)
        gw = (_partial_weight_grad(e, x, w, g, geo, sel) if sel is not None and sel.dim in (0, 1)
              else e.emit("conv2d_grad_weight", x, g, weight_shape=w.shape, **geo))
    gb = e.emit("sum", g, dims=(0, 2, 3)) if mask[2] else None
    return gx, gw, gb


@marker_aware(aten.native_batch_norm_backward.default)
def _bn_backward(t, g, x, w, mean, var, save_mean, save_invstd, train, eps, mask):
    if train:
        unsupported(f"aten.native_batch_norm_backward in training mode: {HINTS['_native_batch_norm_legit']}")
    if mean is None or var is None:
        unsupported("batch norm without running statistics")
    g, x, w, mean, var = t.value((g, x, w, mean, var))
    e = t.e
    gx = e.emit("batch_norm_grad_input", g, var, *((w,) if w is not None else ()), eps=float(eps)) if mask[0] else None
    gw = e.emit("batch_norm_grad_weight", g, x, mean, var, eps=float(eps)) if mask[1] else None
    gb = e.emit("sum", g, dims=(0,) + tuple(range(2, len(g.shape)))) if mask[2] else None
    return gx, gw, gb


@marker_aware(aten.native_layer_norm_backward.default)
def _ln_backward(t, g, x, shape, mean, rstd, w, b, mask):
    if not isinstance(rstd, Unused) or "eps" not in rstd.info:
        unsupported("aten.native_layer_norm_backward of a layer norm not translated by edgetrain")
    g, x, w = t.value((g, x, w))
    attrs = {"normalized_shape": tuple(int(d) for d in shape), "eps": rstd.info["eps"]}
    e = t.e
    gx = e.emit("layer_norm_grad_input", g, x, *((w,) if w is not None else ()), **attrs) if mask[0] else None
    gw = e.emit("layer_norm_grad_weight", g, x, **attrs) if mask[1] and w is not None else None
    lead = tuple(range(len(x.shape) - len(attrs["normalized_shape"])))
    gb = (e.emit("sum", g, dims=lead) if lead else g) if mask[2] and b is not None else None
    return gx, gw, gb


@marker_aware(aten.threshold_backward.default)
def _threshold_backward(t, g, y, threshold):
    if threshold != 0:
        unsupported(f"aten.threshold_backward with threshold {threshold}")
    return t.e.emit("relu_grad", t.value(g), t.value(y))  # g * (y > 0): where(y <= 0, 0, g)


def _pointwise_backward(grad_op: str, **fixed):
    return lambda t, g, s: t.e.emit(grad_op, t.value(g), t.value(s), **fixed)


MARKER_AWARE[aten.tanh_backward.default] = _pointwise_backward("tanh_grad")
MARKER_AWARE[aten.sigmoid_backward.default] = _pointwise_backward("sigmoid_grad")


@marker_aware(aten.gelu_backward.default)
def _gelu_backward(t, g, x, approximate="none"):
    return t.e.emit("gelu_grad", t.value(g), t.value(x), approximate=approximate)


@marker_aware(aten.hardtanh_backward.default)
def _hardtanh_backward(t, g, x, min_val, max_val):
    return t.e.emit("clamp_grad", t.value(g), t.value(x), min=float(min_val), max=float(max_val))


@marker_aware(aten.silu_backward.default)
def _silu_backward(t, g, x):  # g * s * (1 + x * (1 - s)), s = sigmoid(x)
    g, x = t.value((g, x))
    e = t.e
    s = e.emit("sigmoid", x)
    one = e.const(1.0, x.dtype)
    return e.emit("mul", g, e.emit("mul", s, e.emit("add", one, e.emit("mul", x, e.emit("sub", one, s)))))


def _softmax_like(grad_op):
    def conv(t, g, y, dim, input_dtype):
        g, y = t.value((g, y))
        return t.e.emit(grad_op, g, y, dim=dim % len(y.shape))

    return conv


MARKER_AWARE[aten._softmax_backward_data.default] = _softmax_like("softmax_grad")


@marker_aware(aten.avg_pool2d_backward.default)
def _avg_pool_backward(t, g, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    g, x = t.value((g, x))
    scratch = Emitter()  # the forward converter's attributes, ceil_mode checked as there
    _avg_pool(scratch, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return t.e.emit("avg_pool2d_grad", g, input_shape=x.shape, **dict(scratch.nodes[-1].attrs))


@marker_aware(aten.max_pool2d_with_indices_backward.default)
def _max_pool_backward(t, g, x, kernel, stride, padding, dilation, ceil_mode, indices):
    g, x = t.value((g, x))  # our max_pool2d_grad finds each window's maximum again: indices unread
    scratch = Emitter()
    _max_pool(scratch, x, kernel, stride, padding, dilation, ceil_mode)
    return t.e.emit("max_pool2d_grad", g, x, **dict(scratch.nodes[-1].attrs))


@marker_aware(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_backward(t, g, x):
    g, x = t.value((g, x))
    scratch = Emitter()
    _adaptive_avg_fwd(scratch, x, g.shape[2:])
    n = scratch.nodes[-1]
    if n.op == "mean":
        scale = t.e.const(1.0 / (x.shape[2] * x.shape[3]), g.dtype)
        return t.e.emit("mul", t.e.emit("expand", g, shape=x.shape), scale)
    return t.e.emit("avg_pool2d_grad", g, input_shape=x.shape, **dict(n.attrs))


@marker_aware(aten.embedding_dense_backward.default)
def _embedding_backward(t, g, idx, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        unsupported("aten.embedding_dense_backward with scale_grad_by_freq=True")
    g, idx = t.value((g, idx))
    return t.e.emit("embedding_grad", g, idx, num_embeddings=int(num_weights), padding_idx=int(padding_idx))


@marker_aware(aten.slice_backward.default)
def _slice_backward(t, g, input_sizes, dim, start, end, step):
    g = t.value(g)
    shape = tuple(int(d) for d in input_sizes)
    dim = dim % len(shape)
    start, end, step = slice(start, end, step).indices(shape[dim])
    if (start, end, step) == (0, shape[dim], 1):
        return g
    return t.e.emit("slice_grad", g, input_shape=shape, dim=dim, start=start, end=end, step=step)


@marker_aware(aten.select_backward.default)
def _select_backward(t, g, input_sizes, dim, index):
    g = t.value(g)
    shape = tuple(int(d) for d in input_sizes)
    dim = dim % len(shape)
    index = index % shape[dim]
    kept = shape[:dim] + (1,) + shape[dim + 1:]
    g = t.e.emit("reshape", g, shape=kept)
    return t.e.emit("slice_grad", g, input_shape=shape, dim=dim, start=index, end=index + 1, step=1)


# --- losses inside the compiled region (torch.compile of a training step function) ---------------
@dataclass(frozen=True, eq=False)
class NllGrad:
    """nll_loss_backward's gradient w.r.t. the log-probabilities, awaiting the log_softmax
    backward that turns the pair into cross_entropy_grad."""

    grad: Value
    log_probs: Value
    labels: Value


@marker_aware(aten._log_softmax.default)
def _log_softmax(t, x, dim, half_to_float=False):
    x = t.value(x)
    y = t.e.emit("log_softmax", x, dim=dim % len(x.shape))
    if len(x.shape) == 2 and dim % 2 == 1:
        t.log_softmax_of[y] = x
    return y


def _check_nll(t, lp, labels, weight, reduction, ignore_index):
    if weight is not None or reduction != 1:
        unsupported("aten.nll_loss with class weights or without mean reduction; edgetrain's loss is "
                    "F.cross_entropy(logits, labels) with reduction='mean'")
    if len(lp.shape) != 2:
        unsupported(f"aten.nll_loss on a {len(lp.shape)}-d input; edgetrain's cross entropy takes (N, C) logits")
    t.labels[labels] = lp.shape[1]  # ignore_index cannot be honoured: labels are checked to lie in [0, C)


@marker_aware(aten.nll_loss_forward.default)
def _nll_loss(t, lp, labels, weight, reduction, ignore_index):
    lp, labels = t.value((lp, labels))
    _check_nll(t, lp, labels, weight, reduction, ignore_index)
    if lp not in t.log_softmax_of:
        unsupported("aten.nll_loss of values that are not a log_softmax over dim 1 (use F.cross_entropy)")
    loss = t.e.emit("cross_entropy", t.log_softmax_of[lp], labels)
    return loss, Unused("nll_loss's total weight")


@marker_aware(aten.nll_loss_backward.default)
def _nll_loss_backward(t, g, lp, labels, weight, reduction, ignore_index, total_weight):
    g, lp, labels = t.value((g, lp, labels))
    _check_nll(t, lp, labels, weight, reduction, ignore_index)
    return NllGrad(g, lp, labels)


@marker_aware(aten._log_softmax_backward_data.default)
def _log_softmax_backward(t, g, y, dim, input_dtype):
    y = t.value(y)
    if isinstance(g, NllGrad) and g.log_probs is y:  # softmax(log_softmax(x)) = softmax(x)
        return t.e.emit("cross_entropy_grad", g.grad, y, g.labels)
    if isinstance(g, NllGrad):
        unsupported("aten.nll_loss_backward not followed by the backward of its log_softmax")
    return t.e.emit("log_softmax_grad", t.value(g), y, dim=dim % len(y.shape))


@marker_aware(aten.mse_loss.default)
def _mse(t, x, target, reduction=1):
    if reduction != 1:
        unsupported("aten.mse_loss without mean reduction")
    return t.e.emit("mse", *t.value((x, target)))


@marker_aware(aten.mse_loss_backward.default)
def _mse_backward(t, g, x, target, reduction):
    if reduction != 1:
        unsupported("aten.mse_loss_backward without mean reduction")
    return t.e.emit("mse_grad", *t.value((g, x, target)))


def torch_dtype_name(dtype) -> str:
    if dtype not in TORCH_DTYPES:
        raise CaptureError(f"tensors of dtype {dtype} are not supported")
    return TORCH_DTYPES[dtype]
