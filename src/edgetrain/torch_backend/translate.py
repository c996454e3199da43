"""AOTAutograd's aten forward graph -> IR, with the frontend's converters (the ones
et.compile uses). The backward is not translated: edgetrain builds it from this forward
with its one autodiff (autodiff.build_backward), as et.compile does.

A few converters here see the raw arguments, for what functionalization and AOTAutograd's
decompositions leave in the graph; two kinds of placeholder stand for tensors our graphs
never materialize:

- `Transposed(v)`: aten.t of a matrix. `addmm(b, x, t(w))` becomes linear(x, w, b) (so
  update schemes find the layer), `t(t(v))` is v, and a returned t(w) is the weight itself:
  no transposed copy of a weight in memory.
- `Unused(what)`: a secondary output nobody reads (batch norm's saved statistics, layer
  norm's mean and rstd, max pooling's indices, nll_loss's total weight); reading it is an
  error.

Batch norm in training mode (`_native_batch_norm_legit_functional`, a model in train())
becomes batch_norm_train and the in-place batch_norm_update_stats of its running statistics,
whose results AOTAutograd's graph returns as the buffers' new values.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch._prims_common

from ..frontend.aten_layers import convert_batch_norm, convert_layer_norm, convert_max_pool
from ..frontend.capture import (TORCH_DTYPES, CaptureError, UnsupportedOpError, constant_value, evaluate, foldable,
                                source_line)
from ..frontend.converters import CONST_AWARE, CONVERTERS, LAYOUT_AWARE, Known, registrar
from ..ir import TensorType, Value, new_value
from ..ops import Emitter

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


@dataclass(frozen=True, eq=False)
class Draw:
    """A random tensor the graph reads (dropout's mask, stochastic depth's noise), drawn by
    torch at each call in the graph's order, as eager draws it, so that eager and compiled
    training draw the same numbers from the same generator; the training step reuses the
    call's draws."""

    value: Value
    draw: Callable[[], torch.Tensor]


#: hints for ops a training graph meets when the model is not ready for edgetrain
HINTS = {
    "native_dropout": "dropout in training mode: call model.eval() (dropout off)",
    "bernoulli": "random sampling (dropout in training mode?): call model.eval()",
    "copy_": "an in-place update of an input or buffer",
}

MARKER_AWARE: dict[Any, Callable] = {}  # converters taking the Translator and raw (unmaterialized) args


marker_aware = registrar(MARKER_AWARE)
#: random ops translated by a converter (the others become draws when their inputs allow)
RANDOM = (aten.native_dropout.default,)
#: allocations whose result depends on their first input's shape and dtype only
SHAPE_ONLY = (aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.new_empty.default,
              aten.new_empty_strided.default, aten.zeros_like.default, aten.ones_like.default,
              aten.full_like.default, aten.empty_like.default)
#: random ops that read their first input's shape and dtype only
RANDOM_SHAPE_ONLY = (aten.bernoulli.p, aten.rand_like.default, aten.randn_like.default)
#: marker-aware converters that take known tensors raw (as `Known`), as CONST_AWARE ones do
RAW_MARKER_AWARE = (aten._scaled_dot_product_flash_attention_for_cpu.default,)
#: random ops whose draw fills a tensor laid out as their input is (torch's CPU dropout draws its
#: mask into empty_like(x): memory order, so a transposed x gets its mask in another order)
STRIDED_RANDOM = (aten.native_dropout.default,)


