"""The schedule problem built from compiled programs: its structure and its memory model."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.devices import get_device
from edgetrain.remat.build import build_problem
from edgetrain.remat.plan import ScheduleError, make_schedule


def keep_all(pr):
    """Plain back-propagation in the model's terms: every unit kept while a stage reads it."""
    S = len(pr.stages)
    last = {}
    for s, st in enumerate(pr.stages):
        for u in st.needs:
            last[u] = s
    for u in pr.units:
        for _, b in u.holds:
            last[u.index] = max(last.get(u.index, -1), b)
    return make_schedule(pr, "none", keep=set(last), page_out=(), resident=[{u for u, l in last.items() if l >= s}
                                                                             for s in range(S)],
                         recompute=[()] * S, page_in=[()] * S, solve_s=0.0)


class Skip(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        b = torch.relu(self.c2(a)) + a  # fan-in at a skip connection
        return self.fc(b.mean((2, 3)))


@pytest.fixture(scope="module")
def skip_prog():
    torch.manual_seed(0)
    return et.compile(Skip().eval(), (torch.randn(2, 3, 8, 8),))


def test_units_and_stages_are_well_formed(skip_prog):
    pr = build_problem(skip_prog, get_device("a72"))
    assert pr.forward_end == len(pr.forward_live) > 0
    n = len(pr.graph.nodes)
    seen = set()
    for u in pr.units:
        assert all(i < u.index for i in u.inputs), "units are in topological order"
        assert u.last_forward >= u.produced
        assert u.bytes >= 0 and u.time_s >= 0 and u.energy_j >= 0
        assert all(p < pr.forward_end for p in u.nodes)
        assert not set(u.nodes) & seen
        seen |= set(u.nodes)
    covered = [p for st in pr.stages for p in st.nodes]
    assert covered == list(range(pr.forward_end, n)), "stages cover the backward in order"
    for st in pr.stages:
        assert not set(st.nodes) & seen, "a stage's nodes are fixed, not units"
        assert all(pr.units[u].last_stage >= st.index for u in st.needs)
    # the image is an input unit: never recomputed, read again by the first conv's weight gradient
    x_unit = [u for u in pr.units if not u.nodes]
    assert len(x_unit) == 1 and x_unit[0].recompute_until == -1 and not x_unit[0].pageable
    # the skip tensor a = relu(c1 x) feeds c2 and the add: a unit with two consumers
    assert any(len([v for v in pr.units if u.index in v.inputs]) >= 2 for u in pr.units)


def test_weights_updated_in_place_bound_recomputation(skip_prog):
    pr = build_problem(skip_prog, get_device("a72"))
    nodes = pr.graph.nodes
    for u in pr.units:
        if not u.nodes or u.recompute_until < 0:
            continue
        if u.recompute_until + 1 < len(pr.stages):
            nxt = pr.stages[u.recompute_until + 1]
            # a weight this unit reads is overwritten before the next stage starts
            reads = {v.name for p in u.nodes for v in nodes[p].inputs}
            upd = [n for st in pr.stages[:u.recompute_until + 1] for n in (nodes[p] for p in st.nodes)
                   if n.op == "sgd_update" and n.inputs[0].name in reads]
            assert upd and nxt.nodes[0] > 0


@pytest.mark.parametrize("name", ["resnet18-cifar", "mbv2-w0.35", "bert-tiny", "mcunet-5fps", "proxyless-w0.3",
                                  "resnet18"])
def test_keep_all_model_equals_the_plain_peak(name):
    """The model's memory of plain back-propagation is exactly the runtime's live-bytes peak."""
    model, x = et.models.get(name), et.models.example_input(name)
    prog = et.compile(model, (x,))
    pr = build_problem(prog, get_device("a72"))
    assert pr.activation_bytes == prog.memory.activation_bytes
    assert keep_all(pr).activation_bytes == pr.activation_bytes
    assert pr.fixed_ram == prog.memory.trainable_bytes + prog.memory.frozen_bytes  # a72 keeps weights in RAM
    assert build_problem(prog, get_device("m7")).fixed_ram == prog.memory.trainable_bytes


def test_int8_program_builds(skip_prog):
    torch.manual_seed(0)
    prog = et.compile(Skip().eval(), (torch.randn(2, 3, 8, 8),), quantize="int8")
    pr = build_problem(prog, get_device("m4f"))
    assert keep_all(pr).activation_bytes == pr.activation_bytes == prog.memory.activation_bytes


def test_make_schedule_rejects_reads_of_missing_tensors(skip_prog):
    pr = build_problem(skip_prog, get_device("a72"))
    S = len(pr.stages)
    with pytest.raises(ScheduleError, match="neither kept, recomputed nor paged in"):
        make_schedule(pr, "bad", keep=(), page_out=(), resident=[()] * S, recompute=[()] * S, page_in=[()] * S,
                      solve_s=0.0)
    need = next(s for s, st in enumerate(pr.stages) if st.needs)
    u = pr.units[pr.stages[need].needs[0]]
    page_in = [()] * S
    page_in[need] = (u.index,)
    with pytest.raises(ScheduleError, match="never paged out"):
        make_schedule(pr, "bad", keep=(), page_out=(), resident=[()] * S, recompute=[()] * S, page_in=page_in,
                      solve_s=0.0)


def test_schedule_api_checks_its_arguments(skip_prog):
    with pytest.raises(ValueError, match="solver="):
        et.schedule(skip_prog, solver="gurobi")
    with pytest.raises(ValueError, match="unknown device"):
        et.schedule(skip_prog, device="pi5")
    with pytest.raises(ValueError, match="ram"):
        et.schedule(skip_prog, ram="lots")
    with pytest.raises(ValueError, match="deadline"):
        et.schedule(skip_prog, deadline=-1)
    with pytest.raises(TypeError, match="compiled edgetrain Program"):
        et.schedule(object())
    with pytest.raises(ValueError, match="mip_rel_gap is for the MILP solvers"):
        et.schedule(skip_prog, solver="chen", mip_rel_gap=1e-3)
    with pytest.raises(ValueError, match="mip_rel_gap must be"):
        et.schedule(skip_prog, mip_rel_gap=1.5)


def test_schedule_passes_its_gap_to_the_milp(monkeypatch):
    """et.schedule(mip_rel_gap=...) reaches the MILP (its default gap is on the total energy, so
    a user who cares about the extra energy asks for less); the result carries the solver's
    gap and solve time."""
    from edgetrain.remat import milp
    from edgetrain.remat.solvers import SOLVERS
    from tests.remat.test_apply import budget, tiny_case

    seen = []

    def spy(problem, ram, deadline, time_limit, **kw):
        seen.append(kw)
        return milp.solve_milp(problem, ram, deadline, time_limit, **kw)

    monkeypatch.setitem(SOLVERS, "milp", spy)
    case = tiny_case()
    ram = budget(case.problem, 0.5)
    s = et.schedule(case.prog, ram=ram, mip_rel_gap=0.0, time_limit=5)
    assert seen == [{"mip_rel_gap": 0.0}]
    assert s.recomputations + s.page_ins > 0 and s.status in ("optimal", "time_limit") and 0 < s.solve_s < 15
    assert s.status == "time_limit" or s.gap <= 1e-6
    et.schedule(case.prog, ram=ram, time_limit=1)
    assert seen[-1] == {}  # the default: milp.MIP_REL_GAP


def test_grouped_chains_are_fewer_units_and_still_run_bit_equal():
    """group=True joins cheap elementwise steps to the unit they alone read (conv -> bn -> relu
    becomes one unit); a schedule of that problem still runs with the unscheduled gradients."""
    import numpy as np

    from edgetrain.remat.solvers import SOLVERS

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([1, 3])
    prog = et.compile(model, (x,))
    plain = build_problem(prog, get_device("a72"))
    grouped = build_problem(prog, get_device("a72"), group=True)
    assert len(grouped.units) < len(plain.units)
    assert sum(u.bytes for u in grouped.units) == sum(u.bytes for u in plain.units)
    assert any(len(u.nodes) >= 3 for u in grouped.units), "conv, batch norm and relu in one unit"
    ram = grouped.fixed_ram + (keep_all(grouped).activation_bytes + grouped.activation_bytes) // 2
    sched = SOLVERS["milp"](grouped, ram, None, 30.0)
    assert sched.recomputations + sched.page_ins > 0
    scheduled = prog.apply(sched)
    ref, got = prog.gradients(x, y), scheduled.gradients(x, y)
    assert all(np.array_equal(ref[k], got[k]) for k in ref)
    from edgetrain.remat.apply import measured_peak

    scheduled.step(x, y)
    assert measured_peak(scheduled, scheduled.runner.last_trace) <= sched.peak_bytes <= ram
