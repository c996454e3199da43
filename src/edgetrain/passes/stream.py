"""Row streaming of frozen forward chains: replace a chain of frozen int8 layers by one
`qstream` node (ops/qstream.py) wherever that lowers the forward pass's peak.

The forward pass of a frozen prefix is a chain of *cut values*: activations that are, at
the point they are produced, the only activation any later node still needs (a
network's input, the output of each block). Between two cuts a and b, the layers either
run as they are (the segment's peak is what its nodes hold at once) or as one streamed
node holding a, b and a few rows of each intermediate (`row_plan`). A chain can be
streamed when its nodes are ops that declare which of their operands stream row by row
(`OpDef.stream_operands`: int8 convolutions, fused expansion+depthwise pairs, residual
adds) with an int8 4-D output, its intermediates are read by nothing outside it (no saved activation, no
saturation mask, no graph output) and none of its weights is updated.

The choice of segments is exact: a dynamic program over the cuts minimises the largest
segment peak, then, at that peak, the number of streamed nodes (streaming costs the
kernel some bookkeeping; layers that are not at the peak stay as they are).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from ..ir import Graph, Node, Role, Value, new_value
from ..memory.liveness import storage_roots
from ..ops import get_op
from ..ops.qfused import PW_DW_OP, split_attrs
from ..ops.qstream import STREAM_OP, row_plan


@dataclass(frozen=True)
class _Segment:
    lo: int  # cut indices
    hi: int
    peak: int
    streamed: bool
    nodes: int


def _activations(g: Graph, data: set[str]) -> set[Value]:
    act = {v for v in g.inputs if v.name in data}
    for n in g.nodes:
        if any(v in act for v in n.inputs):
            act.update(n.outputs)
    return act


def _activation_operands(n: Node) -> tuple[int, ...]:
    return get_op(n.op).stream_operands


def _streamable(n: Node) -> bool:
    if not _activation_operands(n) or n.outputs[0].type.rank != 4 or n.outputs[0].type.dtype != "int8":
        return False
    return not n.attrs.get("float_out")


class _Chain:
    """Positions, readers and cut values of the activations of `g`."""

    def __init__(self, g: Graph, data: set[str]):
        self.g = g
        self.act = _activations(g, data)
        self.pos = {v: -1 for v in g.inputs}
        for i, n in enumerate(g.nodes):
            for o in n.outputs:
                self.pos[o] = i
        end = len(g.nodes)
        self.last = {v: self.pos[v] for v in self.act}
        self.readers: dict[Value, list[int]] = {v: [] for v in self.act}
        for i, n in enumerate(g.nodes):
            for v in n.inputs:
                if v in self.act:
                    self.last[v] = max(self.last[v], i)
                    self.readers[v].append(i)
        for v in g.outputs:
            if v in self.act:
                self.last[v] = end
        self.cuts = self._cuts()

    def _cuts(self) -> list[Value]:
        """Activations that are the only one open (produced, still to be read) when made."""
        opened: dict[int, int] = {}
        for v in self.act:
            for p in range(self.pos[v], self.last[v]):
                opened[p] = opened.get(p, 0) + 1
        cuts = []
        for v in sorted(self.act, key=lambda u: self.pos[u]):
            if self.last[v] > self.pos[v] and opened.get(self.pos[v], 0) == 1 and v.type.rank == 4 \
                    and v.type.dtype == "int8":
                cuts.append(v)
        return cuts

    def range_nodes(self, a: Value, b: Value) -> list[int]:
        """Positions of the activation-producing nodes after a's producer up to b's."""
        return [i for i in range(self.pos[a] + 1, self.pos[b] + 1)
                if any(o in self.act for o in self.g.nodes[i].outputs)]

    def unstreamed_peak(self, a: Value, b: Value, idx: list[int]) -> int:
        """Largest total of the segment's activations live at one of its nodes."""
        vals = [a] + [o for i in idx for o in self.g.nodes[i].outputs]
        peak = 0
        for k in idx:
            live = sum(v.type.nbytes for v in vals if self.pos[v] <= k <= self.last[v])
            peak = max(peak, live)
        return peak

    def stream_body(self, a: Value, b: Value, idx: list[int], mutated: set[Value], root) -> Optional[Graph]:
        """The qstream body of the segment a -> b, or None when it cannot be streamed."""
        inside = {o for i in idx for o in self.g.nodes[i].outputs}
        nodes = [self.g.nodes[i] for i in idx]
        if len(nodes) < 2 or not all(_streamable(n) for n in nodes) or b not in inside:
            return None
        for n in nodes:
            for j in _activation_operands(n):
                if n.inputs[j] is not a and n.inputs[j] not in inside:
                    return None
            params = [v for j, v in enumerate(n.inputs) if j not in _activation_operands(n)]
            if any(root[v] in mutated or v in self.act for v in params):
                return None
        for n in nodes:
            for o in n.outputs:
                if o is not b and (self.last[o] >= len(self.g.nodes)
                                   or any(r not in idx for r in self.readers[o])):
                    return None
        return _body(a, b, nodes)


