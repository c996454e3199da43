"""Give each fused expansion + depthwise node (`qconv2d_pw_dw`, ops/qfused.py) as many
scratch channels as the training step's peak leaves room for.

The fusion holds one channel of the expansion at a time: the least memory, chosen for the
moment the step's memory peaks. Elsewhere in the step that costs speed for nothing: with one
channel of scratch a kernel computes one or two expansion channels per call, so it packs
the pointwise input again for every pair and sets up each depthwise channel for a few rows.
On the paper's int8 models the peak is in the backward pass, far from most fused nodes.

`widen_fused_scratch` takes the nodes in order and gives each the largest block of the
ladder c, c/2, c/4, ... (c its expansion channels) for which the planned peak (`peak`, the
arena plan of the whole step) stays at or below the step's peak with every block at one; a
candidate whose live bytes alone would pass the peak is not planned. The values and the
node order are unchanged: only the scratch values' types grow, so the result computes the
same integers (the reference loops over the blocks; every sum is exact).
"""
from __future__ import annotations

from typing import Callable

from ..ir import Graph, Node, new_value
from ..memory.liveness import lifetimes, live_bytes_timeline
from ..ops import get_op
from ..ops.qfused import BLOCK, PW_DW_OP, block_of


def _ladder(c: int) -> list[int]:
    """The blocks tried for c channels, largest first, above one."""
    out, b = [], c
    while b > 1:
        out.append(b)
        b //= 2
    return out


def _with_block(n: Node, block: int) -> Node:
    attrs = {**n.attrs, BLOCK: block}
    scratch_type = get_op(n.op).infer([v.type for v in n.inputs], attrs)[1]
    return Node(n.op, n.inputs, (n.outputs[0], new_value(scratch_type, n.outputs[1].name)), attrs)


def widen_fused_scratch(g: Graph, peak: Callable[[Graph], int], ram_inputs: set[str]) -> Graph:
    """`g` with each qconv2d_pw_dw node's scratch as wide as `peak(g)` (the planned peak in
    bytes) allows; `ram_inputs`: the graph inputs held in RAM (for the live-bytes screen)."""
    nodes = list(g.nodes)
    fused = [i for i, n in enumerate(nodes) if n.op == PW_DW_OP]
    if not fused:
        return g
    limit = peak(g)
    live = live_bytes_timeline(g, lifetimes(g, ram_inputs))
    for i in fused:
        n = nodes[i]
        c, now = n.inputs[1].shape[0], block_of(n.attrs, n.inputs[1].shape[0])
        plane = n.outputs[1].type.nbytes // now
        for b in _ladder(c):
            if b <= now:
                break
            if live[i] + (b - now) * plane > limit:
                continue
            trial = nodes[:i] + [_with_block(n, b)] + nodes[i + 1:]
            tg = g.replace(nodes=tuple(trial))
            if peak(tg) <= limit:
                nodes = trial
                live = live_bytes_timeline(tg, lifetimes(tg, ram_inputs))
                break
    return g.replace(nodes=tuple(nodes))
