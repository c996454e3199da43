"""The reference interpreter (the numpy reference runtime that is the spec): executes a graph with
each op's numpy rule, in node order. Its own unit on the compiler's floor (passes and quantization
run graphs with it); the runners of compiled programs are in backends/.

It frees every array after its last use and counts the bytes it holds as it goes,
independently of the static liveness analysis (memory/liveness.py), which tests compare
it with. In-place ops write into the storage they overwrite (the caller's weights; a page
store's memmap, which page_out writes itself). It also counts the bytes paged to and from
secondary storage by the ops that declare `OpDef.io`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .ir import Graph, Value
from .ops import get_op


@dataclass(frozen=True)
class RunTrace:
    peak_bytes: int  # peak of bytes held in RAM-resident storages (arena)
    timeline: tuple[int, ...]
    paged_in_bytes: int = 0  # read back from secondary storage (ops with io="in")
    paged_out_bytes: int = 0  # written to it (ops with io="out")


class BindError(ValueError):
    pass


def run_graph(g: Graph, feeds: Mapping[str, np.ndarray], ram_inputs=frozenset()) -> tuple[dict, RunTrace]:
    """Run `g`. `feeds` binds every graph input by name (weights are written in place by
    mutating ops); `ram_inputs` names the inputs counted as RAM (data, labels)."""
    env: dict[Value, np.ndarray] = {}
    owner: dict[Value, object] = {}  # value -> storage token
    holders: dict[object, int] = {}  # storage token -> number of live values using it
    counted: dict[object, int] = {}  # storage token -> bytes, for RAM-resident storages
    for v in g.inputs:
        if v.name not in feeds:
            raise BindError(f"no value bound for graph input {v.name!r}")
        arr = feeds[v.name]
        if tuple(arr.shape) != v.shape or str(arr.dtype) != v.dtype:
            raise BindError(f"input {v.name!r}: expected {v.type}, got {arr.dtype}{list(arr.shape)}")
        env[v], owner[v] = arr, object()
        holders[owner[v]] = 1
        if v.name in ram_inputs:
            counted[owner[v]] = v.type.nbytes

    uses: dict[Value, int] = {}
    for n in g.nodes:
        for v in n.inputs:
            uses[v] = uses.get(v, 0) + 1
    keep = set(g.outputs)
    live = sum(counted.values())
    timeline = []
    paged = {"in": 0, "out": 0}

    def release(v: Value):
        nonlocal live
        if v in keep:
            return
        tok = owner.pop(v)
        del env[v]
        holders[tok] -= 1
        if holders[tok] == 0:
            live -= counted.pop(tok, 0)

    for n in g.nodes:
        opdef = get_op(n.op)
        outs = opdef.ref([env[v] for v in n.inputs], n.attrs)
        shares = dict(opdef.shares)
        if opdef.io == "out":
            written = {j for _, j in opdef.shares}
            paged["out"] += sum(v.type.nbytes for j, v in enumerate(n.inputs) if j not in written)
        elif opdef.io == "in":
            paged["in"] += sum(o.type.nbytes for o in n.outputs)
        for k, (o, raw) in enumerate(zip(n.outputs, outs)):
            arr = np.asarray(raw)
            j = shares.get(k)
            if j is not None and j < len(n.inputs):
                src = n.inputs[j]
                if opdef.mutates:
                    if raw is not env[src]:  # an op that wrote its input itself returns it
                        env[src][...] = arr  # in place: the storage keeps its identity
                    arr = env[src]
                tok = owner[src]
            else:
                tok = object()
                counted[tok] = o.type.nbytes
                live += o.type.nbytes
            assert arr.shape == o.shape, f"{n.op}: produced {arr.shape}, IR says {o.shape}"
            env[o], owner[o] = arr.astype(o.dtype, copy=False), tok
            holders[tok] = holders.get(tok, 0) + 1
        timeline.append(live)
        for v in n.inputs:
            uses[v] -= 1
            if uses[v] == 0:
                release(v)
        for o in n.outputs:
            if uses.get(o, 0) == 0:
                release(o)
    for v in g.inputs:  # inputs never read still count until the end
        if uses.get(v, 0) == 0 and v in owner:
            release(v)
    out = {name: env[v] for name, v in zip(g.output_names, g.outputs)}
    return out, RunTrace(max(timeline, default=live), tuple(timeline), paged["in"], paged["out"])