def _body(a: Value, b: Value, nodes: list[Node]) -> Graph:
    """The sub-graph a -> b over fresh values, fused pairs split back into two convs."""
    env = {a: new_value(a.type, "x")}
    inputs = [env[a]]

    def arg(v: Value) -> Value:
        if v not in env:
            env[v] = new_value(v.type, f"p{len(inputs) - 1}")
            inputs.append(env[v])
        return env[v]

    body: list[Node] = []
    for n in nodes:
        if n.op == PW_DW_OP:  # the body runs the pair as the two convolutions it fuses
            pw, dw = split_attrs(n.attrs)
            x, w1, b1, w2, b2 = (arg(v) for v in n.inputs)
            (t_type,) = get_op("qconv2d").infer([x.type, w1.type, b1.type], pw)
            t = new_value(t_type)
            body.append(Node("qconv2d", (x, w1, b1), (t,), pw))
            y = new_value(n.outputs[0].type)
            body.append(Node("qconv2d", (t, w2, b2), (y,), dw))
            env[n.outputs[0]] = y
        else:
            ins = tuple(arg(v) for v in n.inputs)
            y = new_value(n.out.type)
            body.append(Node(n.op, ins, (y,), n.attrs))
            env[n.out] = y
    # x is the streamed activation, fed row by row; the other operands are the chain's frozen weights
    return Graph(tuple(inputs), tuple(body), (env[b],), ("y",), (Role.DATA,) + (Role.FROZEN,) * (len(inputs) - 1))


def _solve(segments: dict[tuple[int, int], list[_Segment]], n_cuts: int, cap: Optional[int]) -> Optional[list]:
    """Min over paths cut 0 -> last cut of (largest segment peak, streamed nodes); with
    `cap`, min streamed nodes among paths whose segments all peak at most `cap`."""
    best: list[Optional[tuple]] = [None] * n_cuts
    best[0] = (0, 0, [])
    for j in range(1, n_cuts):
        for i in range(j):
            if best[i] is None:
                continue
            for s in segments.get((i, j), ()):
                if cap is not None and s.peak > cap:
                    continue
                key = (max(best[i][0], s.peak) if cap is None else 0, best[i][1] + (s.nodes if s.streamed else 0))
                if best[j] is None or key < best[j][:2]:
                    best[j] = (*key, best[i][2] + [s])
    return best[-1]


def stream_frozen_chains(g: Graph, data_inputs: Iterable[str]) -> Graph:
    """`g` with the streamed segments that minimise the forward chain's peak (module
    docstring). `data_inputs` name the graph inputs that carry the sample."""
    chain = _Chain(g, set(data_inputs))
    cuts = chain.cuts
    if len(cuts) < 2:
        return g
    root = storage_roots(g)
    mutated = {root[n.inputs[j]] for n in g.nodes if get_op(n.op).mutates
               for _, j in get_op(n.op).shares if j < len(n.inputs)}
    segments: dict[tuple[int, int], list[_Segment]] = {}
    bodies: dict[tuple[int, int], Graph] = {}
    for i, a in enumerate(cuts):
        for j in range(i + 1, len(cuts)):
            b = cuts[j]
            idx = chain.range_nodes(a, b)
            opts = []
            if j == i + 1:
                opts.append(_Segment(i, j, chain.unstreamed_peak(a, b, idx), False, len(idx)))
            if not all(_streamable(g.nodes[k]) for k in idx):
                segments[(i, j)] = opts
                break
            body = chain.stream_body(a, b, idx, mutated, root)
            if body is not None:
                bodies[(i, j)] = body
                peak = a.type.nbytes + b.type.nbytes + row_plan(body).ring_bytes
                opts.append(_Segment(i, j, peak, True, len(idx)))
            segments[(i, j)] = opts
    last = len(cuts) - 1
    while last > 0 and _solve(segments, last + 1, None) is None:
        last -= 1
    if last == 0:
        return g
    best = _solve(segments, last + 1, None)
    plan = _solve(segments, last + 1, best[0])[2]
    return _rewrite(g, chain, [(s, bodies[(s.lo, s.hi)]) for s in plan if s.streamed])


def _rewrite(g: Graph, chain: _Chain, streamed: list[tuple[_Segment, Graph]]) -> Graph:
    if not streamed:
        return g
    cuts = chain.cuts
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for s, body in streamed:
        a, b = cuts[s.lo], cuts[s.hi]
        idx = chain.range_nodes(a, b)
        params, seen = [], {a}
        for k in idx:
            for v in g.nodes[k].inputs:
                if v not in seen and v not in chain.act:
                    seen.add(v)
                    params.append(v)
        scratch = new_value(get_op(STREAM_OP).infer([v.type for v in (a, *params)], {"body": body})[1])
        replace[chain.pos[b]] = Node(STREAM_OP, (a, *params), (b, scratch), {"body": body})
        drop.update(idx)
    nodes = [replace.get(i, n) for i, n in enumerate(g.nodes) if i in replace or i not in drop]
    return g.replace(nodes=tuple(nodes))
