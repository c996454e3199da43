"""Storage lifetimes from the node order (the order is the schedule).

Values that share storage (views, in-place results) are grouped under one root. A root
produced by node i and last read by node j is live over [i, j]; graph inputs that live in
RAM start at 0; graph outputs stay live to the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from ..ir import Graph, Value
from ..ops import get_op


@dataclass(frozen=True)
class Lifetime:
    root: Value
    start: int
    end: int  # inclusive
    nbytes: int


def storage_roots(g: Graph) -> dict[Value, Value]:
    """Map every value to the value that owns its storage."""
    root = {v: v for v in g.inputs}
    for n in g.nodes:
        shares = dict(get_op(n.op).shares)
        for k, o in enumerate(n.outputs):
            j = shares.get(k)
            root[o] = root[n.inputs[j]] if j is not None and j < len(n.inputs) else o
    return root


def lifetimes(g: Graph, ram_inputs: set[str]) -> list[Lifetime]:
    """Lifetimes of the storages that live in the arena: node outputs that own their
    storage, and the graph inputs named in `ram_inputs` (data, labels)."""
    root = storage_roots(g)
    end_of = max(len(g.nodes) - 1, 0)  # a graph without nodes (a random draw torch.compile hands
    #                                    over alone) still holds its inputs for one step
    start: dict[Value, int] = {v: 0 for v in g.inputs if v.name in ram_inputs}
    for i, n in enumerate(g.nodes):
        for o in n.outputs:
            if root[o] is o:
                start[o] = i
    last: dict[Value, int] = {r: s for r, s in start.items()}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            r = root[v]
            if r in start:
                last[r] = max(last[r], i)
    for v in g.outputs:
        if root[v] in start:
            last[root[v]] = end_of
    return [Lifetime(r, start[r], last[r], r.type.nbytes) for r in start]


def live_bytes_timeline(g: Graph, lts: list[Lifetime]) -> list[int]:
    """Bytes live while each node runs (its inputs and outputs included); none for a graph
    without nodes."""
    if not g.nodes:
        return []
    delta = [0] * (len(g.nodes) + 1)
    for lt in lts:
        delta[lt.start] += lt.nbytes
        delta[lt.end + 1] -= lt.nbytes
    return list(accumulate(delta[:-1]))


def inplace_merges(g: Graph, lts: list[Lifetime]) -> list[tuple[Value, Value]]:
    """(input root, output) pairs whose storage the arena may share: node i's output k is
    written over its input j (the op declares (k, j) in `OpDef.inplace`) when the input's
    storage is an arena value of the same type read by nobody after node i (its lifetime
    ends at i) and not a graph input or output. Each storage is reused at most once per node."""
    root = storage_roots(g)
    end = {lt.root: lt.end for lt in lts}
    outputs = {root[v] for v in g.outputs}
    inputs = set(g.inputs)
    merges = []
    for i, n in enumerate(g.nodes):
        pairs = get_op(n.op).inplace
        if not pairs:
            continue
        used: set[Value] = set()
        for k, j in pairs:
            if k >= len(n.outputs) or j >= len(n.inputs):
                continue
            o, v = n.outputs[k], n.inputs[j]
            r = root[v]
            if (root[o] is o and o not in used and r not in used and v.type == o.type
                    and r.type.nbytes == o.type.nbytes and end.get(r) == i and r not in outputs
                    and r not in inputs and o in end):
                merges.append((r, o))
                used.update((r, o))
    return merges
