"""Arena planning: invariants on random lifetimes (hypothesis), golden cases, real graphs."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import edgetrain as et
from edgetrain.ir import TensorType, Value, ram_inputs
from edgetrain.memory.arena import (ALIGNMENT, ArenaPlan, align_up, plan_arena,
                                    plan_arena_first_fit_in_order)
from edgetrain.memory.liveness import Lifetime, lifetimes, live_bytes_timeline

PLANNERS = [plan_arena, plan_arena_first_fit_in_order]
#: arena / peak_live allowed on real training graphs
REAL_GRAPH_SLACK = 1.15


def make_lifetimes(spec) -> list[Lifetime]:
    """Lifetimes from (start, end, nbytes) triples, each with its own root."""
    return [Lifetime(Value(i + 1, TensorType((max(b, 0),), "int8"), f"t{i}"), s, e, b)
            for i, (s, e, b) in enumerate(spec)]


def brute_peak(lts, alignment=ALIGNMENT) -> int:
    if not lts:
        return 0
    times = range(min(lt.start for lt in lts), max(lt.end for lt in lts) + 1)
    return max(sum(align_up(lt.nbytes, alignment) for lt in lts if lt.start <= t <= lt.end) for t in times)


def brute_valid(plan: ArenaPlan, lts, alignment=ALIGNMENT) -> None:
    """Pairwise, independent of ArenaPlan.check."""
    span = {lt.root: (plan.offsets[lt.root], plan.offsets[lt.root] + align_up(lt.nbytes, alignment)) for lt in lts}
    for lo, hi in span.values():
        assert lo % alignment == 0 and hi <= plan.size
    for i, a in enumerate(lts):
        for b in lts[i + 1:]:
            if a.start <= b.end and b.start <= a.end and a.nbytes and b.nbytes:
                (alo, ahi), (blo, bhi) = span[a.root], span[b.root]
                assert ahi <= blo or bhi <= alo, (a, b, span[a.root], span[b.root])


sizes = st.one_of(st.just(0), st.integers(1, 40), st.integers(1, 5000))
spans = st.tuples(st.integers(0, 15), st.integers(0, 8), sizes).map(lambda t: (t[0], t[0] + t[1], t[2]))
random_lifetimes = st.lists(spans, max_size=40).map(make_lifetimes)


# --- invariants ----------------------------------------------------------------------------
@pytest.mark.parametrize("planner", PLANNERS)
@settings(max_examples=150, deadline=None)
@given(lts=random_lifetimes)
def test_random_plans_are_valid(planner, lts):
    plan = planner(lts)
    plan.check(lts)
    brute_valid(plan, lts)
    assert set(plan.offsets) == {lt.root for lt in lts}
    assert plan.size >= plan.peak_live == brute_peak(lts)
    assert all(plan.offsets[lt.root] == 0 for lt in lts if lt.nbytes == 0)


@pytest.mark.parametrize("planner", PLANNERS)
@settings(max_examples=50, deadline=None)
@given(spec=st.lists(spans, max_size=30), alignment=st.sampled_from([1, 4, 8, 64]))
def test_other_alignments(planner, spec, alignment):
    lts = make_lifetimes(spec)
    plan = planner(lts, alignment=alignment)
    plan.check(lts)
    brute_valid(plan, lts, alignment)
    assert plan.size >= plan.peak_live == brute_peak(lts, alignment)


@pytest.mark.parametrize("planner", PLANNERS)
@settings(max_examples=50, deadline=None)
@given(spec=st.lists(spans, max_size=30))
def test_deterministic(planner, spec):
    a, b = planner(make_lifetimes(spec)), planner(make_lifetimes(spec))
    assert dict(a.offsets) == dict(b.offsets) and a.size == b.size


def test_check_catches_bad_plans():
    lts = make_lifetimes([(0, 2, 32), (1, 3, 32)])
    a, b = (lt.root for lt in lts)
    with pytest.raises(AssertionError, match="overlap in the arena"):
        ArenaPlan({a: 0, b: 16}, size=64, peak_live=64).check(lts)
    with pytest.raises(AssertionError, match="aligned"):
        ArenaPlan({a: 0, b: 40}, size=96, peak_live=64).check(lts)
    with pytest.raises(AssertionError, match="past the arena size"):
        ArenaPlan({a: 0, b: 32}, size=48, peak_live=64).check(lts)
    with pytest.raises(AssertionError, match="no offset"):
        ArenaPlan({a: 0}, size=64, peak_live=64).check(lts)
    ArenaPlan({a: 0, b: 32}, size=64, peak_live=64).check(lts)


def test_bad_input_is_rejected():
    lts = make_lifetimes([(0, 1, 8)])
    with pytest.raises(ValueError, match="two lifetimes"):
        plan_arena(lts + lts)
    with pytest.raises(ValueError, match="alignment"):
        plan_arena(lts, alignment=0)
    with pytest.raises(ValueError, match="bad lifetime"):
        plan_arena(make_lifetimes([(3, 1, 8)]))


# --- golden cases --------------------------------------------------------------------------
@pytest.mark.parametrize("planner", PLANNERS)
def test_disjoint_in_time_share_offset_zero(planner):
    lts = make_lifetimes([(0, 0, 100), (1, 1, 300), (2, 2, 200)])
    plan = planner(lts)
    assert list(plan.offsets.values()) == [0, 0, 0]
    assert plan.size == plan.peak_live == align_up(300)


@pytest.mark.parametrize("planner", PLANNERS)
def test_chain_reuses_space(planner):
    a, b, c = lts = make_lifetimes([(0, 1, 64), (1, 2, 64), (2, 3, 64)])  # a -> b -> c
    plan = planner(lts)
    assert plan.offsets[a.root] == plan.offsets[c.root] != plan.offsets[b.root]
    assert plan.size == plan.peak_live == 128


@pytest.mark.parametrize("planner", PLANNERS)
def test_fully_overlapping_sum(planner):
    lts = make_lifetimes([(0, 5, 16), (0, 5, 48), (2, 5, 30), (0, 4, 0)])
    plan = planner(lts).check(lts)
    assert plan.size == plan.peak_live == 16 + 48 + 32
    assert plan.offsets[lts[3].root] == 0


def test_empty():
    plan = plan_arena([])
    assert (dict(plan.offsets), plan.size, plan.peak_live) == ({}, 0, 0)


def test_best_fit_takes_the_smallest_gap():
    # At time 5 the long-lived A, C, F leave gaps of 96 B at 128 and 56 B at 288;
    # G (40 B) goes in the smaller one under best fit, the lower one under first fit.
    spec = [(0, 9, 128), (0, 0, 96), (0, 9, 64), (0, 0, 56), (0, 9, 48), (5, 5, 40)]
    lts = make_lifetimes(spec)
    best, first = plan_arena(lts, alignment=8), plan_arena_first_fit_in_order(lts, alignment=8)
    assert [best.offsets[lt.root] for lt in lts] == [0, 128, 224, 288, 344, 288]
    assert [first.offsets[lt.root] for lt in lts] == [0, 128, 224, 288, 344, 128]
    assert best.size == first.size == 392


def many_lifetimes(n: int = 3000, seed: int = 0) -> list:
    """n tensors over 6000 steps, 90% short-lived, up to 100 KB each (bench/planner_speed.py
    times the planners on the same instance)."""
    r = random.Random(seed)
    spec = []
    for _ in range(n):
        s = r.randrange(6000)
        spec.append((s, s + (r.randrange(50) if r.random() < 0.9 else r.randrange(3000)), r.randrange(100_000)))
    return make_lifetimes(spec)


@pytest.mark.parametrize("planner", PLANNERS)
def test_3000_random_tensors(planner):
    lts = many_lifetimes()
    plan = planner(lts)  # its speed: bench/planner_speed.py
    plan.check(lts)
    assert plan.size >= plan.peak_live


# --- real training graphs ------------------------------------------------------------------
# Measured (arena / peak_live, alignment 16, batch 1, 3x64x64):
#   mbv2-w0.35 LastK(1): 155 lifetimes, 393,232 / 393,232 = 1.0000 (first fit in order: 1.208)
#   mbv2-w0.35 Full():   457 lifetimes, 2,868,752 / 2,867,984 = 1.0003 (first fit in order: 1.001)
@pytest.fixture(scope="module", params=[et.LastK(1), et.Full()], ids=["LastK1", "Full"])
def mbv2_program(request):
    torch.manual_seed(0)
    model = et.models.get("mbv2-w0.35", num_classes=10)
    return et.compile(model, (torch.randn(1, 3, 64, 64),), update=request.param)


def test_real_graph_arena(mbv2_program):
    prog = mbv2_program
    g = prog.train_graph
    lts = lifetimes(g, ram_inputs(g))
    plan = plan_arena(lts).check(lts)
    plan_arena_first_fit_in_order(lts).check(lts)
    aligned = [Lifetime(lt.root, lt.start, lt.end, align_up(lt.nbytes)) for lt in lts]
    assert plan.peak_live == max(live_bytes_timeline(g, aligned))
    assert plan.peak_live >= prog.memory.activation_bytes
    assert plan.size <= REAL_GRAPH_SLACK * plan.peak_live


def test_inplace_merges_share_one_offset_and_shrink_the_arena():
    """An elementwise chain a -> relu -> b -> neg -> c: each output may take its dying
    input's place, so the three tensors need one slot; check() accepts the shared offsets
    and still rejects a plan that ignores them."""
    import torch

    import edgetrain as et
    from edgetrain.memory.arena import merge_lifetimes
    from edgetrain.memory.liveness import inplace_merges

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    prog = et.compile(model, (torch.randn(8, 64),), update=et.Full())
    g = prog.train_graph
    lts = lifetimes(g, ram_inputs(g))
    merges = inplace_merges(g, lts)
    assert merges, "the relu / relu_grad / add chain offers in-place reuse"
    plan = plan_arena(lts, merges=merges).check(lts, merges)
    for a, b in merges:
        assert plan.offsets[a] == plan.offsets[b]
    joined, _ = merge_lifetimes(lts, merges)
    assert len(joined) == len(lts) - len(merges)
    assert plan.size <= plan_arena(lts).size
    assert prog.memory.arena_bytes == plan.size


@settings(max_examples=100, deadline=None)
@given(lts=random_lifetimes, data=st.data())
def test_random_inplace_merges_keep_the_plan_valid(lts, data):
    """In-place pairs (a storage ending at node t, one of the same size starting at t) may
    share an offset; every other pair of time-overlapping storages still may not."""
    candidates = [(a, b) for a in lts for b in lts if a is not b and a.end == b.start and a.nbytes == b.nbytes]
    chosen, used = [], set()
    for a, b in data.draw(st.lists(st.sampled_from(candidates), max_size=8, unique=True) if candidates
                          else st.just([])):
        if a.root not in used and b.root not in used:
            chosen.append((a.root, b.root))
            used.update((a.root, b.root))
    plan = plan_arena(lts, merges=chosen).check(lts, chosen)
    for a, b in chosen:
        assert plan.offsets[a] == plan.offsets[b]
    assert plan.size >= plan.peak_live
    from edgetrain.memory.arena import merge_lifetimes

    _, storage = merge_lifetimes(lts, chosen)
    span = {lt.root: (plan.offsets[lt.root], plan.offsets[lt.root] + align_up(lt.nbytes)) for lt in lts}
    for i, a in enumerate(lts):  # independent pairwise check, in-place pairs excepted
        for b in lts[i + 1:]:
            if storage[a.root] is storage[b.root] or not (a.nbytes and b.nbytes):
                continue
            if a.start <= b.end and b.start <= a.end:
                (alo, ahi), (blo, bhi) = span[a.root], span[b.root]
                assert ahi <= blo or bhi <= alo


def test_a_graph_without_nodes_holds_its_inputs_for_one_step():
    """torch.compile hands over a graph that is only a random draw (Hubert's SpecAugment): its
    input, returned as it is, lives for one step rather than from 0 to -1"""
    from edgetrain.ir import Graph, new_value

    v = new_value(TensorType((1,), "float64"), "random:0")
    g = Graph((v,), (), (v,), ("output",))
    (lt,) = lifetimes(g, {"random:0"})
    assert (lt.start, lt.end, lt.nbytes) == (0, 0, 8)
    assert plan_arena([lt]).size >= 8


def test_the_memory_report_of_a_graph_without_nodes():
    """Such a graph's memory report (plan_memory, which every program makes) has empty timelines:
    the held-bytes timeline of in-place reuse raised IndexError on it (Hubert under torch.compile
    in train())."""
    from edgetrain.ir import Graph, new_value
    from edgetrain.memory import plan_memory

    v = new_value(TensorType((1,), "float64"), "random:0")
    g = Graph((v,), (), (v,), ("output",))
    m = plan_memory(g, {"random:0"}, ())
    assert m.timeline == m.held_timeline == () and m.arena_bytes >= 8
