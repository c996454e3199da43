"""apply_schedule: a compiled program rewritten to run a rematerialization / paging schedule.

The train graph's node order is the plain schedule (problem.py). The rewrite keeps every
node and inserts copies of the units the schedule brings back:

1. forward (positions before the first label-dependent node): every node as it is; after
   the last node of a unit the schedule pages out, a `page_out` of each of its storages
   into one page store (a graph input standing for flash / SD, ops/page.py), at offsets
   16-byte aligned;
2. each stage in order: a `page_in` of each storage of the units paged in at the stage
   (and clones of the unit's views over them), then clones of the units recomputed at the
   stage, then the stage's fixed nodes. A node's input that belongs to a unit is the
   unit's *current copy*: the one it had at the previous stage when it is carried into
   this one (`resident`), the new one when it is paged in or recomputed here. Every other
   value is the original.

The rewritten program (`apply_schedule`) runs in the reference runtime and the C backend
with the page store bound to a real file; what it measures (RunTrace.peak_bytes +
problem.fixed_ram, RunTrace.paged_*_bytes) is checked against the schedule's model in
tests/remat/test_apply.py.
"""
from __future__ import annotations

import os
import tempfile
import weakref
from dataclasses import replace
from typing import Optional

import numpy as np

from ..autodiff import grad_name
from ..ir import Graph, Node, Role, TensorType, Value, new_value
from ..memory import ALIGNMENT, storage_roots
from ..memory.arena import align_up
from ..ops import get_op, verify
from ..ops.embedding_update import EMBEDDING_GRAD_UPDATE
from ..ops.gradupdate import FLOAT_GRAD_UPDATE
from ..ops.page import STORE_DTYPE
from ..ops.qgradupdate import GRAD_UPDATE_OP, split_attrs
from ..passes.dce import eliminate_dead_code
from ..pipeline import plan_graph
from .plan import Schedule, ScheduleError

#: the graph input name of the page store
STORE_NAME = "page:store"
#: updates whose gradient is an input (op -> its index): the scheduled gradient graph reads
#: it there
GRADIENT_INPUT = {"sgd_update": 1, "qsgd_update": 1}
#: a fused gradient+update (passes/fuse.fuse_weight_grad_update: int8 and float convolutions
#: and linear layers, embeddings) never materializes its gradient; the scheduled gradient
#: graph runs the gradient op it fuses (fused op -> that op) on its operands (inputs 0 and 1,
#: the unit copies the schedule made current there), whole
UNFUSED = {**{fused: op for op, fused in FLOAT_GRAD_UPDATE.items()}, EMBEDDING_GRAD_UPDATE: "embedding_grad",
           GRAD_UPDATE_OP: "qconv2d_grad_weight"}


class PageStore:
    """The file standing for secondary storage: `nbytes` bytes at `path` (a temporary file,
    deleted with this object, unless a path was given), mapped as `array` (int8 memmap)."""

    def __init__(self, nbytes: int, path=None, name: str = STORE_NAME):
        self.name, self.nbytes = name, int(nbytes)
        if path is None:
            fd, path = tempfile.mkstemp(prefix="edgetrain-pages-", suffix=".bin")
            os.close(fd)
            weakref.finalize(self, _unlink, path)
        self.path = str(path)
        with open(self.path, "r+b" if os.path.exists(self.path) else "w+b") as f:
            f.truncate(max(self.nbytes, 1))
        self.array = np.memmap(self.path, dtype=np.int8, mode="r+", shape=(self.nbytes,))

    def __repr__(self) -> str:
        return f"PageStore({self.nbytes:,} B at {self.path})"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def unit_storages(problem, roots=None) -> dict[int, tuple[Value, ...]]:
    """{unit: its storage roots} (the roots its non-view nodes produce), in node order."""
    g = problem.graph
    roots = roots or storage_roots(g)
    out = {}
    for u in problem.units:
        out[u.index] = tuple(o for p in u.nodes for o in g.nodes[p].outputs if roots[o] is o)
    return out


def paged_activations(sched: Schedule) -> frozenset:
    """The units `sched` pages out to the page store: not the mapped frozen weights (Unit.frozen),
    which are in the weights file already and come back by being read (remat/weights.py)."""
    return frozenset(u for u in sched.page_out if not sched.problem.units[u].frozen)