class Translator:
    """Translates FX graphs into one emitter's node list; `env` maps FX node names to
    Values, markers, Python numbers or tuples of them.

    As at capture (frontend/capture.py), a node whose inputs are all `known` when the graph is
    translated (numbers, tensors built from shapes such as arange / zeros / full, the integer
    buffers the caller declares known: index tables) is evaluated once by torch and never
    reaches the graph; a converter that reads constants raw (CONST_AWARE: constant indices)
    gets them as `Known`, any other as a constant Value."""

    def __init__(self, random: bool = True):
        self.e = Emitter()
        self.env: dict[str, Any] = {}
        self.known: dict[str, Any] = {}  # FX node name -> its value computed at translation (tensor or number)
        self.random = random  # whether random ops (dropout in training mode) become per-call draws
        self.draws: list[Draw] = []  # in graph order
        self.constants: dict[Value, Any] = {}  # graph input -> the array of a constant a converter made
        self._transposed: dict[int, Value] = {}
        self.log_softmax_of: dict[Value, Value] = {}  # log_softmax(x, dim=1) -> x, for nll_loss
        # a view of such a log_softmax keeping its batch and class dims -> that log_softmax: F.cross_entropy
        # on (N, C, L) logits views them as (N, C, L, 1) for nll_loss2d
        self.log_softmax_views: dict[Value, Value] = {}
        self.labels: dict[Value, tuple[int, int]] = {}  # class labels read by a loss -> (classes, ignore_index)

    def value(self, x):
        """A Value for `x`, materializing a Transposed marker (once)."""
        if isinstance(x, Transposed):
            key = id(x.value)
            if key not in self._transposed:
                self._transposed[key] = self.e.emit("permute", x.value, perm=(1, 0))
            return self._transposed[key]
        if isinstance(x, Unused):
            raise CaptureError(f"{x.what} is not computed by edgetrain, but the graph reads it")
        if isinstance(x, (list, tuple)):
            return type(x)(self.value(v) for v in x)
        return x

    def constant(self, t: torch.Tensor) -> Value:
        """A graph input holding the tensor `t`, known when the graph is translated (the
        runtime feeds it with `constants`)."""
        a = t.detach().contiguous().numpy().copy()
        v = new_value(TensorType(tuple(a.shape), torch_dtype_name(t.dtype)), f"const:{len(self.constants)}")
        self.constants[v] = a
        return v

    def constant_of(self, t: torch.Tensor) -> Value:
        """A Value for a constant tensor: a broadcast scalar when it is one value repeated,
        else a graph input holding it (`constant`)."""
        return constant_value(self.e, t, self.constant)

    def _materialize(self, name: str, t) -> Value:
        """The Value of the known FX node `name` (made once)."""
        if name not in self.env:
            self.env[name] = self.constant_of(t)
        return self.env[name]

    def run(self, gm: torch.fx.GraphModule) -> list:
        """Translate the call_function nodes of `gm`'s graph (its placeholders bound in `env`
        beforehand; its constant tensors, get_attr nodes, known) and return its outputs
        (Values, markers, numbers or None)."""
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                if node.name not in self.env and node.name not in self.known:
                    raise CaptureError(f"placeholder {node.name} is not bound")
            elif node.op == "call_function" and self.random and _seeded(node) and node.target in RANDOM:
                self.env[node.name] = self._convert(node)
            elif node.op == "call_function" and self.random and _seeded(node) and self._shape_only(node, random=True):
                self.env[node.name] = self._draw(node)
            elif node.op == "call_function" and (foldable(node, self.known) or self._shape_only(node)):
                try:
                    self.known[node.name] = evaluate(node, {**self.known, **self._stand_ins(node)})
                except Exception as err:  # torch's own error on a constant subgraph
                    raise CaptureError(f"cannot evaluate the constant {node.target} at {where(node)}: "
                                       f"{type(err).__name__}: {err}") from err
            elif node.op == "call_function":
                self.env[node.name] = self._convert(node)
            elif node.op == "output":
                return [self._arg(a) for a in node.args[0]]
            elif node.op == "get_attr":  # a tensor the model made (torch.tensor([...]) in its forward)
                value = getattr(gm, node.target, None)
                if not isinstance(value, torch.Tensor) or value.dtype not in TORCH_DTYPES:
                    raise UnsupportedOpError(f"unsupported constant {node.target} in the graph (at {where(node)})")
                self.known[node.name] = value.detach().clone()
            else:
                raise UnsupportedOpError(f"unsupported FX node {node.op} {node.target}")
        raise CaptureError("the graph has no output node")

    def _draw(self, node) -> Value:
        """A random op whose inputs are known or read for their shapes only (bernoulli of an
        empty tensor, rand): a graph input torch fills at each call."""
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise CaptureError(f"random op {node.target} without a tensor result")
        stand_ins = self._stand_ins(node)
        return self.add_draw(TensorType(tuple(int(d) for d in val.shape), torch_dtype_name(val.dtype)),
                             lambda: evaluate(node, {**self.known, **stand_ins}))

    def add_draw(self, t: TensorType, draw: Callable[[], torch.Tensor]) -> Value:
        v = new_value(t, f"random:{len(self.draws)}")
        self.draws.append(Draw(v, draw))
        return v

    def _shape_only(self, node, random: bool = False) -> bool:
        """An allocation that reads only its first input's shape and dtype (x.new_zeros(...),
        zeros_like(x); with `random`, bernoulli(x, p), rand_like(x)), its other inputs known:
        independent of what x holds. A random op with every input known qualifies too."""
        if random and foldable_inputs(node, self.known):
            return True
        if node.target not in (RANDOM_SHAPE_ONLY if random else SHAPE_ONLY) or not node.args \
                or not isinstance(node.args[0], torch.fx.Node):
            return False
        rest = torch.fx.node.map_arg((node.args[1:], node.kwargs), lambda a: a)
        used = []
        torch.fx.node.map_arg(rest, lambda a: used.append(a))
        return isinstance(node.args[0].meta.get("val"), torch.Tensor) and all(a.name in self.known for a in used)

    def _stand_ins(self, node) -> dict:
        """For a SHAPE_ONLY node: zeros of its first input's shape and dtype, in its place."""
        if node.target not in SHAPE_ONLY + RANDOM_SHAPE_ONLY or not node.args or \
                not isinstance(node.args[0], torch.fx.Node) or node.args[0].name in self.known:
            return {}
        val = node.args[0].meta["val"]
        return {node.args[0].name: strided_zeros(tuple(int(d) for d in val.shape), tuple(int(d) for d in val.stride()),
                                                 val.dtype)}

    def _arg(self, a, raw: bool = False):
        """The translation of an FX argument; a known tensor as `Known` when `raw`."""
        if isinstance(a, torch.fx.Node):
            if a.name in self.known:
                k = self.known[a.name]
                if not isinstance(k, torch.Tensor):
                    return k
                if raw:
                    return Known(k, lambda t, name=a.name: self._materialize(name, t) if t is k
                                 else self.constant_of(t))
                return self._materialize(a.name, k)
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x, raw) for x in a)
        return a

    def _convert(self, node):
        raw = node.target in CONST_AWARE and node.target not in MARKER_AWARE or node.target in RAW_MARKER_AWARE
        args = self._arg(tuple(node.args), raw)
        kwargs = {k: self._arg(v, raw) for k, v in node.kwargs.items()}
        if node.target in LAYOUT_AWARE + STRIDED_RANDOM:  # the input's strides (AOTAutograd records them)
            val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
            if isinstance(val, torch.Tensor):
                kwargs["layout"] = (tuple(int(d) for d in val.stride()), int(val.storage_offset()))
        try:
            if node.target in MARKER_AWARE:
                return MARKER_AWARE[node.target](self, *args, **kwargs)
            fn = CONVERTERS.get(node.target)
            if fn is None:
                name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
                hint = HINTS.get(name)
                raise UnsupportedOpError(f"unsupported op {node.target}" + (f": {hint}" if hint else ""))
            kwargs = {k: self.value(v) for k, v in kwargs.items()}
            if node.target in CONST_AWARE:  # e.g. attention's causal mask, a tensor built from shapes
                kwargs["constant"] = self.constant_of
            return fn(self.e, *self.value(args), **kwargs)
        except UnsupportedOpError as err:
            raise UnsupportedOpError(f"{err} (at {where(node)})") from None
        except CaptureError as err:
            raise CaptureError(f"cannot translate {node.target} at {where(node)}: {err}") from None
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise CaptureError(f"cannot translate {node.target} at {where(node)}: "
                               f"{type(err).__name__}: {err}") from err


