"""build_backward: the reverse sweep, only toward the requested parameters.

Each node's VJP (from its OpDef) emits backward nodes; gradients reaching a value from
several uses are summed. What is wanted of each input's gradient is explicit
(`ops.Wanted`): `WHOLE`, or a `ChannelSelect` (a subset of a weight's channels), or None
(no gradient). VJPs that understand a ChannelSelect (conv2d, qconv2d) compute only those
channels; for any other use the full gradient is narrowed with index_select. Dead code
elimination afterwards removes whatever the requested gradients do not need.
"""
from __future__ import annotations

from typing import Mapping, Optional

from ..ir import FLOAT_DTYPES, Graph, TensorType, Value
from ..ops import WHOLE, ChannelSelect, Emitter, Wanted, get_op


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


def build_backward(g: Graph, loss: Optional[str], wrt: Mapping[str, Optional[Wanted]],
                   cotangents: Optional[Mapping[str, str]] = None) -> Graph:
    """Return `g` with the reverse sweep appended and one output `grad:<name>` per entry of
    `wrt` (graph input name -> what is wanted of its gradient: WHOLE, or a ChannelSelect;
    None, as update schemes write it, is WHOLE).

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
    wanted: dict[Value, Wanted] = {params[name]: WHOLE if w is None else w for name, w in wrt.items()}
    requires = _requires_grad(g, set(params.values())) & _contributes(g, set(grads))

    for node in reversed(g.nodes):
        out_grads = [grads.get(o) for o in node.outputs]
        if all(x is None for x in out_grads):
            continue
        needs: list[Optional[Wanted]] = [wanted.get(v, WHOLE) if v in requires else None for v in node.inputs]
        if all(w is None for w in needs):
            continue
        opdef = get_op(node.op)
        if opdef.vjp is None:
            raise NotDifferentiableError(f"op {node.op} has no gradient rule, but a trained parameter "
                                         f"depends on it")
        in_grads = opdef.vjp(e, node, out_grads, needs)
        for v, need, gv in zip(node.inputs, needs, in_grads):
            if need is None or gv is None:
                continue
            if isinstance(need, ChannelSelect) and gv.shape == v.shape:  # a full gradient for a selected input
                gv = e.emit("index_select", gv, dim=need.dim, index=need.index)
            grads[v] = e.add_grads(grads.get(v), gv)

    names, outs = list(g.output_names), list(g.outputs)
    for name, v in params.items():
        want = wanted[v].shape_of(v.shape) if isinstance(wanted[v], ChannelSelect) else v.shape
        gv = grads.get(v)
        if gv is None:  # the loss does not depend on this parameter: its gradient is zero
            gv = e.emit("expand", e.const(0.0, grad_dtype(v)), shape=want)
        names.append(grad_name(name))
        outs.append(gv)
    return g.replace(nodes=g.nodes + tuple(e.nodes), outputs=outs, output_names=names)
