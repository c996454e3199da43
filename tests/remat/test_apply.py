"""Schedules executed: a program rewritten to recompute and page as a schedule says runs in
the reference runtime and the C backend with gradients bit-equal to the unscheduled
program's, at most the schedule's RAM, and exactly its page traffic, to a real file."""
from __future__ import annotations

import copy
import functools
import re

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.devices import get_device
from edgetrain.ops import verify
from edgetrain.remat import ScheduleError, make_schedule
from edgetrain.remat.apply import STORE_NAME, measured_peak, unit_storages
from edgetrain.remat.build import build_problem
from edgetrain.remat.greedy import ram_lower_bound
from edgetrain.remat.plan import Infeasible
from edgetrain.remat.solvers import SOLVERS

DEVICE = get_device("a72")
#: every zoo model at an input small enough for the reference runtime to take a step in well
#: under a second; where the batch allows, activations rather than one weight gradient (a
#: fixed tensor: ResNet-18's 9.4 MB layer4 conv) set the peak, so budgets below it can fit
ZOO = {
    "mbv2-w0.35": ((2, 3, 48, 48), {}),
    "mcunet-5fps": ((2, 3, 48, 48), {}),
    "proxyless-w0.3": ((2, 3, 48, 48), {}),
    "resnet18": ((2, 3, 64, 64), {}),
    "resnet18-cifar": ((4, 3, 32, 32), {}),
    "bert-tiny": ((2, 32), {"vocab_size": 256}),
    "ds-cnn": ((2, 1, 49, 10), {}),  # MLPerf Tiny's (models/mlperf_tiny.py): their sizes are the architecture
    # at 640 inputs its fixed 640x128 weight gradients set the peak: a narrow one has activations do it
    "ad-autoencoder": ((64, 64), {"inputs": 64, "hidden": 32}),
}
#: RAM budgets: how far from the smallest RAM that can fit (0) to the plain peak (1)
BUDGETS = (1.0, 0.5, 0.1)
#: (model, budget) where ram_lower_bound is below every schedule's peak by more than 10% of the
#: range: the autoencoder's chain of dense + batch-norm layers (104.0 KB bound, 106.0 KB fits)
LOWER_BOUND_GAPS = {("ad-autoencoder", 0.1)}
#: seconds the MILP may take per schedule (it returns its best schedule and gap then)
MILP_SECONDS = 1.5


class Tiny(nn.Module):
    """conv/bn/relu, a skip connection, a flatten view and a linear head."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 5)

    def forward(self, x):
        a = self.c1(x)
        return self.fc((torch.relu(self.c2(a)) + a).flatten(1))


class Case:
    """A compiled program, a batch, and the unscheduled program's gradients and one step."""

    def __init__(self, prog, x, y):
        self.prog, self.x, self.y = prog, x, y
        self.problem = build_problem(prog, DEVICE)
        self.grads = prog.gradients(x, y) if _has_gradients(prog) else None
        plain = copy.copy(prog)
        plain.state = {k: np.array(v, copy=True) for k, v in prog.state.items()}
        self.loss = plain.step(x, y)
        self.stepped = plain.state


def _has_gradients(prog) -> bool:
    return prog.quantize is None


@functools.lru_cache(maxsize=None)
def zoo_case(name: str) -> Case:
    shape, kw = ZOO[name]
    gen = torch.Generator().manual_seed(0)
    model = et.models.get(name, **kw)
    if name == "bert-tiny":
        x = torch.randint(0, kw["vocab_size"], shape, generator=gen)
    else:
        x = torch.randn(shape, generator=gen)
    y = np.arange(shape[0]) % 10
    return Case(et.compile(model, (x,)), x, y)


@functools.lru_cache(maxsize=None)
def tiny_case(quantize=None) -> Case:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    return Case(et.compile(Tiny().eval(), (x,), quantize=quantize), x, np.array([1, 3]))


