"""build_problem: a compiled training program's rematerialization / paging problem.

Pure: reads `prog.train_graph` and the device profile, returns a ScheduleProblem
(problem.py says what it models). Costs come from each op's `cost` (MACs and bytes
touched) through the device's roofline and energy figures; sizes are the tensors' real
dtypes; the backward DAG is the program's own (fan-in at skip connections included).

Two kinds of unit: a *node unit* (a recomputable forward node and the views of its
storage) and an *input unit* (a graph input living in RAM, such as the image, that a node
unit reads: it cannot be recomputed, but a schedule decides how long it stays, since
recomputing the first layer in the backward needs it).
"""
from __future__ import annotations

from dataclasses import replace
from itertools import accumulate
from typing import Optional

from ..ir import Graph, Role, Value, ram_inputs as ram_inputs_of
from ..memory.frozen_window import pages_touched
from ..memory.liveness import lifetimes, storage_roots
from ..ops import get_op
from .problem import ScheduleProblem, Stage, Unit


def build_problem(prog, device, ram_inputs: Optional[set] = None, group: bool = False,
                  mapped_weights: bool = False) -> ScheduleProblem:
    """The schedule problem of `prog` (a compiled Program) on `device` (a devices.Device).
    `group`: join each cheap elementwise node (at most one operation per output element)
    to the unit it alone reads in the forward (conv -> batch norm -> relu chains become one
    unit): fewer units, solved faster, decided together (kept, recomputed or paged as one).
    `mapped_weights`: the frozen weights are mapped from the weights file (the standalone host
    binary's ET_MAP_WEIGHTS): each is a unit (Unit.frozen, weights.py) resident only where the
    schedule says, instead of held in fixed_ram all along (no effect where the device reads its
    weights from flash: they take no RAM there)."""
    from .weights import mapped_frozen

    g: Graph = prog.train_graph
    if ram_inputs is None:
        ram_inputs = ram_inputs_of(g)
    ram_inputs = frozenset(n for n in ram_inputs if _has_input(g, n))
    trainable = tuple(v.name for v, r in zip(g.inputs, g.roles) if v.name in prog.trainable
                      or r is Role.OPTIMIZER_STATE)
    mapped = mapped_frozen(g, ram_inputs, prog.trainable) if mapped_weights and not device.weights_in_flash else {}
    frozen_ram = 0 if device.weights_in_flash else prog.memory.frozen_bytes - sum(mapped.values())
    problem = _build(g, device, ram_inputs, trainable, prog.memory.trainable_bytes + frozen_ram, group,
                     frozenset(mapped))
    return replace(problem, mapped_weights=bool(mapped_weights))


def _has_input(g: Graph, name: str) -> bool:
    return any(v.name == name for v in g.inputs)