def page_layout(problem, sched: Schedule, roots=None) -> tuple[dict[Value, int], int]:
    """({storage root: byte offset in the store}, store bytes) for the units paged out."""
    storages = unit_storages(problem, roots)
    offsets, end = {}, 0
    for u in sorted(paged_activations(sched)):
        got = sum(r.type.nbytes for r in storages[u])
        if got != problem.units[u].bytes:
            raise ScheduleError(f"unit {problem.units[u].name}: its storages take {got} B, the problem says "
                                f"{problem.units[u].bytes} B")
        for r in storages[u]:
            offsets[r] = end
            end = align_up(end + r.type.nbytes, ALIGNMENT)
    return offsets, end


def rewrite_graph(problem, sched: Schedule, offsets: dict, store: Optional[Value]) -> Graph:
    """The train graph of `problem` running `sched` (module docstring); `store` is the page
    store's graph input (None when nothing is paged), `offsets` from `page_layout`."""
    g = problem.graph
    nodes, b0, units = g.nodes, problem.forward_end, problem.units
    if problem.stages and [p for st in problem.stages for p in st.nodes] != list(range(b0, len(nodes))):
        raise ScheduleError("the problem's stages do not cover the backward positions in order")
    roots = storage_roots(g)
    storages = unit_storages(problem, roots)
    unit_of: dict[Value, int] = {}  # every value a node unit's nodes produce -> the unit
    for u in units:
        for p in u.nodes:
            for o in nodes[p].outputs:
                unit_of[o] = u.index
    out: list[Node] = []
    cur_store = store

    # --- 1. the forward, with page-outs after each paged unit's last node ---------------------
    paged_after: dict[int, list[int]] = {}
    for u in sorted(paged_activations(sched)):
        if not units[u].nodes:
            raise ScheduleError(f"{units[u].name} is a graph input: it cannot be paged")
        paged_after.setdefault(max(units[u].nodes), []).append(u)
    for p in range(b0):
        out.append(nodes[p])
        for u in paged_after.get(p, ()):
            for r in storages[u]:
                nxt = new_value(cur_store.type, cur_store.name)
                out.append(Node("page_out", (cur_store, r), (nxt,), {"offset": offsets[r]}))
                cur_store = nxt

    # --- 2. stages: page-ins, recomputations, then the fixed nodes ------------------------------
    forward_copy = {u.index: {o: o for p in u.nodes for o in nodes[p].outputs} for u in units}
    here: dict[int, dict[Value, Value]] = {}

    def current(v: Value, s: int, local: Optional[dict] = None) -> Value:
        if local is not None and v in local:
            return local[v]
        u = unit_of.get(v)
        if u is None:
            return v
        if u not in here:
            raise ScheduleError(f"stage {s} reads {v} of {units[u].name}, which is neither carried into the "
                                f"stage, recomputed nor paged in there")
        return here[u][v]

    for s, st in enumerate(problem.stages):
        prev = here
        here = {}
        for u in sched.resident[s]:
            here[u] = forward_copy[u] if s == 0 else prev[u]
        for u in sched.page_in[s]:
            if units[u].frozen:  # read from the mapped weights file by its readers: no node
                here[u] = {}
                continue
            if cur_store is None:
                raise ScheduleError(f"stage {s} pages in {units[u].name} but nothing was paged out")
            m: dict[Value, Value] = {}
            for r in storages[u]:
                x = new_value(r.type, r.name)
                out.append(Node("page_in", (cur_store,), (x,), {"offset": offsets[r], "shape": r.shape,
                                                                  "dtype": r.dtype}))
                m[r] = x
            for p in units[u].nodes:  # the unit's views, over the paged-in storage
                n = nodes[p]
                shares = dict(get_op(n.op).shares)
                if shares and not get_op(n.op).mutates and all(n.inputs[j] in m for j in shares.values()):
                    outs = tuple(new_value(o.type, o.name) for o in n.outputs)
                    out.append(Node(n.op, tuple(current(v, s, m) for v in n.inputs), outs, n.attrs))
                    m.update(zip(n.outputs, outs))
            here[u] = m
        for u in sched.recompute[s]:
            m = {}
            for p in units[u].nodes:
                n = nodes[p]
                outs = tuple(new_value(o.type, o.name) for o in n.outputs)
                out.append(Node(n.op, tuple(current(v, s, m) for v in n.inputs), outs, n.attrs))
                m.update(zip(n.outputs, outs))
            here[u] = m
        for p in st.nodes:
            n = nodes[p]
            ins = tuple(current(v, s) for v in n.inputs)
            out.append(n if ins == n.inputs else Node(n.op, ins, n.outputs, n.attrs))
    bad = [v for v in g.outputs if v in unit_of]
    if bad:
        raise ScheduleError(f"graph output {bad[0]} belongs to a unit")
    g = g.replace(nodes=tuple(out))
    return g.with_inputs({store: Role.PAGE_STORE}) if store is not None else g


