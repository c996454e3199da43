"""OpDef: every rule of one op in one record, and the registry of all of them.

An op's rules:
- ``infer(types, attrs) -> list[TensorType]``: the shape/dtype rule (also the verifier's).
- ``ref(arrays, attrs) -> list[np.ndarray]``: the numpy reference semantics (the living spec).
- ``vjp(e, node, grads, needs) -> list[Value | None]``: emits backward nodes through the
  emitter ``e``; ``grads`` are the cotangents of the node's outputs (None = zero), ``needs[i]``
  says which part of input i's gradient is wanted: None (none), ``WHOLE``, or a
  ``ChannelSelect`` (some channels of a weight; a VJP that cannot compute those alone returns
  the whole gradient and autodiff narrows it). ``None`` as vjp means the op is not differentiable.
- ``cost(node) -> Cost``: multiply-accumulates and bytes touched.
- ``shares``: (output, input) index pairs whose storage is one: a view (reshape) or an
  in-place result; such an output costs no new memory.
- ``mutates``: the op overwrites the inputs named in ``shares`` (in-place update), so
  nothing may read those inputs after it.
- ``io``: "out" for an op that writes its other inputs to secondary storage (flash / SD),
  "in" for one whose outputs are read back from it (ops/page.py); runtimes count those
  bytes as page traffic.

Facts that passes look up instead of keeping their own tables of op names:
- ``tags``: the classes an op belongs to (the ``*_TAG`` constants below, as Thunder's OpTags);
- ``params``: where a layer's trained weight and bias sit among its operands (trainable/layers.py);
- ``int8``: how quantize/convert.py lowers the float op to int8 (``Int8Rule``);
- ``stream_operands``: the activation operands a row-streamed chain passes row by row
  (passes/stream.py); empty: the op is never streamed;
- ``gradient_operand``: for an optimizer update, the operand holding the gradient it applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from ..ir import Node, TensorType, Value


@dataclass(frozen=True)
class Cost:
    macs: int
    bytes: int


def default_cost(node: Node) -> Cost:
    """Elementwise: one operation per output element; every operand read or written once."""
    touched = sum(v.type.nbytes for v in node.inputs) + sum(v.type.nbytes for v in node.outputs)
    return Cost(macs=sum(v.type.numel for v in node.outputs), bytes=touched)


def zero_mac_cost(node: Node) -> Cost:
    """Data movement only (shape ops)."""
    return Cost(macs=0, bytes=default_cost(node).bytes)


@dataclass(frozen=True)
class Whole:
    """The whole gradient of a tensor is wanted."""


WHOLE = Whole()


@dataclass(frozen=True)
class ChannelSelect:
    """Only positions `index` (sorted) along weight dim `dim` of the gradient are wanted."""

    dim: int
    index: tuple[int, ...]

    def shape_of(self, full: tuple[int, ...]) -> tuple[int, ...]:
        s = list(full)
        s[self.dim] = len(self.index)
        return tuple(s)

    def scatter(self, grad: np.ndarray, full: tuple[int, ...]) -> np.ndarray:
        """The selected channels' gradient `grad` placed into zeros of the whole shape `full`."""
        out = np.zeros(tuple(full), dtype=grad.dtype)
        idx: list[Any] = [slice(None)] * out.ndim
        idx[self.dim] = np.asarray(self.index, dtype=np.intp)
        out[tuple(idx)] = grad
        return out


#: which part of a gradient is wanted (`needs[i]` of a VJP is a Wanted, or None for none)
Wanted = Union[Whole, ChannelSelect]

# --- tags: classes of ops that passes treat alike -----------------------------------------
#: an op with a trained weight operand, the unit update schemes name (conv2d, linear,
#: embedding); `params` says where the weight and bias sit
LAYER_TAG = "layer"
#: a normalisation whose affine weight and bias are parameters (batch_norm, layer_norm)
NORM_TAG = "norm"
#: the output is on its input's int8 scale and zero point (pooling, ReLU / clamp, global
#: mean, views): quantize/convert.py runs it on the int8 data
SAME_SCALE_TAG = "same_scale"
#: a clamp-like activation an int8 layer before it takes over as its output clamp
ACTIVATION_TAG = "activation"
#: an activation's gradient mask, g * (input in range) (relu_grad, clamp_grad)
GRAD_MASK_TAG = "grad_mask"
#: an optimizer update, overwriting a parameter in place; `gradient_operand` names the gradient
UPDATE_TAG = "update"
TAGS = (LAYER_TAG, NORM_TAG, SAME_SCALE_TAG, ACTIVATION_TAG, GRAD_MASK_TAG, UPDATE_TAG)


@dataclass(frozen=True)
class ParamOperands:
    """Where a layer's trained parameters sit among its operands."""

    kind: str  # the layer kind update schemes use: "conv", "linear", "embedding", "norm"
    weight: int
    bias: Optional[int] = None


def _always(node: Node) -> bool:
    return True


#: the kinds of int8 lowering (quantize/convert.py): "qconv" a layer with constant weights
#: -> qconv2d with requantized output; "qadd" / "qcat" two or more int8 tensors -> one
#: int8 result on its own scale; "same" an op run on int8 data on its input's scale
INT8_KINDS = ("qconv", "qadd", "qcat", "same")


@dataclass(frozen=True)
class Int8Rule:
    """How quantize/convert.py lowers this float op to int8: as `kind` (INT8_KINDS), into
    the int8 op `op`, for the nodes `applies` accepts (the others stay float32)."""

    kind: str
    op: str
    applies: Callable[[Node], bool] = _always

    def __post_init__(self):
        if self.kind not in INT8_KINDS:
            raise ValueError(f"int8 kind {self.kind!r} is not one of {INT8_KINDS}")


