"""Operator reordering for memory: a node order with a lower peak of live bytes.

The node list is the order the graph runs in, and `memory.liveness` measures it: a storage is live from
the node that allocates it to the last node that reads it (through any alias). This pass
searches the topological orders of the graph for one whose peak is lower, as the Tiny
Training Engine's operator reordering does, but for any graph: a greedy list scheduler
runs, at each step, the ready node that leaves the least memory live, so nodes that free
storage (in-place updates, last readers) go first and large allocations (a weight
gradient) wait until memory is low. Each rule below gives one order; the pass keeps the
one with the lowest measured peak, and the input order when nothing beats it, so it
never makes a graph worse.

Orders must respect more than data dependences: an op that overwrites an input in place
(`OpDef.mutates`, e.g. `sgd_update`) runs after every other reader of the value it
overwrites, including readers of views of it (reshape shares storage).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Iterable

from ..ir import Graph, Value
from ..memory.liveness import lifetimes, live_bytes_timeline, storage_roots
from ..ops import get_op


def order_peak_bytes(g: Graph, ram_inputs: Iterable[str]) -> int:
    """The peak of live bytes of `g` in its node order (what `plan_memory` reports as
    activation bytes)."""
    return max(live_bytes_timeline(g, lifetimes(g, set(ram_inputs))), default=0)


@dataclass(frozen=True)
class Problem:
    """The graph as a scheduler sees it: nodes and storages are numbered by position."""

    preds: tuple[tuple[int, ...], ...]  # nodes that must run before each node
    succs: tuple[tuple[int, ...], ...]
    owns: tuple[tuple[int, ...], ...]  # storages each node allocates
    reads: tuple[tuple[int, ...], ...]  # distinct storages each node reads, through any alias
    nbytes: tuple[int, ...]  # per storage
    readers: tuple[tuple[int, ...], ...]  # nodes reading each storage
    kept: tuple[bool, ...]  # holds a graph output: live to the end
    initial: tuple[int, ...]  # graph inputs in RAM: live from the start
    eager: tuple[bool, ...]  # in-place updates: run as soon as ready (they only free)

    @property
    def allocs(self) -> list[int]:
        return [sum(self.nbytes[s] for s in own) for own in self.owns]


def _versions(g: Graph, root: dict[Value, Value]) -> dict[Value, tuple[Value, int]]:
    """(storage root, version) of every value: an in-place result is a new version of
    its root; a view has the version of the value it views."""
    version = {v: (v, 0) for v in g.inputs}
    for i, n in enumerate(g.nodes):
        opdef = get_op(n.op)
        shares = dict(opdef.shares)
        for k, o in enumerate(n.outputs):
            j = shares.get(k)
            if j is None or j >= len(n.inputs):
                version[o] = (o, 0)
            else:
                version[o] = (root[o], i + 1) if opdef.mutates else version[n.inputs[j]]
    return version


def _dependences(g: Graph, root: dict[Value, Value]) -> list[set[int]]:
    """For each node, the nodes that must run before it: the producers of its inputs and,
    for an in-place op, every other reader of the version it overwrites."""
    producer = {o: i for i, n in enumerate(g.nodes) for o in n.outputs}
    version = _versions(g, root)
    readers_of: dict[tuple[Value, int], list[int]] = {}
    preds: list[set[int]] = []
    for i, n in enumerate(g.nodes):
        preds.append({producer[v] for v in n.inputs if v in producer})
        for v in n.inputs:
            readers_of.setdefault(version[v], []).append(i)
    for i, n in enumerate(g.nodes):
        opdef = get_op(n.op)
        if opdef.mutates:
            for _, j in opdef.shares:
                if j < len(n.inputs):
                    preds[i].update(k for k in readers_of[version[n.inputs[j]]] if k != i)
    return preds


def build_problem(g: Graph, ram_inputs: Iterable[str]) -> Problem:
    ram_inputs = set(ram_inputs)
    root = storage_roots(g)
    sid: dict[Value, int] = {}
    for v in g.inputs:
        if v.name in ram_inputs:
            sid[v] = len(sid)
    initial = tuple(range(len(sid)))
    owns = []
    for n in g.nodes:
        mine = []
        for o in n.outputs:
            if root[o] is o:
                sid[o] = len(sid)
                mine.append(sid[o])
        owns.append(tuple(mine))
    readers: list[list[int]] = [[] for _ in sid]
    reads = []
    for i, n in enumerate(g.nodes):
        mine = []
        for v in n.inputs:
            s = sid.get(root[v])
            if s is not None and s not in mine:
                mine.append(s)
                readers[s].append(i)
        reads.append(tuple(mine))
    kept = [False] * len(sid)
    for v in g.outputs:
        if root[v] in sid:
            kept[sid[root[v]]] = True
    preds = [tuple(sorted(p)) for p in _dependences(g, root)]
    succs: list[list[int]] = [[] for _ in g.nodes]
    for i, ps in enumerate(preds):
        for k in ps:
            succs[k].append(i)
    return Problem(tuple(preds), tuple(map(tuple, succs)), tuple(owns), tuple(reads),
                   tuple(v.type.nbytes for v in sid), tuple(map(tuple, readers)), tuple(kept), initial,
                   tuple(get_op(n.op).mutates for n in g.nodes))


# --- the greedy list scheduler ---------------------------------------------------------
#: A rule picks the next node from the ready ones. It sees, per ready node, `alloc` (bytes
#: it allocates) and `net` (alloc minus the bytes freed right after it), and the bytes
#: `live` now and the `peak` so far; ties go to the earlier node of the input order.
Rule = Callable[["_Ready", int, int], int]


class _Ready:
    """The ready nodes in two lazy heaps: by (net, index) and by (alloc, net, index)."""

    def __init__(self, alloc: list[int]):
        self.alloc = alloc
        self.net: dict[int, int] = {}
        self.by_net: list[tuple[int, int]] = []
        self.by_alloc: list[tuple[int, int, int]] = []

    def put(self, i: int, net: int) -> None:
        self.net[i] = net
        heapq.heappush(self.by_net, (net, i))
        heapq.heappush(self.by_alloc, (self.alloc[i], net, i))

    def _current(self, net: int, i: int) -> bool:
        return self.net.get(i) == net

    def least_net(self, max_alloc: int = -1) -> int:
        """The ready node with the least net bytes, among those allocating at most
        `max_alloc` bytes when it is not negative; -1 when there is none."""
        skipped, found = [], -1
        while self.by_net:
            net, i = self.by_net[0]
            if not self._current(net, i):
                heapq.heappop(self.by_net)
            elif max_alloc >= 0 and self.alloc[i] > max_alloc:
                skipped.append(heapq.heappop(self.by_net))
            else:
                found = i
                break
        for e in skipped:
            heapq.heappush(self.by_net, e)
        return found

    def least_alloc(self) -> int:
        while not self._current(self.by_alloc[0][1], self.by_alloc[0][2]):
            heapq.heappop(self.by_alloc)
        return self.by_alloc[0][2]

    def take(self, i: int) -> None:
        del self.net[i]


def rule_least_net(ready: _Ready, live: int, peak: int) -> int:
    """Leave the least memory live after the step."""
    return ready.least_net()


def rule_under_peak(ready: _Ready, live: int, peak: int) -> int:
    """Among the nodes that do not raise the peak so far, leave the least memory live;
    when every node raises it, raise it the least."""
    i = ready.least_net(max_alloc=max(peak - live, 0))
    return i if i >= 0 else ready.least_alloc()


RULES: tuple[Rule, ...] = (rule_under_peak, rule_least_net)


def order_by_rule(p: Problem, rule: Rule) -> list[int]:
    """A topological order of the nodes, built one node at a time by `rule`."""
    n = len(p.preds)
    alloc = p.allocs
    waiting = [len(ps) for ps in p.preds]
    unread = [len(r) for r in p.readers]
    dead_at_birth = [sum(p.nbytes[s] for s in own if not p.readers[s] and not p.kept[s]) for own in p.owns]
    done = [False] * n

    def net(i: int) -> int:
        freed = sum(p.nbytes[s] for s in p.reads[i] if unread[s] == 1 and not p.kept[s])
        return alloc[i] - freed - dead_at_birth[i]

    ready = _Ready(alloc)
    for i in range(n):
        if not waiting[i]:
            ready.put(i, net(i))
    live = sum(p.nbytes[s] for s in p.initial)
    unused_inputs = sum(p.nbytes[s] for s in p.initial if not p.readers[s] and not p.kept[s])
    eager = p.eager
    ready_updates = [i for i in range(n) if not waiting[i] and eager[i]]
    peak, order = 0, []
    while ready.net:
        # an in-place update is applied the moment it can be (it allocates nothing and
        # frees its gradient); otherwise the rule picks
        i = ready_updates.pop(0) if ready_updates else rule(ready, live, peak)
        peak = max(peak, live + alloc[i])
        live += net(i)
        ready.take(i)
        done[i] = True
        if not order:
            live -= unused_inputs  # RAM inputs nobody reads live only while the first node runs
        order.append(i)
        for s in p.reads[i]:
            unread[s] -= 1
            if unread[s] == 1:  # its last reader now frees it: that reader's net drops
                last = next(k for k in p.readers[s] if not done[k])
                if last in ready.net:
                    ready.put(last, net(last))
        for k in p.succs[i]:
            waiting[k] -= 1
            if not waiting[k]:
                ready.put(k, net(k))
                if eager[k]:
                    ready_updates.append(k)
    if len(order) != n:
        raise ValueError("the graph has no valid node order: its in-place updates conflict with their readers")
    return order


def reorder_for_memory(g: Graph, ram_inputs: Iterable[str]) -> Graph:
    """`g` with its nodes in the order of lowest peak live bytes among the input order and
    the orders of the greedy `RULES` (the first of those wins a tie). `ram_inputs` names
    the graph inputs that live in RAM, as for `plan_memory`. An input order that reads a
    view of a value after an in-place update overwrote it is not a candidate."""
    ram_inputs = set(ram_inputs)
    if not g.nodes:
        return g
    p = build_problem(g, ram_inputs)
    best, best_peak = None, 0
    if all(k < i for i, ps in enumerate(p.preds) for k in ps):  # else a view is read after an overwrite
        best, best_peak = g, order_peak_bytes(g, ram_inputs)
    for rule in RULES:
        order = order_by_rule(p, rule)
        candidate = g.replace(nodes=tuple(g.nodes[i] for i in order))
        peak = order_peak_bytes(candidate, ram_inputs)
        if best is None or peak < best_peak:
            best, best_peak = candidate, peak
    return best
