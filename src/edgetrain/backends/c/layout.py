"""Where every value of a compiled program lives in the emitted C program.

- One static arena for the data, labels, activations, gradients and temporaries of all three
  graphs (train, forward, grad): each graph is planned on its own with the memory planner's
  machinery (liveness + in-place merges + `plan_arena`); the arena is the largest of the three.
- State tensors (weights, buffers, momentum) are C arrays: trainable ones (and their momentum)
  writable (SRAM), frozen ones `const` (flash), a weight trained on a ChannelSelect only as two
  arrays, the selected channels (SRAM) and the rest (flash), with const uint16 index arrays.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from ...autodiff import ChannelSelect
from ...ir import Graph, Role, ram_inputs
from ...memory.arena import ALIGNMENT, ArenaPlan, align_up, plan_arena
from ...memory.liveness import inplace_merges, lifetimes, storage_roots

#: C element type of each IR dtype
C_TYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
           "bool": "uint8_t"}
#: the three graphs of a program, by the name their C function carries
GRAPHS = ("train", "forward", "grad")


class CBackendError(RuntimeError):
    """The C backend cannot emit, build or run this program (unsupported op, no compiler, ...)."""


def c_ident(text: str, limit: int = 40) -> str:
    return re.sub(r"\W", "_", text)[:limit]


@dataclass(frozen=True)
class StateArray:
    """A state tensor of the program as C arrays. kind: "sram" (trainable, momentum),
    "flash" (frozen) or "split" (trained on `sel` only: `sram` holds the selected channels in
    index order, `flash` the others in order; `sel_index` / `rest_index` their positions).
    `role`: the role of the graph input it binds (momentum starts at zero, never embedded)."""

    index: int
    name: str
    shape: tuple
    dtype: str
    kind: str
    c_name: str
    sel: Optional[ChannelSelect] = None
    rest: tuple = ()
    role: Role = Role.PARAMETER

    @property
    def ctype(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def sram(self) -> str:
        return self.c_name + "_sel" if self.kind == "split" else self.c_name

    @property
    def flash(self) -> str:
        return self.c_name + "_rest" if self.kind == "split" else self.c_name

    @property
    def sel_index(self) -> str:
        return self.c_name + "_si"

    @property
    def rest_index(self) -> str:
        return self.c_name + "_ri"

    def part_shape(self, which: str) -> tuple:
        """Shape of the "sel" or "rest" part of a split tensor."""
        shape = list(self.shape)
        shape[self.sel.dim] = len(self.sel.index) if which == "sel" else len(self.rest)
        return tuple(shape)


@dataclass(frozen=True)
class GraphLayout:
    graph: Graph
    roots: dict  # Value -> storage root Value
    offsets: dict  # arena root Value -> byte offset
    size: int
    lifetimes: tuple = ()  # memory.liveness.Lifetime of every arena root

    @cached_property
    def input_set(self) -> frozenset:
        """The graph's inputs as a set: the emitters ask of every value whether it is one (a scan of the tuple
        compared Values field by field)."""
        return frozenset(self.graph.inputs)


@dataclass(frozen=True)
class Layout:
    graphs: dict  # "train" / "forward" / "grad" -> GraphLayout
    states: dict  # state name -> StateArray, in prog.state order
    ram_inputs: frozenset
    data_inputs: tuple  # the graphs' data input names (prog.graph_inputs)
    arena_bytes: int
    page_bytes: int = 0  # the page store's size (0: the program does not page)


def plan_graph(g: Graph, ram_inputs: set, plan: Optional[ArenaPlan] = None) -> GraphLayout:
    """Where `g`'s values live: `plan` (an arena plan of `g` for these RAM inputs, such as
    the program's own `prog.memory.arena`), or a new one."""
    lts = lifetimes(g, ram_inputs)
    if plan is None:
        plan = plan_arena(lts, merges=inplace_merges(g, lts))
    return GraphLayout(g, storage_roots(g), dict(plan.offsets), plan.size, tuple(lts))


def _written_in_place(graphs) -> set[str]:
    """Names of graph inputs that an in-place op (ops' `mutates`) writes: they live in SRAM."""
    from ...ops import get_op

    out = set()
    for g in graphs:
        inputs = set(g.inputs)
        for n in g.nodes:
            op = get_op(n.op)
            if op.mutates:
                out.update(n.inputs[j].name for _, j in op.shares if j < len(n.inputs) and n.inputs[j] in inputs)
    return out


def build_layout(prog, graphs: tuple = GRAPHS) -> Layout:
    """The placement of every value and state tensor of `prog` (a compiled Program), for the
    graphs named in `graphs` (the arena is the largest of their plans)."""
    bad = [k for k in graphs if k not in GRAPHS] or ([] if "train" in graphs else ["(train is required)"])
    if bad:
        raise CBackendError(f"graphs={graphs!r}: choose among {GRAPHS}, train included; not {bad}")
    every = {"train": prog.train_graph, "forward": prog.forward_graph, "grad": prog.grad_graph}
    graphs = {k: every[k] for k in GRAPHS if k in graphs}
    # the train graph at the offsets prog.memory reports (its arena is the one planned there)
    layouts = {k: plan_graph(g, set(ram_inputs(g)), prog.memory.arena if k == "train" else None)
               for k, g in graphs.items()}
    ram = frozenset().union(*(ram_inputs(g) for g in graphs.values()))
    store = getattr(prog, "page_store", None)
    role = {v.name: r for g in graphs.values() for v, r in zip(g.inputs, g.roles)}
    used = {v.name: v for g in graphs.values() for v in g.inputs
            if v.name not in ram and role[v.name] is not Role.PAGE_STORE}
    missing = [n for n in used if n not in prog.state]
    if missing:
        raise CBackendError(f"graph inputs {missing[:3]} are neither data, label, step nor state tensors")
    trainable = set(prog.trainable) | {k for k in used if role[k] is Role.OPTIMIZER_STATE}
    trainable |= _written_in_place(graphs.values())  # e.g. batch norm's running statistics
    states = {}
    for name in prog.state:
        if name not in used:
            continue
        v = used[name]
        sel = prog.trainable.get(name)
        kind = "split" if sel is not None else "sram" if name in trainable else "flash"
        rest = ()
        if sel is not None:
            chosen = set(sel.index)
            rest = tuple(i for i in range(v.shape[sel.dim]) if i not in chosen)
        i = len(states)
        states[name] = StateArray(i, name, tuple(v.shape), v.dtype, kind, f"et_s{i}_{c_ident(name)}", sel, rest,
                                  role[name])
    size = align_up(max([gl.size for gl in layouts.values()] + [ALIGNMENT]))
    return Layout(layouts, states, ram, tuple(prog.graph_inputs), size, store.nbytes if store is not None else 0)