def hand_schedule(problem, policy):
    """A schedule from a per-unit policy, "keep" / "page" / "recompute": a paged or recomputed
    unit is brought back at every stage that reads it (and its inputs for a recomputation);
    a unit that must stay resident (held) or cannot be paged / recomputed is kept."""
    us, S = problem.units, len(problem.stages)
    need = [set() for _ in us]
    held = [set() for _ in us]
    for st in problem.stages:
        for u in st.needs:
            need[u].add(st.index)
    for u in us:
        for first, last in u.holds:
            held[u.index].update(range(first, last + 1))
            need[u.index].update(range(first, last + 1))
    pol = {}
    for u in us:
        p = policy(u)
        if not u.nodes or any(f == 0 for f, _ in u.holds) or (p == "page" and not u.pageable):
            p = "keep"
        pol[u.index] = p
    for u in reversed(us):
        if pol[u.index] != "recompute":
            continue
        if any(s > u.recompute_until for s in need[u.index]):
            pol[u.index] = "page" if u.pageable else "keep"
            continue
        for s in need[u.index] - held[u.index]:
            for v in u.inputs:
                need[v].add(s)
    keep, page_out = set(), set()
    resident, recompute, page_in = ([set() for _ in range(S)] for _ in range(3))
    for u in us:
        i, p = u.index, pol[u.index]
        if not need[i]:
            continue
        if p == "keep":
            keep.add(i)
            for s in range(max(need[i]) + 1):
                resident[s].add(i)
            continue
        if p == "page":
            page_out.add(i)
        for s in need[i]:
            (resident if s in held[i] else page_in if p == "page" else recompute)[s].add(i)
    return make_schedule(problem, "hand", keep=keep, page_out=page_out, resident=resident, recompute=recompute,
                         page_in=page_in, solve_s=0.0)


def mixed(u):
    """Every other unit paged, the rest recomputed: recomputations read paged-in units."""
    return "page" if u.index % 2 else "recompute"


def budget(problem, frac: float) -> int:
    """RAM `frac` of the way from the least that can fit to the plain schedule's peak."""
    lo, hi = ram_lower_bound(problem), problem.fixed_ram + problem.activation_bytes
    return lo + int(frac * (hi - lo))


def check_run(case: Case, sched, ram=None, page_file=None):
    """Run `sched` on `case`'s program: gradients and one step equal the unscheduled
    program's bit for bit; measured RAM <= the schedule's peak (<= ram); page traffic as
    planned, to the page file."""
    prog = case.prog.apply(sched, page_file)
    assert prog.schedule is sched and prog.train_graph is not case.prog.train_graph
    verify(prog.train_graph)
    if case.grads is not None:
        grads = prog.gradients(case.x, case.y)
        assert grads.keys() == case.grads.keys()
        for k in grads:
            assert np.array_equal(grads[k], case.grads[k]), f"{sched.solver}: gradient of {k} differs"
    loss = prog.step(case.x, case.y)
    assert loss == case.loss
    for k, v in case.stepped.items():
        assert np.array_equal(prog.state[k], v), f"{sched.solver}: {k} differs after one step"
    trace = prog.runner.last_trace
    assert trace.peak_bytes == prog.memory.activation_bytes, "the runtime and the liveness analysis agree"
    assert measured_peak(prog, trace) <= sched.peak_bytes, sched.peak_where
    if ram is not None:
        assert sched.peak_bytes <= ram
    assert trace.paged_in_bytes == sched.page_in_bytes
    assert trace.paged_out_bytes == sched.page_out_bytes
    assert (prog.page_store is not None) == bool(sched.page_out)
    return prog, trace


# --- rewriting ---------------------------------------------------------------------------------
def test_rewrite_inserts_what_the_schedule_says(tmp_path):
    case = tiny_case()
    pr = case.problem
    sched = hand_schedule(pr, mixed)
    assert sched.recomputations and sched.page_ins
    prog, _ = check_run(case, sched, page_file=tmp_path / "pages.bin")
    ops = [n.op for n in prog.train_graph.nodes]
    storages = unit_storages(pr)
    assert ops.count("page_out") == sum(len(storages[u]) for u in sched.page_out)
    assert ops.count("page_in") == sum(len(storages[u]) for p in sched.page_in for u in p)
    assert len(ops) >= len(pr.graph.nodes) + sched.recomputations + ops.count("page_in")
    assert prog.page_store.path == str(tmp_path / "pages.bin")
    assert prog.train_graph.input(STORE_NAME).type.nbytes == prog.page_store.nbytes
    assert prog.memory.frozen_bytes == case.prog.memory.frozen_bytes, "the page store is not flash"
    data = (tmp_path / "pages.bin").read_bytes()
    assert len(data) == prog.page_store.nbytes and any(data)


@pytest.mark.parametrize("policy", ["keep", "page", "recompute", "mixed"])
def test_hand_schedules_run_as_planned(policy):
    case = tiny_case()
    sched = hand_schedule(case.problem, mixed if policy == "mixed" else lambda u: policy)
    check_run(case, sched)


@pytest.mark.parametrize("policy", ["page", "recompute", "mixed"])
def test_int8_program_steps_as_unscheduled(policy):
    """An int8 program's weight gradients are fused into their updates: one step must give
    the unscheduled program's weights and loss bit for bit."""
    case = tiny_case("int8")
    sched = hand_schedule(case.problem, mixed if policy == "mixed" else lambda u: policy)
    assert sched.recomputations or sched.page_ins
    check_run(case, sched)


