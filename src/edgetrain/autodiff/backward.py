"""build_backward: the reverse sweep, only toward the requested parameters.

Each node's VJP (from its OpDef) emits backward nodes; gradients reaching a value from
several uses are summed. A parameter may ask for a subset of its channels
(`ChannelSelect`): VJPs that understand it (conv2d) compute only those channels, and for
any other use the full gradient is narrowed with index_select. Dead code elimination
afterwards removes whatever the requested gradients do not need.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from ..ir import FLOAT_DTYPES, Graph, TensorType, Value
from ..ops import Emitter, get_op


@dataclass(frozen=True)
class ChannelSelect:
    """Train only `index` (sorted positions) along weight dim `dim`."""

    dim: int
    index: tuple[int, ...]

    def __bool__(self) -> bool:  # a selection still means "this input needs a gradient"
        return True

    def shape_of(self, full: tuple[int, ...]) -> tuple[int, ...]:
        s = list(full)
        s[self.dim] = len(self.index)
        return tuple(s)

    def scatter(self, grad: np.ndarray, full: tuple[int, ...]) -> np.ndarray:
        """The selected channels' gradient `grad` placed into zeros of the whole shape `full`."""
        out = np.zeros(tuple(full), dtype=grad.dtype)
        idx = [slice(None)] * out.ndim
        idx[self.dim] = np.asarray(self.index, dtype=np.intp)
        out[tuple(idx)] = grad
        return out


#: integer dtypes of tensors that stand for real numbers (int8 activations and weights,
#: int32 biases), whose gradients are float32
QUANTIZED_DTYPES = ("int8", "int32")


class NotDifferentiableError(ValueError):
    pass


def grad_name(param: str) -> str:
    return f"grad:{param}"


def grad_dtype(v: Value) -> str:
    """The dtype of a gradient: a value's own float type; float32 for an int8 tensor, which
    stands for real values (quantized training)."""
    return v.dtype if v.dtype in FLOAT_DTYPES else "float32"


def _differentiable(v: Value, op: str) -> bool:
    return v.dtype in FLOAT_DTYPES or v.dtype in QUANTIZED_DTYPES and get_op(op).vjp is not None


def _requires_grad(g: Graph, wrt_values: set[Value]) -> set[Value]:
    """Values that depend on a requested input (forward reachability)."""
    req = set(wrt_values)
    for n in g.nodes:
        if any(v in req for v in n.inputs):
            req.update(o for o in n.outputs if _differentiable(o, n.op))
    return req


def _contributes(g: Graph, roots: set[Value]) -> set[Value]:
    """Values the roots (the loss, or the outputs given cotangents) depend on (backward reachability)."""
    need = set(roots)
    for n in reversed(g.nodes):
        if any(o in need for o in n.outputs):
            need.update(n.inputs)
    return need


def build_backward(g: Graph, loss: Optional[str], wrt: Mapping[str, Optional[ChannelSelect]],
                   cotangents: Optional[Mapping[str, str]] = None) -> Graph:
    """Return `g` with the reverse sweep appended and one output `grad:<name>` per entry of
    `wrt` (graph input name -> None for the whole tensor, or a ChannelSelect).

    The sweep starts from the scalar output `loss` (gradient 1), or, given `cotangents`
    (output name -> the name of a graph input holding that output's gradient), from those:
    a vector-Jacobian product, for a caller that owns the loss (torch autograd)."""
    e = Emitter()
    if cotangents:
        grads: dict[Value, Value] = {}
        for out, name in cotangents.items():
            v, t = g.output(out), g.input(name)
            if t.type != TensorType(v.shape, grad_dtype(v)):
                raise ValueError(f"the cotangent {name} of output {out} is {t.type}, not {v.shape} {grad_dtype(v)}")
            grads[v] = t
    else:
        loss_v = g.output(loss)
        if loss_v.type.shape != ():
            raise ValueError(f"the loss must be a scalar, got {loss_v.type}")
        grads = {loss_v: e.const(1.0, loss_v.dtype)}
    params = {name: g.input(name) for name in wrt}
    selects = {params[name]: sel for name, sel in wrt.items()}
    requires = _requires_grad(g, set(params.values())) & _contributes(g, set(grads))

    for node in reversed(g.nodes):
        out_grads = [grads.get(o) for o in node.outputs]
        if all(x is None for x in out_grads):
            continue
        needs = [selects.get(v) or True if v in requires else False for v in node.inputs]
        if not any(needs):
            continue
        opdef = get_op(node.op)
        if opdef.vjp is None:
            raise NotDifferentiableError(f"op {node.op} has no gradient rule, but a trained parameter "
                                         f"depends on it")
        in_grads = opdef.vjp(e, node, out_grads, needs)
        for v, need, gv in zip(node.inputs, needs, in_grads):
            if not need or gv is None:
                continue
            sel = selects.get(v)
            if sel is not None and gv.shape == v.shape:  # a full gradient for a selected input
                gv = e.emit("index_select", gv, dim=sel.dim, index=sel.index)
            grads[v] = e.add_grads(grads.get(v), gv)

    names, outs = list(g.output_names), list(g.outputs)
    for name, v in params.items():
        want = selects[v].shape_of(v.shape) if selects[v] is not None else v.shape
        gv = grads.get(v)
        if gv is None:  # the loss does not depend on this parameter: its gradient is zero
            gv = e.emit("expand", e.const(0.0, grad_dtype(v)), shape=want)
        names.append(grad_name(name))
        outs.append(gv)
    return g.replace(nodes=g.nodes + tuple(e.nodes), outputs=outs, output_names=names)
