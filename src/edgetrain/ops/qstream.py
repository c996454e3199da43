"""Row streaming: a chain of frozen int8 layers computed one output row at a time, so
only a few rows of each intermediate tensor are ever held (patch/row-based inference,
as in MCUNetV2, applied to the forward pass of frozen layers during training).

``qstream(x, *params; body) -> (y, scratch)`` is, by definition, the sub-graph `body`
(an immutable Graph whose inputs are x and the params and whose one output is y) run on
its inputs. Its nodes are `qconv2d` (int8 output; any kernel, stride, padding, groups)
and `qadd` (same-shape residual add): ops whose output row r depends on a window of
input rows.

The kernel computes y's rows in order, in bands of up to `rows` rows (the attribute ROWS,
1 when absent: passes/widen_scratch.py raises it where the step's peak has room, so each
kernel call computes more rows). To produce a band of a node it first makes sure the rows
of its inputs that the band reads exist, computing them on demand, recursively
(`row_plan`). Each intermediate tensor lives in a ring buffer of `capacity` rows: a row
is dropped once no consumer's next row needs it. The input x and the output y are whole
tensors; the ring buffers together are the op's second output, `scratch`, which nothing
reads, so liveness, the arena planner, the reorderer and the reference runtime count
them while (and only while) the op runs. Every row is computed once: no recomputation.

The reference below executes exactly that plan with numpy ring buffers of the planned
capacities (a capacity too small would overwrite a row still needed and change y, which
the tests compare bit for bit with the unstreamed layers). A conv row is the qconv2d
reference on the kernel-height band of input rows it reads, with out-of-range rows
filled with the input zero point (what zero padding of x - x_zero means).

Forward only: no vjp (the streaming pass runs after autodiff, on layers whose
intermediates no backward node reads).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..ir import Graph, Node, TensorType
from .base import Cost, OpDef, count_attr, get_op, register
from .qconv import qconv2d_ref
from .qelementwise import qadd_ref

STREAM_OP = "qstream"
ROW_OPS = ("qconv2d", "qadd")
#: the attribute giving the rows a kernel call computes (1 when absent)
ROWS = "rows"


def rows_of(a) -> int:
    """A qstream node's band height: its ROWS attribute, 1 when absent."""
    return count_attr(a, ROWS, 1, STREAM_OP)


def row_window(n: Node, operand: int, r: int, in_rows: int) -> tuple[int, int]:
    """Rows [lo, hi] (inclusive, clipped to the input) of operand `operand` of `n` that
    output row `r` reads."""
    if n.op == "qadd":
        return r, r
    kh = n.inputs[1].shape[2]
    sh, ph, dh = int(n.attrs["stride"][0]), int(n.attrs["padding"][0]), int(n.attrs["dilation"][0])
    lo = r * sh - ph
    return max(lo, 0), min(lo + dh * (kh - 1), in_rows - 1)


def _activation_operands(n: Node) -> tuple[int, ...]:
    return (0, 1) if n.op == "qadd" else (0,)


@dataclass(frozen=True)
class RowPlan:
    """The order in which a body's rows are computed and the ring capacities it needs."""

    steps: tuple[tuple[int, int, int], ...]  # (body node index, first output row, rows)
    capacity: tuple[int, ...]  # rows of each body node's output held at once (0: the body output)
    ring_bytes: int


