"""Operator fusion for memory: an inverted-residual block's expansion and depthwise
convolutions as one op, so the expanded activation (the largest tensor of the forward
pass in MobileNetV2-like networks) is never stored.

`fuse_pointwise_depthwise` replaces a pair

    t = qconv2d(x, w1, b1)   dense (groups 1; 1x1 expansion, or e.g. a 3x3 first conv), int8 output
    y = qconv2d(t, w2, b2)   depthwise (groups == channels in == channels out), int8 output

by `y, scratch = qconv2d_pw_dw(x, w1, b1, w2, b2)` (ops/qfused.py) when t is read by that
depthwise conv only and is not a graph output: the fused node defines the same Value y,
so every reader of y stays valid. A layer whose backward reads t (a saved activation of
a trained layer, a saturation mask) leaves t with two or more readers and is not fused.

The fused node takes the depthwise node's place in the order. It reads x, w1 and b1
later than the pointwise node did, so a pair is skipped when a node between the two
overwrites one of those in place (an optimizer update); it reads w2 and b2 where the
depthwise node did, so in-place updates of those still come after it.
"""
from __future__ import annotations

from ..ir import Graph, Node, new_value
from ..memory.liveness import storage_roots
from ..ops import get_op
from ..ops.qfused import PW_DW_OP, fuse_attrs
from ..ops.qgradupdate import GRAD_UPDATE_OP, fusable
from ..ops.qgradupdate import fuse_attrs as fuse_grad_update_attrs

#: the int8 weight gradient and the update that qconv2d_grad_weight_update fuses
#: (ops/qgradupdate.py)
GRAD_WEIGHT_OP, UPDATE_OP = "qconv2d_grad_weight", "qsgd_update"


def _is_dense(n: Node) -> bool:
    """A dense int8 conv (any kernel, stride, padding): each output channel needs the
    whole input and nothing else, so it can be produced one channel at a time."""
    a = n.attrs
    return n.op == "qconv2d" and int(a["groups"]) == 1 and not a.get("float_out")


def _is_depthwise_of(d: Node, t) -> bool:
    if d.op != "qconv2d" or d.inputs[0] is not t or t in d.inputs[1:]:
        return False
    c, a = t.shape[1], d.attrs
    return int(a["groups"]) == c == d.out.shape[1] == d.inputs[1].shape[0] and not a.get("float_out")


def _overwritten_between(g: Graph, lo: int, hi: int, values, root) -> bool:
    """Whether a node strictly between positions lo and hi overwrites the storage of one
    of `values` in place."""
    roots = {root[v] for v in values}
    for n in g.nodes[lo + 1:hi]:
        opdef = get_op(n.op)
        if opdef.mutates and any(root[n.inputs[j]] in roots for _, j in opdef.shares if j < len(n.inputs)):
            return True
    return False


def _applies_gradient(u: Node, op: str, grad) -> bool:
    """Whether node u is an `op` update whose gradient operand (`OpDef.gradient_operand`) is `grad`."""
    return u.op == op and u.inputs[get_op(op).gradient_operand] is grad


def fuse_pointwise_depthwise(g: Graph) -> Graph:
    """`g` with every fusable pointwise -> depthwise qconv2d pair replaced by one
    `qconv2d_pw_dw` node at the depthwise node's position (see the module docstring)."""
    readers = g.consumers()
    position = {n: i for i, n in enumerate(g.nodes)}
    outputs = set(g.outputs)
    root = storage_roots(g)
    drop: set[Node] = set()
    fused: dict[Node, Node] = {}
    for i, n in enumerate(g.nodes):
        if n in drop or n in fused or not _is_dense(n):
            continue
        t = n.out
        users = readers.get(t, [])
        if t in outputs or len(users) != 1 or not _is_depthwise_of(users[0], t):
            continue
        d = users[0]
        x, w1, b1 = n.inputs
        if d in drop or _overwritten_between(g, i, position[d], (x, w1, b1), root):
            continue
        scratch_type = get_op(PW_DW_OP).infer([v.type for v in (x, w1, b1, *d.inputs[1:])],
                                              fuse_attrs(n.attrs, d.attrs))[1]
        fused[d] = Node(PW_DW_OP, (x, w1, b1, *d.inputs[1:]), (d.out, new_value(scratch_type)),
                        fuse_attrs(n.attrs, d.attrs))
        drop.update((n, d))
    if not fused:
        return g
    nodes = [fused.get(n, n) for n in g.nodes if n in fused or n not in drop]
    return g.replace(nodes=tuple(nodes))


def fuse_weight_grad_update(g: Graph) -> Graph:
    """`g` with each int8 convolution's weight gradient that only its `qsgd_update` reads
    fused with that update into `qconv2d_grad_weight_update` (ops/qgradupdate.py), placed
    where the update was: the gradient is then computed and applied one output channel
    at a time and never stored whole. The fused node reads the gradient's operands where
    the update ran, after every node between the two, none of which overwrites them (only
    updates write in place, and they write parameters)."""
    readers = g.consumers()
    outputs = set(g.outputs)
    drop: set[Node] = set()
    fused: dict[Node, Node] = {}
    for n in g.nodes:
        if n.op != GRAD_WEIGHT_OP:
            continue
        users = readers.get(n.out, [])
        if n.out in outputs or len(users) != 1 or not _applies_gradient(users[0], UPDATE_OP, n.out):
            continue
        u = users[0]
        x, gy = n.inputs
        if not fusable(n.attrs, x.shape[1]):
            continue
        w, _, step, *m = u.inputs
        scratch = get_op(GRAD_UPDATE_OP).infer([v.type for v in (x, gy, w, step, *m)],
                                               fuse_grad_update_attrs(n.attrs, u.attrs))[-1]
        fused[u] = Node(GRAD_UPDATE_OP, (x, gy, w, step, *m), (*u.outputs, new_value(scratch)),
                        fuse_grad_update_attrs(n.attrs, u.attrs))
        drop.add(n)
    if not fused:
        return g
    return g.replace(nodes=tuple(fused.get(n, n) for n in g.nodes if n not in drop))
