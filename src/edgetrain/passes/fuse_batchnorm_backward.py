"""Batch-norm backward fusion: the nodes autodiff emits for the backward of
``act(batch_norm(x, mean, var, w, b))`` as one `batch_norm_backward_fused` node (ops/bnfused.py),
which the C backend runs as one pass per channel (et_bn_backward_fused) instead of four.

A group is found around each `batch_norm_grad_input(g, var[, w])`:
- the weight gradient `batch_norm_grad_weight(g, x, mean, var)` of the same batch norm (same
  g, var and eps), and the bias gradient, a channel sum of g (`sum` over every dim but 1);
  at least one of the two (a frozen batch norm's input gradient alone is left as it is);
- the gradient mask `relu_grad` / `clamp_grad` (ops/bnfused.MASK_OPS) that produced g, when
  the group's nodes are g's only readers and g is not a graph output: the masked gradient
  is then never stored.

The fused node defines the members' output values, so every reader stays valid, and takes
the place of the group's first member. That is legal when each of its operands exists
there (a graph input, or an output of an earlier node) and no node between the first and
the last member overwrites one of their storages in place (an optimizer update of a weight
that a later member reads through a view): both are facts of the graph, so the pass runs
before memory planning and the planner plans the fused node's outputs (the input gradient
may share the incoming gradient's storage: `OpDef.inplace`).
It runs on the gradient graph, so the training step built from it (updates, reordering)
and `gradients()` both run the fused node, on every backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir import Graph, Node
from ..memory.liveness import storage_roots
from ..ops import get_op
from ..ops.bnfused import BN_BACKWARD_OP, MASK_OPS, fused_attrs

GRAD_INPUT_OP, GRAD_WEIGHT_OP = "batch_norm_grad_input", "batch_norm_grad_weight"


@dataclass(frozen=True)
class BNBackwardGroup:
    """The nodes of one batch norm's backward that one fused node replaces."""

    grad_input: Node
    grad_weight: Optional[Node]
    grad_bias: Optional[Node]
    mask: Optional[Node]

    @property
    def members(self) -> tuple[Node, ...]:
        return tuple(m for m in (self.mask, self.grad_input, self.grad_weight, self.grad_bias) if m is not None)

    def fused(self) -> Node:
        """The fused node: operands (g, var[, w][, saved][, x, mean]), outputs (gx[, gw][, gb])."""
        gi, gw, gb, mask = self.grad_input, self.grad_weight, self.grad_bias, self.mask
        g, var, *w = gi.inputs
        ins = [mask.inputs[0] if mask is not None else g, var, *w]
        ins += [mask.inputs[1]] if mask is not None else []
        ins += [gw.inputs[1], gw.inputs[2]] if gw is not None else []
        outs = [gi.out] + [m.out for m in (gw, gb) if m is not None]
        attrs = fused_attrs(mask, gi.attrs["eps"], bool(w), gw is not None, gb is not None)
        return Node(BN_BACKWARD_OP, tuple(ins), tuple(outs), attrs)


def _is_channel_sum(n: Node, g) -> bool:
    """Whether n sums g over every dim but the channel dim 1 (a batch norm's bias gradient)."""
    if n.op != "sum" or n.inputs[0] is not g or n.attrs.get("keepdim", False) or not n.attrs.get("dims"):
        return False
    rank = g.type.rank
    return tuple(sorted(d % rank for d in n.attrs["dims"])) == (0,) + tuple(range(2, rank))


def find_group(gi: Node, readers: dict, producers: dict, outputs: set, taken: set) -> Optional[BNBackwardGroup]:
    """The group around `gi` (a batch_norm_grad_input node), its nodes not in `taken`; None
    when it has neither a weight nor a bias gradient (module docstring)."""
    g, var = gi.inputs[:2]
    if g.dtype not in ("float32", "float64") or g.type.rank < 2:
        return None
    users = [u for u in readers.get(g, []) if u not in taken]
    gw = next((u for u in users if u.op == GRAD_WEIGHT_OP and u.inputs[0] is g and u.inputs[3] is var
               and u.attrs["eps"] == gi.attrs["eps"]), None)
    gb = next((u for u in users if _is_channel_sum(u, g)), None)
    if gw is None and gb is None:
        return None
    mask = producers.get(g)
    mine = {gi, gw, gb}
    if (mask is None or mask.op not in MASK_OPS or mask in taken or g in outputs
            or any(u not in mine for u in readers.get(g, []))):
        mask = None
    return BNBackwardGroup(gi, gw, gb, mask)


def _placeable(g: Graph, fused: Node, members: list, position: dict, producers: dict, root: dict) -> bool:
    """Whether `fused` may stand at the first member's position (module docstring)."""
    first, last = position[members[0]], position[members[-1]]
    for v in fused.inputs:
        p = producers.get(v)
        if p is not None and position[p] >= first:
            return False
    read = {root[v] for v in fused.inputs}
    inside = set(members)
    for n in g.nodes[first + 1:last]:
        op = get_op(n.op)
        if n not in inside and op.mutates and any(root[n.inputs[j]] in read for _, j in op.shares
                                                  if j < len(n.inputs)):
            return False
    return True


def fuse_batchnorm_backward(g: Graph) -> Graph:
    """`g` with each batch-norm backward group replaced by one `batch_norm_backward_fused`
    node at its first member's position (module docstring); `g` itself when none is found."""
    readers, producers = g.consumers(), g.producers()
    position = {n: i for i, n in enumerate(g.nodes)}
    outputs = set(g.outputs)
    root = storage_roots(g)
    taken: set[Node] = set()
    at: dict[Node, Node] = {}  # first member -> the fused node
    for n in g.nodes:
        if n.op != GRAD_INPUT_OP or n in taken:
            continue
        grp = find_group(n, readers, producers, outputs, taken)
        if grp is None:
            continue
        members = sorted(grp.members, key=position.__getitem__)
        fused = grp.fused()
        if _placeable(g, fused, members, position, producers, root):
            at[members[0]] = fused
            taken.update(members)
    if not at:
        return g
    return g.replace(nodes=tuple(at.get(n, n) for n in g.nodes if n in at or n not in taken))


__all__ = ["BNBackwardGroup", "find_group", "fuse_batchnorm_backward"]
