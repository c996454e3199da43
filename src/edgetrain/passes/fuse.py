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

from typing import Optional

from ..ir import Graph, Node, new_value
from ..memory.liveness import storage_roots
from ..ops import get_op
from ..ops.qfused import PW_DW_OP, fuse_attrs
from ..ops.qgradupdate import GRAD_UPDATE_OP, fusable
from ..ops.qgradupdate import fuse_attrs as fuse_grad_update_attrs
from ..ops.embedding_update import EMBEDDING_GRAD_UPDATE
from ..ops.embedding_update import fuse_attrs as fuse_embedding_attrs
from ..ops.gradupdate import FLOAT_GRAD_UPDATE, conv_block, linear_block
from ..ops.gradupdate import fuse_attrs as fuse_float_attrs

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


def _through_reshape(v, readers, outputs):
    """(the node reading v, the value it should read): v's only reader, or the only reader
    of a reshape that is v's only reader (an int8 linear's (o, k, 1, 1) gradient reshaped
    to its (o, k) weight); (None, None) when v is read otherwise or is a graph output."""
    users = readers.get(v, [])
    if v in outputs or len(users) != 1:
        return None, None
    u = users[0]
    if u.op == "reshape" and u.out.shape[:1] == v.shape[:1]:
        after = readers.get(u.out, [])
        if u.out in outputs or len(after) != 1:
            return None, None
        return after[0], u.out
    return u, v


def _fused_update(n: Node, u: Node, grad) -> Optional[Node]:
    """The fused node replacing gradient node n and its update u (which applies `grad`), or
    None when the pair is not fusable."""
    if n.op == GRAD_WEIGHT_OP and _applies_gradient(u, UPDATE_OP, grad):
        x, gy = n.inputs
        if not fusable(n.attrs, x.shape[1]):
            return None
        op, attrs, (w, _, step, *m) = GRAD_UPDATE_OP, fuse_grad_update_attrs(n.attrs, u.attrs), u.inputs
        args = (x, gy, w, step, *m)
    elif n.op in FLOAT_GRAD_UPDATE and grad is n.out and _applies_gradient(u, "sgd_update", grad):
        if u.attrs.get("index") is not None:  # a channel subset: its gradient is not the whole rows
            return None
        op, attrs = FLOAT_GRAD_UPDATE[n.op], fuse_float_attrs(n.attrs, u.attrs)
        groups = int(n.attrs.get("groups", 1))
        block = (conv_block(n.attrs["weight_shape"], groups) if n.op == "conv2d_grad_weight"
                 else linear_block(*n.out.shape))
        if block == (n.out.shape[0] if groups == 1 else groups):  # one block holds it all: nothing saved
            return None
        attrs["block"] = block
        w, _, *m = u.inputs
        args = (*n.inputs, w, *m)
    elif n.op == "embedding_grad" and grad is n.out and _applies_gradient(u, "sgd_update", grad):
        if u.attrs.get("index") is not None:
            return None
        op, attrs = EMBEDDING_GRAD_UPDATE, fuse_embedding_attrs(n.attrs, u.attrs)
        w, _, *m = u.inputs
        args = (*n.inputs, w, *m)
    else:
        return None
    scratch = get_op(op).infer([v.type for v in args], attrs)[len(u.outputs):]
    return Node(op, args, (*u.outputs, *(new_value(t) for t in scratch)), attrs)


def fuse_weight_grad_update(g: Graph) -> Graph:
    """`g` with each weight gradient that only its optimizer update reads fused with that
    update, placed where the update was, so the gradient is never stored whole:
    - int8 convolutions and linear layers (qconv2d_grad_weight, possibly reshaped to the
      weight's shape, + qsgd_update): `qconv2d_grad_weight_update` (ops/qgradupdate.py),
      one output channel at a time;
    - float convolutions and linear layers (+ sgd_update of the whole weight):
      `conv2d_grad_weight_update` / `linear_grad_weight_update` (ops/gradupdate.py), a
      block of output rows at a time (conv_block, linear_block), when the gradient is
      larger than one block (BLOCK_BYTES): a smaller one stays unfused, as fast as before;
    - embeddings (embedding_grad + sgd_update): `embedding_grad_update`
      (ops/embedding_update.py), the touched rows only.
    The fused node reads the gradient's operands where the update ran, after every node
    between the two, none of which overwrites them (only updates write in place, and they
    write parameters)."""
    readers = g.consumers()
    outputs = set(g.outputs)
    drop: set[Node] = set()
    fused: dict[Node, Node] = {}
    for n in g.nodes:
        if n.op != GRAD_WEIGHT_OP and n.op not in FLOAT_GRAD_UPDATE and n.op != "embedding_grad":
            continue
        u, grad = _through_reshape(n.out, readers, outputs)
        if u is None or u in fused:
            continue
        node = _fused_update(n, u, grad)
        if node is None:
            continue
        fused[u] = node
        drop.add(n)
        if grad is not n.out:
            drop.add(readers[n.out][0])  # the reshape
    if not fused:
        return g
    return g.replace(nodes=tuple(fused.get(n, n) for n in g.nodes if n not in drop))
