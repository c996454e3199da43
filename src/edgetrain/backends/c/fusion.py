"""Emit-time fusion of the batch-norm backward: the activation's gradient mask (clamp_grad /
relu_grad), batch_norm_grad_weight, the bias gradient (sum over N, H, W) and
batch_norm_grad_input all read one gradient tensor; emitted as one pass per channel
(et_bn_backward_fused) at the position of the group's first node, instead of four passes.

A group is fused only when it is safe for the planned arena: the nodes scheduled between
the group's members must not write what the members read, and every output the fused
kernel now writes early must not share bytes with any storage live in between (other
than its own input read at the same index).

Why here and not a graph pass before memory planning: the fusion is a choice of the C kernels,
not of the program. Its legality is a fact about the planned arena (what the fused kernel writes
early must not overlap storage live in between), and as a graph pass its fused node would move
where the gradients are written: a different arena plan, different memory figures on every
backend, and an op the reference runtime would need too. `fuse_bn_backward(layout, key)` is the
one named step that decides it; emit.py writes what it returns."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...ir import Node
from ...memory.arena import align_up
from ...ops import get_op
from .layout import GraphLayout, Layout

#: how many nodes before batch_norm_grad_input the other members may sit
WINDOW = 8
MASK_OPS = ("clamp_grad", "relu_grad")


@dataclass(frozen=True)
class BNBackward:
    members: tuple  # node indices, ascending
    mask: Optional[Node]  # clamp_grad / relu_grad producing the gradient, or None
    grad_weight: Optional[Node]
    grad_bias: Optional[Node]
    grad_input: Node

    @property
    def first(self) -> int:
        return self.members[0]


def _is_channel_sum(n: Node) -> bool:
    x = n.inputs[0]
    dims = n.attrs.get("dims")
    if x.type.rank < 2 or not dims or n.attrs.get("keepdim", False):
        return False
    return tuple(sorted(d % x.type.rank for d in dims)) == (0,) + tuple(range(2, x.type.rank))


def fuse_bn_backward(layout: Layout, key: str) -> dict[int, BNBackward]:
    """The emit-time fusion pass of graph `key`: {first node index: group} of the batch-norm
    backward groups that the emitter writes as one et_bn_backward_fused call (at the group's
    first node; the other members are skipped). A group is left unfused when a member reads a
    weight stored split (the fused kernel reads whole tensors) or when the weight gradient's
    batch norm has another eps than the input gradient's."""
    gl = layout.graphs[key]
    states = layout.states

    def split(v) -> bool:
        r = gl.roots[v]
        return r in gl.graph.inputs and r.name in states and states[r.name].kind == "split"

    fused = {}
    for grp in find_bn_backward(gl):
        nodes = [gl.graph.nodes[i] for i in grp.members]
        if any(split(v) for m in nodes for v in m.inputs):
            continue
        if grp.grad_weight is not None and grp.grad_weight.attrs["eps"] != grp.grad_input.attrs["eps"]:
            continue
        fused[grp.first] = grp
    return fused


def find_bn_backward(gl: GraphLayout) -> list[BNBackward]:
    """The groups that are safe to fuse on the planned arena of one graph (module docstring)."""
    g = gl.graph
    nodes = g.nodes
    index = {id(n): i for i, n in enumerate(nodes)}
    consumers: dict = {}
    for n in nodes:
        for v in n.inputs:
            consumers.setdefault(v, []).append(n)
    producer = {o: n for n in nodes for o in n.outputs}
    outputs = set(g.outputs)
    groups, taken = [], set()
    for i, n in enumerate(nodes):
        if n.op != "batch_norm_grad_input" or n.inputs[0].dtype != "float32" or n.inputs[0].type.rank < 2:
            continue
        gv = n.inputs[0]
        users = consumers.get(gv, [])
        # the weight gradient of the same batch norm (one gradient may feed two: a residual's)
        gw = next((u for u in users if u.op == "batch_norm_grad_weight" and u.inputs[0] is gv
                   and u.inputs[3] is n.inputs[1]), None)
        gb = next((u for u in users if u.op == "sum" and _is_channel_sum(u)), None)
        if gw is None and gb is None:
            continue
        mask = producer.get(gv)
        others = [u for u in users if u not in (n, gw, gb)]
        if mask is None or mask.op not in MASK_OPS or others or gv in outputs:
            mask = None
        members = sorted(index[id(m)] for m in (mask, gw, gb, n) if m is not None)
        if members[0] < i - WINDOW or any(m in taken for m in members):
            continue
        grp = BNBackward(tuple(members), mask, gw, gb, n)
        if _safe(gl, grp, index, producer):
            groups.append(grp)
            taken.update(members)
    return groups


def _span(gl: GraphLayout, v):
    r = gl.roots[v]
    off = gl.offsets.get(r)
    if off is None:
        return None
    return off, off + align_up(r.type.nbytes)


def _safe(gl: GraphLayout, grp: BNBackward, index, producer) -> bool:
    nodes = gl.graph.nodes
    mem = set(grp.members)
    first, last = grp.members[0], grp.members[-1]
    member_nodes = [nodes[i] for i in grp.members]
    # every input exists at the group's first position
    for m in member_nodes:
        for v in m.inputs:
            p = producer.get(v)
            if p is not None and index[id(p)] >= first and index[id(p)] not in mem:
                return False
    # nodes in between must not overwrite what the members read
    read_roots = {gl.roots[v] for m in member_nodes for v in m.inputs}
    for j in range(first + 1, last):
        if j in mem:
            continue
        nj = nodes[j]
        op = get_op(nj.op)
        if op.mutates:
            for k, jj in op.shares:
                if jj < len(nj.inputs) and gl.roots[nj.inputs[jj]] in read_roots:
                    return False
    # the outputs written early must not overlap storages live meanwhile
    inputs = [v for m in member_nodes for v in m.inputs]
    in_spans = {gl.roots[v]: _span(gl, v) for v in inputs}
    mask_out = grp.mask.outputs[0] if grp.mask is not None else None
    for m in member_nodes:
        if m is grp.mask:
            continue
        start = index[id(m)]
        for o in m.outputs:
            span = _span(gl, o)
            if span is None:
                return False
            ro = gl.roots[o]
            for lt in gl.lifetimes:
                r = lt.root
                if r is ro or lt.end < first or lt.start > start:
                    continue
                if mask_out is not None and r is gl.roots[mask_out]:
                    continue  # the masked gradient is not stored by the fused kernel
                sp = gl.offsets.get(r)
                if sp is None:
                    continue
                lo, hi = sp, sp + align_up(r.type.nbytes)
                if hi <= span[0] or span[1] <= lo:
                    continue
                # same storage as the gradient input, read at the same index before the write
                if m is grp.grad_input and r in in_spans and (lo, hi) == span and r.type.nbytes == ro.type.nbytes \
                        and r is gl.roots[_grad_source(grp)]:
                    continue
                return False
    return True


def _grad_source(grp: BNBackward):
    """The tensor the fused kernel reads as the incoming gradient."""
    return grp.mask.inputs[0] if grp.mask is not None else grp.grad_input.inputs[0]