def test_apply_rejects_foreign_or_nested_schedules():
    a, b = tiny_case(), tiny_case("int8")
    sched = hand_schedule(a.problem, lambda u: "page")
    with pytest.raises(ScheduleError, match="another program"):
        b.prog.apply(sched)
    with pytest.raises(ScheduleError, match="already runs a schedule"):
        a.prog.apply(sched).apply(sched)


def test_fused_updates_give_scheduled_gradients():
    """A fused gradient+update (bert-tiny's embedding) stores no gradient in the step: the
    scheduled program's gradient graph is still its own (the scheduled graph's page-ins and
    recomputations, the fused op's gradient computed whole from what it read), and equals
    the unscheduled gradients bit for bit (check_run)."""
    case = zoo_case("bert-tiny")
    assert "embedding_grad_update" in {n.op for n in case.prog.train_graph.nodes}
    sched = hand_schedule(case.problem, mixed)
    prog = case.prog.apply(sched)
    ops = [n.op for n in prog.grad_graph.nodes]
    assert "page_in" in ops and "embedding_grad" in ops and "embedding_grad_update" not in ops
    assert len(ops) > len(case.prog.grad_graph.nodes)  # the recomputations and page-ins
    check_run(case, sched)


# --- every zoo model at three budgets ----------------------------------------------------------
def test_zoo_table_covers_the_zoo():
    assert set(ZOO) == set(et.models.names())


@pytest.mark.parametrize("frac", BUDGETS)
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_schedules_run_as_planned(name, frac):
    case = zoo_case(name)
    ram = budget(case.problem, frac)
    if (name, frac) in LOWER_BOUND_GAPS:  # a known gap, held here so that closing it shows
        with pytest.raises(Infeasible, match="the smallest RAM that fits is") as err:
            SOLVERS["milp"](case.problem, ram, None, MILP_SECONDS)
        # the error carries the figure its message states (the largest one it names), above the budget
        stated = max(int(v.replace(",", "")) for v in re.findall(r"(\d[\d,]*) bytes", str(err.value)))
        assert err.value.smallest_ram == stated > ram
        return
    sched = SOLVERS["milp"](case.problem, ram, None, MILP_SECONDS)
    check_run(case, sched, ram)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_paging_and_recomputation_run_as_planned(name):
    case = zoo_case(name)
    sched = hand_schedule(case.problem, mixed)
    assert sched.recomputations and sched.page_ins
    check_run(case, sched)


# --- the C backend -------------------------------------------------------------------------------
def test_c_backend_pages_to_a_file_as_planned():
    """The emitted C pages through et_page.h to the page file: the same traffic, and the
    unscheduled C program's gradients and step bit for bit (same kernels, same data)."""
    from edgetrain.backends.c.host import CRunner, to_c_program

    case = tiny_case()
    cprog = to_c_program(case.prog)
    want = cprog.gradients(case.x, case.y)
    sched = hand_schedule(case.problem, mixed)
    assert sched.recomputations and sched.page_ins
    sp = cprog.apply(sched)
    assert isinstance(sp.runner, CRunner) and sp.runner.c_layout.page_bytes == sp.page_store.nbytes
    assert "et_page_write" in sp.runner.c_files["model.c"] and "et_page_read" in sp.runner.c_files["model.c"]
    got = sp.gradients(case.x, case.y)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
        np.testing.assert_allclose(got[k], case.grads[k], rtol=1e-4, atol=1e-6)
    # (the gradient graph runs no update: a page-in only an update reads is dropped with it)
    assert sp.runner.last_paged_in_bytes <= sched.page_in_bytes and sp.runner.last_paged_out_bytes == sched.page_out_bytes
    loss = sp.step(case.x, case.y)
    assert (sp.runner.last_paged_in_bytes, sp.runner.last_paged_out_bytes) == (sched.page_in_bytes, sched.page_out_bytes)
    assert loss == cprog.step(case.x, case.y)
    for k in cprog.state:
        assert np.array_equal(sp.state[k], cprog.state[k]), k
    assert sp.runner.check_guards()


def test_cortex_m_refuses_paging(tmp_path):
    from edgetrain.backends.c.cortexm import CortexMError, emit_firmware

    case = tiny_case()
    prog = case.prog.apply(hand_schedule(case.problem, lambda u: "page"))
    with pytest.raises(CortexMError, match="host build only"):
        emit_firmware(prog, tmp_path, samples=[(case.x, case.y)])