def strided_zeros(shape: tuple, stride: tuple, dtype) -> torch.Tensor:
    """Zeros of `shape` laid out with `stride` (a random op fills its result in memory order, as
    eager fills a tensor made like its input), contiguous where the strides are not dense."""
    t = torch.empty_strided(shape, stride, dtype=dtype)
    if t.numel() and not torch._prims_common.is_non_overlapping_and_dense_or_false(t):
        t = torch.empty(shape, dtype=dtype)
    return t.zero_()


def decompositions() -> dict:
    """The decompositions AOTAutograd applies while it traces: torch.export's core ATen table
    (what et.compile's capture sees) for the ops edgetrain has no converter for (aten.stack,
    aten.flip's relatives, ...: left whole by AOTAutograd's own tracing), so that an op
    converted under et.compile is converted here too. Random ops are never decomposed: their
    draws must stay the ones eager makes (a decomposed bernoulli draws other numbers), nor are
    the allocations the translator folds by shape. Computed at each compile, so converters
    registered since are honoured."""
    from torch._decomp import core_aten_decompositions

    keep = set(CONVERTERS) | set(MARKER_AWARE) | set(SHAPE_ONLY) | set(RANDOM_SHAPE_ONLY)
    return {op: fn for op, fn in core_aten_decompositions().items()
            if op not in keep and torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ())}


