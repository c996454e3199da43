"""Forward batch-norm fusion: ``act(batch_norm(x))`` and ``act(batch_norm(x) + r)`` (a
residual block's end) as one `batch_norm_act` node (ops/bnact.py), which the C backend runs
as one pass over x (et_bn_act_fwd) instead of two or three, never storing the normalised
tensor or the sum.

A chain is found from each `batch_norm` node (on running statistics) whose output y
- is read by a ReLU or clamp only (the activation's input t = y), or
- is read by one `add` only, of y and a residual r of y's type, whose sum t is read by a
  ReLU or clamp (t = the sum),
and t's other readers are the activation's gradient masks: a clamp's `clamp_grad(g, t)`
(or a `batch_norm_backward_fused` whose saved operand is t) with the clamp's bounds, which
then read the fused node's output z instead (ops/bnact.py: the mask is the same). A ReLU's
gradient reads its output already, so a ReLU's t must have no other reader. Neither y nor
t may be a graph output.

The fused node defines the activation's output value, so every reader of z stays valid, and
takes the activation's place: its operands all exist there. It is skipped when a node between
the batch norm and the activation overwrites one of them in place (an optimizer update), or
when a mask reader of t stands before the activation. It runs on the gradient graph, before
the updates, so the training step and `gradients()` both run the fused node, on every backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir import Graph, Node
from ..memory.liveness import storage_roots
from ..ops import get_op
from ..ops.bnact import ACTS, BN_ACT_OP, CLAMP_ATTRS, fused_attrs
from ..ops.bnfused import BN_BACKWARD_OP


@dataclass(frozen=True)
class BNActChain:
    """The nodes one fused node replaces, and the mask readers that read its output instead."""

    bn: Node
    add: Optional[Node]
    act: Node
    residual: object  # the add's other operand (a Value), or None
    masks: tuple[Node, ...]

    def fused(self) -> Node:
        """The fused node: operands (x, mean, var[, w, b][, r]), output the activation's."""
        ins = tuple(self.bn.inputs) + ((self.residual,) if self.add is not None else ())
        attrs = fused_attrs(self.bn.attrs["eps"], len(self.bn.inputs) == 5, self.add is not None,
                            self.act.op, self.act.attrs)
        return Node(BN_ACT_OP, ins, self.act.outputs, attrs)


def _bounds(a) -> tuple:
    return tuple(a.get(k) for k in CLAMP_ATTRS)


def _is_mask_of(m: Node, act: Node, t) -> bool:
    """Whether m reads t only as a clamp mask with `act`'s bounds (so it may read z instead)."""
    if act.op != "clamp":
        return False
    if m.op == "clamp_grad":
        return m.inputs[1] is t and m.inputs[0] is not t and _bounds(m.attrs) == _bounds(act.attrs)
    if m.op == BN_BACKWARD_OP and m.attrs["mask"] == "clamp_grad" and _bounds(m.attrs) == _bounds(act.attrs):
        # the saved operand comes right after g, var[, w]; t must be nothing else
        at = 2 + bool(m.attrs["affine"])
        return m.inputs[at] is t and sum(v is t for v in m.inputs) == 1
    return False


def _valid_clamp(act: Node) -> bool:
    lo, hi = _bounds(act.attrs)
    return lo is None or hi is None or float(lo) < float(hi)


def find_chain(bn: Node, readers: dict, outputs: set) -> Optional[BNActChain]:
    """The chain from batch norm node `bn` (module docstring), or None."""
    y = bn.out
    if bn.op != "batch_norm" or y.dtype not in ("float32", "float64") or y in outputs:
        return None
    users = readers.get(y, [])
    add, r, t = None, None, y
    if len(users) == 1 and users[0].op == "add":
        add = users[0]
        a0, a1 = add.inputs
        r = a1 if a0 is y else a0
        if r is y or r.type != y.type or add.out.type != y.type:
            return None
        t = add.out
        if t in outputs:
            return None
    t_users = readers.get(t, [])
    acts = [u for u in t_users if u.op in ACTS and u.inputs[0] is t]
    if len(acts) != 1 or (acts[0].op == "clamp" and not _valid_clamp(acts[0])):
        return None
    act = acts[0]
    masks = tuple(u for u in t_users if u is not act)
    if not all(_is_mask_of(m, act, t) for m in masks):
        return None
    return BNActChain(bn, add, act, r, masks)


def _placeable(g: Graph, chain: BNActChain, position: dict, root: dict) -> bool:
    """Whether the fused node may stand at the activation's position and the masks read z."""
    at = position[chain.act]
    if any(position[m] < at for m in chain.masks):
        return False
    read = {root[v] for v in chain.fused().inputs}
    for n in g.nodes[position[chain.bn] + 1:at]:
        op = get_op(n.op)
        if op.mutates and any(root[n.inputs[j]] in read for _, j in op.shares if j < len(n.inputs)):
            return False
    return True


def _reading(m: Node, t, z) -> Node:
    """m with its operand t replaced by z."""
    return Node(m.op, tuple(z if v is t else v for v in m.inputs), m.outputs, m.attrs)


def fuse_bn_activation(g: Graph) -> Graph:
    """`g` with each batch norm -> [add ->] ReLU / clamp chain replaced by one `batch_norm_act`
    node at the activation's position (module docstring); `g` itself when none is found."""
    readers = g.consumers()
    position = {n: i for i, n in enumerate(g.nodes)}
    outputs = set(g.outputs)
    root = storage_roots(g)
    drop: set[Node] = set()
    swap: dict[Node, Node] = {}
    for n in g.nodes:
        if n.op != "batch_norm":
            continue
        chain = find_chain(n, readers, outputs)
        if chain is None or chain.act in swap or not _placeable(g, chain, position, root):
            continue  # (an add of two batch norms' outputs: the first one found takes it)
        t = chain.act.inputs[0]
        swap[chain.act] = chain.fused()
        for m in chain.masks:
            swap[m] = _reading(swap.get(m, m), t, chain.act.out)
        drop.update(x for x in (chain.bn, chain.add) if x is not None)
    if not swap:
        return g
    return g.replace(nodes=tuple(swap.get(n, n) for n in g.nodes if n not in drop))


__all__ = ["BNActChain", "find_chain", "fuse_bn_activation"]
