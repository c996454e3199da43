"""Give the nodes that trade speed for memory through a scratch buffer as wide a scratch as
the training step's peak leaves room for.

Three int8 nodes hold a small part of a tensor at a time so that the tensor is never
stored: the fused expansion + depthwise pair (`qconv2d_pw_dw`, ops/qfused.py) one channel of
the expansion, the row-streamed chain (`qstream`, ops/qstream.py) a ring of a few rows of each
intermediate, computed one row a call, and the fused weight gradient and update
(`qconv2d_grad_weight_update`, ops/qgradupdate.py) one row of the gradient. That is the least
memory, chosen for the moment the step's memory peaks; elsewhere it costs speed for nothing:
a kernel call per channel pair or per row, each packing its inputs and setting up its
channels again, and a dense layer's input read again for every gradient row. On the paper's
int8 models the step peaks in the backward pass, far from most of these nodes.

`widen_scratch` takes the nodes in order and gives each the largest setting of its ladder
(a fused pair's `block`: c, c/2, c/4, ... of its c expansion channels; a stream's `rows`
per call: h, h/2, h/4, ... of its tallest intermediate's h rows, down to 2; a dense layer's
gradient `rows`: 4, then 2) for which the planned peak (`peak`: the arena plan of the whole
step) stays at or below the step's peak as it came (a screen on the live bytes spares most
plans: `widen_scratch`). The values
and the node order are unchanged: only the scratch values' types grow, so the result
computes the same integers (the references loop over the same blocks and rows; every sum
is exact).
"""
from __future__ import annotations

from typing import Callable, Optional

from ..ir import Graph, Node, new_value
from ..memory.liveness import lifetimes, live_bytes_timeline
from ..ops import get_op
from ..ops.qfused import BLOCK, PW_DW_OP, block_of
from ..ops.qgradupdate import GRAD_UPDATE_OP
from ..ops.qgradupdate import ROWS as GRAD_ROWS
from ..ops.qgradupdate import rows_of as grad_rows_of
from ..ops.qgradupdate import split_attrs as split_grad_update
from ..ops.qstream import ROWS, STREAM_OP, rows_of

#: the gradient rows a dense layer's fused weight-gradient update computes at once at most
#: (runtime/et_int8_grad.h's ET_GW_RB: more rows per block share nothing more)
GRAD_ROWS_MAX = 4


def _ladder(top: int) -> list[int]:
    """top, top // 2, top // 4, ... above one: the settings tried, largest first."""
    out, b = [], top
    while b > 1:
        out.append(b)
        b //= 2
    return out


def _setting(n: Node) -> Optional[tuple[str, int, int]]:
    """(attribute, its value now, the top of its ladder) of a node this pass widens, else None."""
    if n.op == PW_DW_OP:
        c = n.inputs[1].shape[0]
        return BLOCK, block_of(n.attrs, c), c
    if n.op == STREAM_OP:
        return ROWS, rows_of(n.attrs), max(v.out.shape[2] for v in n.attrs["body"].nodes)
    if n.op == GRAD_UPDATE_OP:
        gw, _ = split_grad_update(n.attrs)
        o = gw["weight_shape"][0]
        if int(gw["groups"]) != 1:  # a depthwise layer's rows read different channels: nothing shared
            return None
        return GRAD_ROWS, grad_rows_of(n.attrs, o), min(o, GRAD_ROWS_MAX)
    return None


def with_setting(n: Node, key: str, value: int) -> Node:
    """n with attribute `key` set to `value` and its scratch (its last output) retyped to match."""
    attrs = {**n.attrs, key: value}
    scratch_type = get_op(n.op).infer([v.type for v in n.inputs], attrs)[-1]
    return Node(n.op, n.inputs, n.outputs[:-1] + (new_value(scratch_type, n.outputs[-1].name),), attrs)


def widen_scratch(g: Graph, peak: Callable[[Graph], int], ram_inputs: set[str]) -> Graph:
    """`g` with the scratch of each node `_setting` names as wide as `peak(g)` (the planned peak in
    bytes) allows. A setting is planned only when the node's live bytes (`ram_inputs`: the graph
    inputs held in RAM) plus the growth stay within the peak: a cheap screen, which may pass over
    a setting that would fit where in-place results share storage the live count counts twice."""
    nodes = list(g.nodes)
    todo = [(i, s) for i, s in ((i, _setting(n)) for i, n in enumerate(nodes)) if s is not None]
    if not todo:
        return g
    limit = peak(g)
    live = live_bytes_timeline(g, lifetimes(g, ram_inputs))
    for i, (key, now, top) in todo:
        n = nodes[i]
        for value in _ladder(top):
            if value <= now:
                break
            wider = with_setting(n, key, value)
            if live[i] + wider.outputs[-1].type.nbytes - n.outputs[-1].type.nbytes > limit:
                continue
            trial = g.replace(nodes=tuple(nodes[:i] + [wider] + nodes[i + 1:]))
            if peak(trial) <= limit:
                nodes = list(trial.nodes)
                live = live_bytes_timeline(trial, lifetimes(trial, ram_inputs))
                break
    return g.replace(nodes=tuple(nodes))