def _seeded(node) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def foldable_inputs(node, known: dict) -> bool:
    """Every FX input of `node` is known."""
    used = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: used.append(a))
    return all(a.name in known for a in used)


def where(node) -> str:
    """Where an FX node of a TorchDynamo graph comes from, as capture.provenance says it for
    et.compile: its model source line with the path of the submodule that made it, when the line
    does not name that module itself ('net.py:12: [features.4: Cummax] x = self.features(x)'),
    or else the module alone."""
    line = source_line(node)
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return line
    path, kind = list(stack.values())[-1]
    name = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1].strip("'>"))
    path = re.sub(r"^L\['[^']*'\]\.?|^L__self___", "", str(path))
    if line == "unknown source line":
        return f"module {path or 'the model'} ({name})"
    m = re.match(r"^(.*?:\d+): ?(.*)$", line)
    if not path or m is None or re.search(rf"(?<![\w.])self\.{re.escape(path)}(?!\w)", m.group(2)):
        return line  # the model's own forward, or a line that calls the module by its path
    return f"{m.group(1)}: [{path}: {name}] {m.group(2)}".rstrip()


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
    xv = t.value(x)
    out = CONVERTERS[aten.view.default](t.e, xv, shape)
    src = t.log_softmax_views.get(xv, xv)
    if src in t.log_softmax_of and tuple(out.shape[:2]) == tuple(src.shape[:2]):
        t.log_softmax_views[out] = src
    return out


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
    return t.e.emit("matmul", t.value(a), t.value(b))


# --- forward ops with secondary outputs nobody reads -------------------------------------------
@marker_aware(aten._native_batch_norm_legit_no_training.default)
def _bn_eval(t, *args):
    y = convert_batch_norm(t.e, *t.value(args))[0]
    return y, Unused("batch norm's saved mean"), Unused("batch norm's saved inverse std")


def _affine(e, x, w, b):
    """(w, b), both or neither (a missing one as ones or zeros)."""
    if w is None and b is None:
        return ()
    c = (x.shape[1],)
    w = w if w is not None else e.emit("expand", e.const(1.0, x.dtype), shape=c)
    b = b if b is not None else e.emit("expand", e.const(0.0, x.dtype), shape=c)
    return w, b


