"""Frozen weights mapped from the weights file as paged units of the schedule problem.

The standalone host binary maps its weights file (backends/c/weights_file.py, ET_MAP_WEIGHTS):
a frozen tensor's pages come in from the page cache when a kernel reads it (a page-in from the
file) and leave when model.c drops them (madvise(MADV_DONTNEED) after a node). With
`build_problem(..., mapped_weights=True)` each such tensor is a *frozen unit* (Unit.frozen): it
cannot be recomputed, it is "paged out" for nothing (it is in the file), and a schedule decides,
as for a paged activation, whether it stays resident from one read to the next (kept after the
forward, carried into a stage) or is dropped and read again (paged in at the stage that reads it),
at its page-rounded bytes (memory/frozen_window.pages_touched). In the forward it is resident at
the nodes that read it (forward_live counts it there) and, when the schedule keeps it, from its
last forward reader on.

`weight_releases` turns a schedule into the drops the binary makes, per node of the scheduled
train graph (apply.rewrite_graph's node order), so that what is resident at every node is at
most what the problem counts there:
- forward: after a node that reads it, unless the next node reads it too, or this is its last
  forward reader and the schedule keeps it; after the last forward node, every kept one that is
  not resident into stage 0;
- stage s: after the stage's first node (its recomputations and page-ins run before it), every
  one materialized at s (carried in or paged in) that is not carried into stage s+1.
A drop also drops ET_RELEASE_SLACK bytes of its neighbours' pages (weights_file.py): a resident
neighbour is read again from the file when next read (more page-ins than the schedule's, never
more RAM).
"""
from __future__ import annotations

from typing import Mapping

from ..ir import Graph, Role
from ..memory import storage_roots
from ..ops import get_op


def mapped_frozen(g: Graph, ram_inputs, trainable: Mapping) -> dict[str, int]:
    """{name: bytes} of `g`'s graph inputs the host binary maps from the weights file (its
    layout's kind "flash"): state that is neither held in RAM (data, labels), the page store,
    trained (whole or on some channels: `trainable`, the program's), optimizer state nor
    written in place by an op."""
    inputs = set(g.inputs)
    written = {n.inputs[j].name for n in g.nodes for _, j in get_op(n.op).shares
               if get_op(n.op).mutates and j < len(n.inputs) and n.inputs[j] in inputs}
    skip = {Role.PAGE_STORE, Role.OPTIMIZER_STATE, Role.DATA, Role.LABEL, Role.STEP, Role.TANGENT}
    return {v.name: v.type.nbytes for v, r in zip(g.inputs, g.roles)
            if r not in skip and v.name not in ram_inputs and v.name not in trainable and v.name not in written}


def weight_releases(sched, graph: Graph) -> list[tuple[str, ...]]:
    """Per node of `graph` (the train graph of `prog.apply(sched)`): the names of the mapped
    frozen weights to drop after it (module docstring). Empty lists when the schedule's problem
    was built without mapped_weights."""
    problem = sched.problem
    us = problem.units
    frozen = [u for u in us if u.frozen]
    out: list[list[str]] = [[] for _ in graph.nodes]
    if not frozen:
        return [tuple(r) for r in out]
    name = {u.index: u.name.rsplit("@", 1)[0] for u in frozen}
    orig = problem.graph.nodes
    b0, S = problem.forward_end, len(problem.stages)
    pos = {id(o): p for p, n in enumerate(orig) for o in n.outputs}  # original node of a scheduled one
    roots, inputs, by_name = storage_roots(problem.graph), set(problem.graph.inputs), {v: u for u, v in name.items()}
    reads = [_frozen_reads(n, roots, inputs, by_name) for n in orig[:b0]]
    last_fwd = {u.index: max((p for p in range(b0) if u.index in reads[p]), default=-1) for u in frozen}
    at = {}  # original position -> index in `graph` (the fixed nodes, kept with their outputs)
    for i, n in enumerate(graph.nodes):
        p = pos.get(id(n.outputs[0])) if n.outputs else None
        if p is not None:
            at.setdefault(p, i)
    for p in range(b0):
        nxt = reads[p + 1] if p + 1 < b0 else set()
        for u in sorted(reads[p]):
            if u in nxt or (p == last_fwd[u] and u in sched.keep):
                continue
            out[at[p]].append(name[u])
    if b0:
        first = sched.resident[0] if S else frozenset()
        out[at[b0 - 1]] += [name[u] for u in sorted(sched.keep) if us[u].frozen and u not in first]
    for s, st in enumerate(problem.stages):
        mat = set(sched.resident[s]) | set(sched.page_in[s])
        nxt = sched.resident[s + 1] if s + 1 < S else frozenset()
        out[at[st.nodes[0]]] += [name[u] for u in sorted(mat) if us[u].frozen and u not in nxt]
    return [tuple(dict.fromkeys(r)) for r in out]


def _frozen_reads(node, roots, inputs, by_name) -> set[int]:
    """The frozen units `node` reads: through views, not as the source of a view it makes."""
    views = {roots[o] for o in node.outputs}
    return {by_name[roots[v].name] for v in node.inputs
            if roots[v] in inputs and roots[v].name in by_name and roots[v] not in views}