def _build(g: Graph, device, ram_inputs: frozenset, trainable: tuple, fixed_ram: int,
           group: bool = False, mapped: frozenset = frozenset()) -> ScheduleProblem:
    nodes, N = g.nodes, len(g.nodes)
    root = storage_roots(g)
    inputs = set(g.inputs)
    out_roots = {root[v] for v in g.outputs}

    # --- the forward phase ends at the first node that depends on the label -------------------
    labelled = set(g.inputs_with(Role.LABEL))
    b0 = N
    for p, n in enumerate(nodes):
        if any(v in labelled for v in n.inputs):
            labelled.update(n.outputs)
            b0 = min(b0, p)
    # --- node units: recomputable forward nodes, views joined to their source's unit ---------
    unit_of: dict[Value, int] = {}  # unit storage root -> unit
    free_vals = set(inputs)  # always available: graph inputs and views of them
    unit_nodes: list[list[int]] = []
    input_unit: dict[Value, int] = {}  # RAM graph input -> its input unit
    fwd_readers: dict[Value, set] = {}  # storage root -> forward nodes reading it
    for p, n in enumerate(nodes[:b0]):
        for v in n.inputs:
            fwd_readers.setdefault(root[v], set()).add(p)
    for p, n in enumerate(nodes[:b0]):
        op = get_op(n.op)
        if op.mutates or getattr(op, "io", None) or any(root[o] in out_roots for o in n.outputs):
            continue
        if not all(v in free_vals or root[v] in unit_of for v in n.inputs):
            continue
        shares = dict(op.shares)
        if shares and len(shares) == len(n.outputs):  # a view
            srcs = {root[n.inputs[j]] for j in shares.values()}
            if all(s in inputs for s in srcs) and all(v in free_vals for v in n.inputs):
                free_vals.update(n.outputs)  # a view of graph inputs: nothing to decide
                continue
            owners = {unit_of.get(s) for s in srcs}
            if len(owners) == 1 and None not in owners:
                unit_nodes[owners.pop()].append(p)
                continue
            continue  # a view over several units' storages: fixed
        if group and len(n.outputs) == 1:
            src = {unit_of[root[v]] for v in n.inputs if root[v] in unit_of}
            if len(src) == 1 and get_op(n.op).cost(n).macs <= n.out.type.numel:
                u = src.pop()
                mine = [r for r, w in unit_of.items() if w == u]
                if u == len(unit_nodes) - 1 and all(fwd_readers.get(r) == {p} for r in mine):
                    unit_nodes[u].append(p)  # a cheap elementwise step of a chain: one unit with it
                    if root[n.out] is n.out:
                        unit_of[n.out] = u
                    continue
        u = len(unit_nodes)
        unit_nodes.append([p])
        for o in n.outputs:
            if root[o] is o:
                unit_of[o] = u
    # RAM inputs (the image) read by a node unit become input units, placed first
    read_inputs = []
    for ns in unit_nodes:
        for p in ns:
            for v in nodes[p].inputs:
                r = root[v]
                if r in inputs and r.name in ram_inputs and r not in input_unit and r not in read_inputs:
                    read_inputs.append(r)
    # mapped frozen weights (build_problem's mapped_weights) read by any node become frozen units, after them;
    # a node whose output is a view of one does not read it (it only points into it)
    for n in nodes:
        views = {root[o] for o in n.outputs}
        for v in n.inputs:
            r = root[v]
            if r in inputs and r.name in mapped and r not in views and r not in read_inputs:
                read_inputs.append(r)
    k = len(read_inputs)
    unit_of = {r: u + k for r, u in unit_of.items()}
    for i, r in enumerate(read_inputs):
        unit_of[r] = i
        input_unit[r] = i
    all_units: list[tuple[int, ...]] = [()] * k + [tuple(ns) for ns in unit_nodes]
    U = len(all_units)
    node_unit = {p: u for u, ns in enumerate(all_units) for p in ns}
    is_frozen = [u < k and read_inputs[u].name in mapped for u in range(U)]

    # --- stages: one starts at every backward fixed node that reads a unit's storage ---------
    def reads(p: int) -> set[int]:
        n = nodes[p]
        views = {root[o] for o in n.outputs}
        return {unit_of[root[v]] for v in n.inputs
                if root[v] in unit_of and not (is_frozen[unit_of[root[v]]] and root[v] in views)}

    starts = [b0] if b0 < N else []
    for p in range(b0 + 1, N):
        if reads(p):
            starts.append(p)
    stage_of_pos = [-1] * N
    for s, a in enumerate(starts):
        b = starts[s + 1] if s + 1 < len(starts) else N
        for p in range(a, b):
            stage_of_pos[p] = s
    S = len(starts)

    # --- who reads each unit where (views of a unit's storage keep it alive) ------------------
    lts = lifetimes(g, set(ram_inputs))
    last_read: dict[Value, int] = {}  # value -> last position reading it (N-1 for outputs)
    for p, n in enumerate(nodes):
        for v in n.inputs:
            last_read[v] = p
    for v in g.outputs:
        last_read[v] = N - 1
    last_forward = [-1] * U
    needs: list[set[int]] = [set() for _ in range(S)]
    holds: list[list[tuple[int, int]]] = [[] for _ in range(U)]
    unit_inputs: list[set[int]] = [set() for _ in range(U)]
    for p, n in enumerate(nodes):
        mine = node_unit.get(p)
        for u in reads(p):
            if p < b0:
                last_forward[u] = max(last_forward[u], p)
            if mine is not None:
                if u != mine:
                    unit_inputs[mine].add(u)
            elif p >= b0:
                needs[stage_of_pos[p]].add(u)
        if mine is None:  # a fixed view of a unit's storage keeps the storage alive while it lives
            for o in n.outputs:
                u = unit_of.get(root[o])
                if u is None or root[o] is o or is_frozen[u]:  # a view of a mapped weight holds no pages
                    continue
                end = last_read.get(o, p)
                if end < b0:
                    last_forward[u] = max(last_forward[u], end)
                elif p < b0:
                    holds[u].append((0, stage_of_pos[end]))
                else:
                    needs[stage_of_pos[p]].add(u)
                    if stage_of_pos[end] > stage_of_pos[p]:
                        holds[u].append((stage_of_pos[p] + 1, stage_of_pos[end]))
    produced = [min(ns) if ns else 0 for ns in all_units]
    for u in range(U):
        last_forward[u] = max(last_forward[u], max(all_units[u], default=0))

    # --- recomputation stops at the stage where a weight the unit reads is updated in place ---
    mutated_at: dict[Value, int] = {}
    for p, n in enumerate(nodes):
        op = get_op(n.op)
        if op.mutates:
            for _, j in op.shares:
                if j < len(n.inputs):
                    mutated_at.setdefault(root[n.inputs[j]], p)
    recompute_until = [S - 1] * U
    for u, ns in enumerate(all_units):
        if not ns:
            recompute_until[u] = -1
        for p in ns:
            for v in nodes[p].inputs:
                m = mutated_at.get(root[v])
                if m is not None:
                    recompute_until[u] = min(recompute_until[u], stage_of_pos[m] if m >= b0 else -1)

    # --- the last stage needing each unit, directly or to recompute a unit that needs it -----
    last_stage = [-1] * U
    for s in range(S):
        for u in needs[s]:
            last_stage[u] = max(last_stage[u], s)
    for u in range(U):
        for _, e in holds[u]:
            last_stage[u] = max(last_stage[u], e)
    for u in reversed(range(U)):
        lim = min(last_stage[u], recompute_until[u])
        for v in unit_inputs[u]:
            last_stage[v] = max(last_stage[v], lim)

    # --- bytes: unit storages, and live bytes of everything else per position ---------------
    ubytes = [0] * U
    for r, u in unit_of.items():  # a mapped weight: the pages it can touch
        ubytes[u] += pages_touched(r.type.nbytes) if is_frozen[u] else r.type.nbytes
    delta_fixed = [0] * (N + 1)
    delta_fwd = [0] * (N + 1)
    plain = [0] * (N + 1)
    for lt in lts:
        plain[lt.start] += lt.nbytes
        plain[lt.end + 1] -= lt.nbytes
        u = unit_of.get(lt.root)
        if u is None:
            delta_fixed[lt.start] += lt.nbytes
            delta_fixed[lt.end + 1] -= lt.nbytes
        else:
            end = min(lt.end, last_forward[u], b0 - 1)
            if lt.start <= end:
                delta_fwd[lt.start] += lt.nbytes
                delta_fwd[end + 1] -= lt.nbytes
    fixed_at, fwd_at, plain_at = (list(accumulate(d[:N])) for d in (delta_fixed, delta_fwd, plain))
    frozen_at = [sum(ubytes[u] for u in reads(p) if is_frozen[u]) for p in range(b0)]  # read, so resident
    forward_live = tuple(fixed_at[p] + fwd_at[p] + frozen_at[p] for p in range(b0))

    # --- costs ------------------------------------------------------------------------------------
    t_node, e_node = [], []
    for n in nodes:
        c = get_op(n.op).cost(n)
        t_node.append(device.node_time_s(c.macs, c.bytes))
        e_node.append(device.node_energy_j(c.macs, c.bytes))
    units = []
    for u, ns in enumerate(all_units):
        b = ubytes[u]
        name = read_inputs[u].name if u < k else (nodes[ns[0]].outputs[0].name or nodes[ns[0]].op)
        fz = is_frozen[u]  # in the weights file already: paged out for nothing
        units.append(Unit(index=u, name=f"{name}@{produced[u]}", nodes=ns, bytes=b,
                          time_s=sum(t_node[p] for p in ns), energy_j=sum(e_node[p] for p in ns),
                          page_out_s=0.0 if fz else device.page_out_s(b),
                          page_out_j=0.0 if fz else device.page_out_j(b),
                          page_in_s=device.page_in_s(b), page_in_j=device.page_in_j(b),
                          inputs=tuple(sorted(unit_inputs[u])), produced=produced[u], last_forward=last_forward[u],
                          last_stage=last_stage[u], recompute_until=recompute_until[u], holds=tuple(holds[u]),
                          pageable=(bool(ns) or fz) and b > 0, frozen=fz))
    stages = []
    for s, a in enumerate(starts):
        b = starts[s + 1] if s + 1 < S else N
        stages.append(Stage(index=s, nodes=tuple(range(a, b)), needs=tuple(sorted(needs[s])),
                            fixed_bytes=fixed_at[a], rest_bytes=max((fixed_at[p] for p in range(a + 1, b)), default=0),
                            time_s=sum(t_node[a:b]), energy_j=sum(e_node[a:b])))
    return ScheduleProblem(device=device, graph=g, units=tuple(units), stages=tuple(stages),
                           forward_live=forward_live, fixed_ram=fixed_ram, base_time_s=sum(t_node),
                           base_energy_j=sum(e_node), activation_bytes=max(plain_at, default=0),
                           ram_inputs=ram_inputs, trainable=trainable)