@marker_aware(aten._native_batch_norm_legit_functional.default)
def _bn_functional(t, x, w, b, running_mean, running_var, training, momentum, eps):
    """Batch norm with running statistics as a functional op: (y, saved mean, saved rstd, new
    running mean, new running var). In training mode the new statistics are the in-place
    update's results (the buffers' own storage), which the caller copies into the buffers."""
    x, w, b, mean, var = t.value((x, w, b, running_mean, running_var))
    saved = Unused("batch norm's saved mean"), Unused("batch norm's saved inverse std")
    if not training:
        return (convert_batch_norm(t.e, x, w, b, mean, var, momentum, eps)[0],) + saved + (mean, var)
    y = t.e.emit("batch_norm_train", x, *_affine(t.e, x, w, b), eps=float(eps))
    new_mean, new_var = t.e.emit_multi("batch_norm_update_stats", mean, var, x, momentum=float(momentum))
    return (y,) + saved + (new_mean, new_var)


@marker_aware(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(t, x, w, b, training, momentum, eps):
    """Batch norm without running statistics (track_running_stats=False): batch statistics."""
    x, w, b = t.value((x, w, b))
    y = t.e.emit("batch_norm_train", x, *_affine(t.e, x, w, b), eps=float(eps))
    return y, Unused("batch norm's saved mean"), Unused("batch norm's saved inverse std")


@marker_aware(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_cpu(t, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """The CPU kernel AOTAutograd lowers F.scaled_dot_product_attention to: the converter of
    aten.scaled_dot_product_attention (et.compile's), and its logsumexp unused."""
    fn = CONVERTERS.get(aten.scaled_dot_product_attention.default)
    if fn is None:
        unsupported("aten.scaled_dot_product_attention")
    q, k, v, attn_mask = t.value((q, k, v, attn_mask))
    y = fn(t.e, q, k, v, attn_mask, dropout_p, is_causal, scale, constant=t.constant_of)
    return y, Unused("attention's logsumexp")


@marker_aware(aten.native_layer_norm.default)
def _ln(t, x, shape, w, b, eps):
    y = convert_layer_norm(t.e, t.value(x), shape, t.value(w), t.value(b), eps)[0]
    return y, Unused("layer norm's mean"), Unused("layer norm's rstd")


@marker_aware(aten.max_pool2d_with_indices.default)
def _max_pool_fwd(t, x, *args):
    return convert_max_pool(t.e, t.value(x), *args)[0], Unused("max pooling's indices")


# --- dropout in training mode: its mask drawn by torch at each call ----------------------------
@marker_aware(aten.native_dropout.default)
def _native_dropout(t, x, p, train=None, layout=None):
    """(x * mask / (1 - p), mask): the mask as torch's CPU dropout draws it (bernoulli(1 - p)
    over a tensor of x's shape, dtype and strides: `layout`, as AOTAutograd recorded x), one
    draw per call."""
    x = t.value(x)
    if train is False or not p:
        return x, Unused("dropout's mask")
    if not t.random:
        unsupported(f"aten.native_dropout: {HINTS['native_dropout']}")
    if p >= 1:
        zero = t.e.emit("expand", t.e.const(0.0, x.dtype), shape=x.shape)
        return zero, Unused("dropout's mask")
    shape, dtype = tuple(x.shape), getattr(torch, x.dtype)
    stride = layout[0] if layout is not None else torch.empty(shape).stride()
    mask = t.add_draw(x.type, lambda: torch.ops.aten.native_dropout(strided_zeros(shape, stride, dtype), p, True)[1]
                      .to(dtype).contiguous())
    y = t.e.emit("mul", t.e.emit("mul", x, mask), t.e.const(1.0 / (1.0 - p), x.dtype))
    return y, Unused("dropout's mask")


def torch_dtype_name(dtype) -> str:
    if dtype not in TORCH_DTYPES:
        raise CaptureError(f"tensors of dtype {dtype} are not supported")
    return TORCH_DTYPES[dtype]