@lru_cache(maxsize=256)
def row_plan(body: Graph, band: int = 1) -> RowPlan:
    """Demand-driven order of `body`'s bands of up to `band` rows (see the module docstring)
    and, for each intermediate, the largest number of its rows alive at once."""
    nodes = body.nodes
    producer = {n.out: i for i, n in enumerate(nodes)}
    consumers: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(nodes))}
    for i, n in enumerate(nodes):
        for j in _activation_operands(n):
            if n.inputs[j] in producer:
                consumers[producer[n.inputs[j]]].append((i, j))
    rows = [n.out.shape[2] for n in nodes]
    done = [0] * len(nodes)  # rows computed so far = the next row to compute
    capacity = [0] * len(nodes)
    steps: list[tuple[int, int, int]] = []

    def oldest_needed(i: int) -> int:
        """The lowest row of node i's output that a consumer still needs."""
        lows = [row_window(nodes[c], j, done[c], rows[i])[0] for c, j in consumers[i] if done[c] < rows[c]]
        return min(lows) if lows else done[i]

    def compute(i: int) -> None:
        n, r = nodes[i], done[i]
        last = min(r + band, rows[i]) - 1  # the band: rows r..last
        for j in _activation_operands(n):
            p = producer.get(n.inputs[j])
            if p is not None:
                hi = row_window(n, j, last, rows[p])[1]
                while done[p] <= hi:
                    compute(p)
        steps.append((i, r, last - r + 1))
        if consumers[i]:  # held rows: the oldest still needed up to the last one written
            capacity[i] = max(capacity[i], last - min(oldest_needed(i), r) + 1)
        done[i] = last + 1

    out = producer[body.outputs[0]]
    while done[out] < rows[out]:
        compute(out)
    capacity[out] = 0
    ring = sum(capacity[i] * nodes[i].out.type.nbytes // rows[i] for i in range(len(nodes)))
    return RowPlan(tuple(steps), tuple(capacity), ring)


def check_body(body: Graph) -> None:
    """Raise ValueError unless `body` is a streamable chain (see the module docstring)."""
    if len(body.outputs) != 1 or not body.nodes or body.nodes[-1].out is not body.outputs[0]:
        raise ValueError("qstream: the body must end in the node defining its one output")
    for n in body.nodes:
        if n.op not in ROW_OPS or n.op == "qconv2d" and n.attrs.get("float_out"):
            raise ValueError(f"qstream: {n.op} cannot be streamed by rows (only int8 qconv2d and qadd)")
        types = get_op(n.op).infer([v.type for v in n.inputs], n.attrs)
        if [t for t in types] != [o.type for o in n.outputs] or n.out.type.rank != 4:
            raise ValueError(f"qstream: body node {n.op} has inconsistent types")


def _infer(ts, a):
    body: Graph = a["body"]
    if [v.type for v in body.inputs] != list(ts):
        raise ValueError(f"qstream: operands {[str(t) for t in ts]} do not match the body's inputs "
                         f"{[str(v.type) for v in body.inputs]}")
    check_body(body)
    return [body.outputs[0].type, TensorType((row_plan(body, rows_of(a)).ring_bytes,), "int8")]


def _conv_row(n: Node, band: np.ndarray, w, b) -> np.ndarray:
    a = n.attrs
    one_row = {**a, "stride": (1, a["stride"][1]), "padding": (0, a["padding"][1]),
               "dilation": (1, a["dilation"][1])}
    return qconv2d_ref(band, w, b, one_row)


def qstream_ref(xs, a) -> tuple[np.ndarray, np.ndarray]:
    """(y, scratch): the body run row by row through ring buffers (see the module docstring).
    `scratch` is the ring buffers' bytes, laid end to end, as the last step left them."""
    body: Graph = a["body"]
    plan = row_plan(body, rows_of(a))
    env = dict(zip(body.inputs, xs))
    nodes = body.nodes
    producer = {n.out: i for i, n in enumerate(nodes)}
    y_node = len(nodes) - 1
    rings = {i: np.zeros(nodes[i].out.shape[:2] + (plan.capacity[i],) + nodes[i].out.shape[3:], np.int8)
             for i in range(len(nodes)) if i != y_node}
    y = np.empty(body.outputs[0].shape, np.int8)

    def row(v, k: int) -> np.ndarray:
        p = producer.get(v)
        if p is None:
            return env[v][:, :, k]
        return rings[p][:, :, k % plan.capacity[p]]

    for i, r in ((i, r) for i, first, count in plan.steps for r in range(first, first + count)):
        n = nodes[i]
        if n.op == "qadd":
            out = qadd_ref(row(n.inputs[0], r), row(n.inputs[1], r), n.attrs)
        else:
            x, w, b = n.inputs
            sh, ph, dh = (int(n.attrs[k][0]) for k in ("stride", "padding", "dilation"))
            kh, h = w.shape[2], x.shape[2]
            pad = np.full(x.shape[:2] + x.shape[3:], n.attrs["x_zero"], np.int8)
            taps = [r * sh - ph + dh * t for t in range(kh)]
            band = np.stack([row(x, k) if 0 <= k < h else pad for k in taps], axis=2)
            out = _conv_row(n, band, env[w], env[b])[:, :, 0]
        if i == y_node:
            y[:, :, r] = out
        else:
            rings[i][:, :, r % plan.capacity[i]] = out
    scratch = np.concatenate([rings[i].reshape(-1) for i in sorted(rings)] or [np.zeros(0, np.int8)])
    return y, scratch


def _cost(node) -> Cost:
    body: Graph = node.attrs["body"]
    macs = sum(get_op(n.op).cost(n).macs for n in body.nodes)
    return Cost(macs, sum(v.type.nbytes for v in node.inputs) + node.outputs[0].type.nbytes)


register(OpDef(STREAM_OP, _infer, lambda xs, a: list(qstream_ref(xs, a)), cost=_cost, num_inputs=(1, None)))

__all__ = ["ROWS", "ROW_OPS", "RowPlan", "STREAM_OP", "check_body", "qstream_ref", "row_plan", "row_window",
           "rows_of"]