InferFn = Callable[[Sequence[TensorType], Mapping[str, Any]], list]
RefFn = Callable[[Sequence[np.ndarray], Mapping[str, Any]], list]
VjpFn = Callable[["Emitter", Node, Sequence[Optional[Value]], Sequence[Optional[Wanted]]], list]


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: InferFn
    ref: RefFn
    vjp: Optional[VjpFn] = None
    cost: Callable[[Node], Cost] = default_cost
    shares: tuple[tuple[int, int], ...] = ()
    mutates: bool = False
    num_inputs: Optional[tuple[int, Optional[int]]] = None  # (min, max) operand count (max None: no most), None = any
    #: (output k, input j): an elementwise op whose output k may be written over input j's
    #: storage when input j is read by nobody after this node and has output k's type (the
    #: arena planner then gives both one offset: in-place reuse; the op itself is unchanged)
    inplace: tuple[tuple[int, int], ...] = ()
    #: "out": the inputs not named in `shares` are written to secondary storage; "in": the
    #: outputs are read from it; None: no page traffic
    io: Optional[str] = None
    #: the classes this op belongs to (TAGS)
    tags: AbstractSet[str] = frozenset()  # stored as a frozenset
    #: a layer's or norm's trained operands (LAYER_TAG / NORM_TAG ops)
    params: Optional[ParamOperands] = None
    #: the int8 lowering of a float op, None: it stays float32 in an int8 graph
    int8: Optional[Int8Rule] = None
    #: operands a row-streamed chain (passes/stream.py) feeds row by row; () = never streamed
    stream_operands: tuple[int, ...] = ()
    #: an optimizer update's operand holding the gradient it applies (UPDATE_TAG ops)
    gradient_operand: Optional[int] = None

    def __post_init__(self):
        unknown = set(self.tags) - set(TAGS)
        if unknown:
            raise ValueError(f"op {self.name}: unknown tags {sorted(unknown)}")
        object.__setattr__(self, "tags", frozenset(self.tags))

    def has(self, tag: str) -> bool:
        return tag in self.tags


OPS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in OPS:
        raise ValueError(f"op {opdef.name!r} registered twice")
    OPS[opdef.name] = opdef
    return opdef


def ops_tagged(tag: str) -> tuple[str, ...]:
    """Names of the registered ops carrying `tag`, in registration order."""
    return tuple(name for name, d in OPS.items() if tag in d.tags)


def out_grad(g: Sequence[Optional[Value]]) -> Value:
    """A single-output op's gradient, in its VJP (the backward calls a VJP only when one of
    the node's outputs has a gradient)."""
    if g[0] is None:
        raise ValueError("a single-output op's VJP called without its output's gradient")
    return g[0]


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


class Emitter:
    """Builds nodes in order; output types come from each op's shape rule."""

    def __init__(self):
        self.nodes: list[Node] = []

    def emit(self, op: str, *inputs: Value, name: str = "", **attrs) -> Value:
        """Emit a single-output node and return its output value."""
        outs = self.emit_multi(op, *inputs, names=(name,), **attrs)
        if len(outs) != 1:
            raise ValueError(f"{op} has {len(outs)} outputs; use emit_multi")
        return outs[0]

    def emit_multi(self, op: str, *inputs: Value, names: Sequence[str] = (), **attrs) -> tuple[Value, ...]:
        from ..ir import new_value

        opdef = get_op(op)
        types = opdef.infer([v.type for v in inputs], attrs)
        names = list(names) + [""] * (len(types) - len(names))
        outs = tuple(new_value(t, n) for t, n in zip(types, names))
        self.nodes.append(Node(op, inputs, outs, attrs))
        return outs

    # conveniences used by VJPs -------------------------------------------------------
    def const(self, value: float, dtype: str) -> Value:
        return self.emit("const", value=float(value), dtype=dtype)

    def sum_to(self, g: Value, shape: tuple[int, ...]) -> Value:
        """Reduce a broadcast gradient back to `shape` (no node when already equal)."""
        return g if tuple(g.shape) == tuple(shape) else self.emit("sum_to", g, shape=tuple(shape))

    def add_grads(self, a: Optional[Value], b: Optional[Value]) -> Optional[Value]:
        if a is None:
            return b
        if b is None:
            return a
        return self.emit("add", a, b)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError(f"shapes {list(shapes)} do not broadcast") from None


def same_dtype(types: Sequence[TensorType], op: str) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ValueError(f"{op}: operands have different dtypes {sorted(dtypes)}")
    return types[0].dtype


def norm_dim(d: int, rank: int) -> int:
    if not -rank <= d < max(rank, 1):
        raise ValueError(f"dim {d} out of range for rank {rank}")
    return d % max(rank, 1)


def count_attr(a: Mapping[str, Any], key: str, default: int, op: str) -> int:
    """Attribute `key` of an `op` node, a count of at least 1 (`default` when absent): the
    scratch settings (a block's channels, a band's rows) that passes/widen_scratch.py sets."""
    value = int(a.get(key, default))
    if value < 1:
        raise ValueError(f"{op}: {key} must be at least 1, got {value}")
    return value


def prefix_attrs(parts: Mapping[str, Mapping[str, Any]]) -> dict:
    """A fused node's attributes: each part's under its prefix ({prefix: attrs}), so every
    value stays a scalar or a tuple (the IR freezes lists only; a nested dict would stay
    mutable) and prints one key at a time."""
    return {prefix + k: v for prefix, attrs in parts.items() for k, v in attrs.items()}


def unprefix_attrs(a: Mapping[str, Any], *prefixes: str) -> tuple[dict, ...]:
    """The parts of `prefix_attrs`' result, one dict per prefix: its inverse."""
    return tuple({k[len(p):]: v for k, v in a.items() if k.startswith(p)} for p in prefixes)