def gradient_graph(prog, train: Graph) -> Optional[Graph]:
    """The scheduled train graph without its updates, returning the gradients they read as
    `grad:<param>` (the outputs of `prog.grad_graph`; `prog` a compiled program): a fused
    gradient+update is replaced by its gradient op (UNFUSED) at its place, reading what the
    fused node read, so the gradient is the one the scheduled step applies, stored whole.
    None when a trained parameter's update is neither (no gradient to return)."""
    named = train.named_outputs()
    producer = {o: n for n in train.nodes for o in n.outputs}
    want = dict(zip(prog.grad_graph.output_names, prog.grad_graph.outputs))
    updates, grads, unfused = set(), {}, {}
    for p in prog.trainable:
        n = producer.get(named.get(p))
        if n is None or (n.op not in GRADIENT_INPUT and n.op not in UNFUSED):
            return None
        updates.add(n)
        if n.op in GRADIENT_INPUT:
            grads[grad_name(p)] = n.inputs[GRADIENT_INPUT[n.op]]
            continue
        expect = want.get(grad_name(p))
        if expect is None:
            return None
        op = UNFUSED[n.op]
        gw = new_value(get_op(op).infer([v.type for v in n.inputs[:2]], split_attrs(n.attrs)[0])[0])
        unfused[n] = [Node(op, n.inputs[:2], (gw,), split_attrs(n.attrs)[0])]
        if gw.type.shape != expect.type.shape:  # an int8 linear's (o, k, 1, 1) gradient as its (o, k) weight
            shaped = new_value(TensorType(expect.type.shape, gw.type.dtype))
            unfused[n].append(Node("reshape", (gw,), (shaped,), {"shape": expect.type.shape}))
            gw = shaped
        grads[grad_name(p)] = gw
    for k in prog.grad_graph.output_names:  # the loss, as the unscheduled graph returns it
        if k not in grads and k in named:
            grads[k] = named[k]
    names = [k for k in prog.grad_graph.output_names if k in grads]
    if names != list(prog.grad_graph.output_names):
        return None
    nodes = tuple(m for n in train.nodes for m in unfused.get(n, () if n in updates else (n,)))
    g = train.replace(nodes=nodes, outputs=tuple(grads[k] for k in names), output_names=tuple(names))
    g = eliminate_dead_code(g)
    used = {v for n in g.nodes for v in n.inputs} | set(g.outputs)
    keep = set(g.inputs_with(Role.DATA, Role.LABEL))  # fed even when unread, as the unscheduled graph takes them
    return verify(g.replace(inputs=tuple(v for v in g.inputs if v in used or v in keep)))


def apply_schedule(compiled, sched: Schedule, page_file=None):
    """`compiled` (a CompiledProgram) running `sched`: another compiled program whose train
    graph is rewritten (module docstring), with its memory report, its `schedule` and its
    `page_store` (the file pages go to: `page_file`, else a temporary file). Its gradient
    graph runs the scheduled graph without the updates (gradient_graph: a fused
    gradient+update's gradient computed whole instead). `Program.apply` runs it
    with a runner of the program's kind."""
    problem = sched.problem
    if compiled.schedule is not None:
        raise ScheduleError("this program already runs a schedule: schedule and apply to the original program")
    if problem.graph is not compiled.train_graph and problem.graph != compiled.train_graph:
        raise ScheduleError("the schedule was made for another program's train graph")
    offsets, nbytes = page_layout(problem, sched)
    store = PageStore(nbytes, page_file) if paged_activations(sched) else None
    store_v = new_value(TensorType((nbytes,), STORE_DTYPE), STORE_NAME) if store is not None else None
    train = verify(rewrite_graph(problem, sched, offsets, store_v))
    grad = gradient_graph(compiled, train)
    memory = plan_graph(train, compiled.trainable, compiled.initial_state)  # as compile's plan phase
    return replace(compiled, train_graph=train, grad_graph=grad if grad is not None else compiled.grad_graph,
                   stages={**compiled.stages, "scheduled": train}, memory=memory, schedule=sched,
                   page_store=store)


def measured_peak(prog, trace) -> int:
    """RAM a scheduled program held at its peak in the reference run `trace`: the runtime's
    live arena bytes (no in-place reuse) + what the problem holds all along (fixed_ram)."""
    return trace.peak_bytes + prog.schedule.problem.fixed_ram
