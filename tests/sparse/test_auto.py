"""update="auto": the driver's logic on fake programs (exact under its cost model, the
tightening loop, infeasible budgets), then compile() end to end on a small model."""
import itertools
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import edgetrain as et
from edgetrain.sparse import ContributionError, ContributionTable
from edgetrain.sparse.auto import (MAX_ROUNDS, SIGNIFICANCE, AutoFallbackWarning, CostCache, Measured, Piece, offered,
                                   predicted_peak, search_scheme, solve_evolutionary, solve_levels)
from edgetrain.trainable import Layer
from edgetrain.sparse.search import InfeasibleBudget

from .nets import task, tiny_auto_case

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

N_LAYERS = 6
NAMES = tuple(f"l{i}.weight" for i in range(N_LAYERS))
KB = 1024


# ---------------------------------------------------------------- fake programs

def fake_table(seed=0):
    rng = np.random.default_rng(seed)
    return ContributionTable("fake", NAMES, 0.5, {k: float(rng.uniform(-0.01, 0.05)) for k in (1, 3, 6)},
                             {(i, r): float(rng.uniform(-0.01, 0.04)) for i in range(2, N_LAYERS)
                              for r in (0.25, 1.0)})


def fake_memory(scheme: et.Sparse, extra_per_piece: int = 0):
    """A program's memory: 100 KB forward arena; biases 1 KB per layer; weights 4 KB x ratio
    per layer; a weight of layer i or a bias depth k raises the backward arena to
    40 KB x depth (depth = layers from the top it reaches). `extra_per_piece` adds arena
    per piece beyond the first: the non-additivity that the prediction misses."""
    depths = [N_LAYERS - i for i in scheme.weights] + ([scheme.bias_last] if scheme.bias_last else [])
    pieces = len(scheme.weights) + (1 if scheme.bias_last else 0)
    arena = max([100 * KB] + [40 * KB * d for d in depths]) + extra_per_piece * max(0, pieces - 1)
    trainable = 512 + scheme.bias_last * KB + sum(int(4 * KB * r) for r in scheme.weights.values())
    layers = tuple(Layer("conv", i, n, ()) for i, n in enumerate(NAMES)) + (Layer("linear", 9, "fc.weight", ()),)
    return SimpleNamespace(memory=SimpleNamespace(peak_bytes=arena + trainable, arena_bytes=arena,
                                                  trainable_bytes=trainable), layers=layers, scheme=scheme)


def fake_cache(extra_per_piece=0):
    return CostCache(lambda s: fake_memory(s, extra_per_piece))


def brute_force(groups, base, budget):
    best = None
    for combo in itertools.product(*groups):
        peak = predicted_peak(combo, base)
        gain = sum(p.gain for p in combo)
        better = best is None or gain > best[0] + 1e-12 or (abs(gain - best[0]) <= 1e-12 and peak < best[1])
        if peak <= budget and better:
            best = (gain, peak)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_exact_levels_match_brute_force_and_beat_evolutionary(seed):
    rng = np.random.default_rng(seed)
    base = Measured(peak=60_000, arena=50_000, trainable=10_000)
    groups = [[Piece("none", 0.0, 0, base.arena)]
              + [Piece(("weight", g, (0.25, 0.5, 1.0)[j]), float(rng.uniform(0, 1)), int(rng.integers(0, 20_000)),
                       int(rng.integers(30_000, 90_000))) for j in range(3)] for g in range(4)]
    for budget in (60_000, 75_000, 90_000, 120_000, 200_000):
        exact = solve_levels(groups, base, budget)
        gain, peak = brute_force(groups, base, budget)
        assert exact.gain == pytest.approx(gain) and exact.predicted_peak == peak <= budget
        assert predicted_peak(exact.pieces, base) == exact.predicted_peak
        evo = solve_evolutionary(groups, base, budget)
        assert evo.predicted_peak <= budget and evo.gain <= exact.gain + 1e-12


def test_offered_pieces_gain_more_than_every_smaller_one():
    assert offered({0.125: 0.01, 0.25: 0.005, 0.5: 0.02, 1.0: 0.02}) == [0.125, 0.5]
    assert offered({4: -0.01, 8: 0.0, 12: 0.03}) == [12]
    assert offered({1: -0.1}) == []


def test_pieces_within_the_noise_are_not_offered():
    assert offered({0.25: 0.01, 0.5: 0.03, 1.0: 0.05}, floor=0.02) == [0.5, 1.0]
    table = fake_table()
    noisy = ContributionTable(table.model, table.layers, table.base_accuracy, table.bias_gains, table.weight_gains,
                              stderr=0.03 / SIGNIFICANCE)
    _, info = search_scheme(noisy, 10_000 * KB, fake_cache())
    assert info.pieces and all(p.gain > 0.03 for p in info.pieces)
    assert len(info.pieces) < len(search_scheme(table, 10_000 * KB, fake_cache())[1].pieces)


def test_search_fits_and_takes_every_best_piece_when_memory_is_plenty():
    table = fake_table()
    prog, info = search_scheme(table, 10_000 * KB, fake_cache())
    best_bias = max(table.bias_gains, key=table.bias_gains.get)
    assert info.scheme.bias_last == best_bias
    for i in range(2, N_LAYERS):
        gains = {r: g for (j, r), g in table.weight_gains.items() if j == i}
        if max(gains.values()) > 0:
            assert info.scheme.weights[i] == min(r for r, g in gains.items() if g == max(gains.values()))
        else:
            assert i not in info.scheme.weights
    assert info.peak == prog.memory.peak_bytes <= info.budget and prog.scheme == info.scheme
    assert info.predicted_gain == pytest.approx(info.exact.gain) and len(info.rounds) == 1
    # only offered pieces were compiled, each once, plus the baseline and the final scheme
    n = len(offered(table.bias_gains)) + sum(len(offered({r: g for (j, r), g in table.weight_gains.items() if j == i}))
                                             for i in range(N_LAYERS))
    assert len(info.pieces) == n and info.compiles == n + 2


@pytest.mark.parametrize("budget_kb", [101, 110, 130, 170, 250])
def test_search_under_tight_budgets_fits_and_exact_beats_evolutionary(budget_kb):
    cache = fake_cache()
    prog, info = search_scheme(fake_table(1), budget_kb * KB, cache)
    assert prog.memory.peak_bytes == info.peak <= budget_kb * KB
    assert info.exact.gain >= info.evolutionary.gain - 1e-12
    # the prediction is exact for these fake programs: one round
    assert info.predicted_peak == info.peak and len(info.rounds) <= 1
    prog2, info2 = search_scheme(fake_table(1), budget_kb * KB, cache, search="evolutionary")
    assert prog2.memory.peak_bytes <= budget_kb * KB and info2.predicted_gain == pytest.approx(info2.evolutionary.gain)


def test_search_tightens_until_the_real_peak_fits():
    """Each extra piece costs 30 KB more than predicted: rounds lower the internal budget."""
    budget = 180 * KB
    prog, info = search_scheme(fake_table(1), budget, fake_cache(extra_per_piece=30 * KB))
    assert prog.memory.peak_bytes <= budget and 1 < len(info.rounds) <= MAX_ROUNDS
    assert [r.budget for r in info.rounds] == sorted((r.budget for r in info.rounds), reverse=True)
    assert all(r.peak > budget for r in info.rounds[:-1]) and info.rounds[-1].peak <= budget


def test_infeasible_budget_names_the_baseline_peak():
    base_peak = fake_memory(et.Sparse()).memory.peak_bytes
    with pytest.raises(InfeasibleBudget, match=f"smallest budget that fits is {base_peak} bytes") as err:
        search_scheme(fake_table(), base_peak - 1, fake_cache())
    assert err.value.min_budget == base_peak
    _, info = search_scheme(fake_table(), base_peak, fake_cache())
    assert info.scheme == et.Sparse() and info.peak == base_peak


def test_table_of_another_model_is_refused():
    other = ContributionTable("other", ("x.weight",), 0.5, {1: 0.1}, {})
    with pytest.raises(ContributionError, match="measured on a model with 1 layers"):
        search_scheme(other, 10_000 * KB, fake_cache())


# ---------------------------------------------------------------- compile() end to end

@pytest.fixture(scope="module")
def tiny():
    return tiny_auto_case()


@pytest.mark.parametrize("extra", [1024, 1 << 20])
def test_compile_auto_fits_the_budget(tiny, extra):
    model, x, table, base = tiny
    budget = et.Budget(sram=base + extra)
    prog = et.compile(model, (x,), update="auto", budget=budget, quantize="int8", contributions=table)
    info = prog.search
    assert prog.memory.peak_bytes == info.peak <= budget.sram and info.base_peak == base
    assert prog.scheme == info.scheme and isinstance(info.scheme, et.Sparse)
    assert info.exact.gain >= info.evolutionary.gain - 1e-12
    assert math.isclose(info.predicted_accuracy, table.base_accuracy + info.predicted_gain)
    assert np.isfinite(prog.step(task(1)[0], task(1)[1]))
    if extra == 1 << 20:  # plenty: every group's best piece
        assert info.scheme == et.Sparse(bias_last=8, weights={3: 1.0, 6: 0.25, 7: 1.0})


def test_compile_auto_infeasible_names_the_smallest_budget(tiny):
    model, x, table, base = tiny
    with pytest.raises(et.BudgetError, match=f"smallest budget that fits is {base} bytes"):
        et.compile(model, (x,), update="auto", budget=et.Budget(sram=base - 1), quantize="int8",
                   contributions=table)


def test_compile_auto_reads_a_table_path_and_checks_arguments(tiny, tmp_path):
    model, x, table, base = tiny
    path = table.save(tmp_path / "tiny.json")
    prog = et.compile(model, (x,), update="auto", budget=et.Budget(sram=base + 2048), quantize="int8",
                      contributions=str(path), search="evolutionary")
    assert prog.search.search == "evolutionary" and prog.memory.peak_bytes <= base + 2048
    with pytest.raises(ValueError, match="analyze_contributions"):
        et.compile(model, (x,), update="auto", budget=et.Budget(sram="1MB"), quantize="int8")
    with pytest.raises(ValueError, match=r"budget=edgetrain.Budget\(sram=...\)"):
        et.compile(model, (x,), update="auto", quantize="int8", contributions=table)
    with pytest.raises(ValueError, match="search="):
        et.compile(model, (x,), update="auto", budget=et.Budget(sram="1MB"), contributions=table, search="greedy")
    with pytest.raises(ValueError, match="update='manual'"):
        et.compile(model, (x,), update="manual")
    with pytest.raises(ValueError, match="only with update='auto'"):
        et.compile(model, (x,), update=et.Full(), contributions=table)
    with pytest.raises(ContributionError, match="quantize='int8'"):
        et.compile(model, (x,), update="auto", budget=et.Budget(sram="1MB"),
                   contributions=ContributionTable("tiny", table.layers, 0.4, {}, {}, {"quantize": "int8"}))


def test_no_piece_clears_the_floor_falls_back_instead_of_calling_the_budget_infeasible():
    """Issue 18 item 9: with a table measured on few images (large standard error) no piece
    cleared the floor, the search had no arena level and said "budget of 131072 bytes is
    infeasible: the smallest budget that fits is 6600 bytes"."""
    table = fake_table()
    noisy = ContributionTable(table.model, table.layers, table.base_accuracy, table.bias_gains, table.weight_gains,
                              stderr=1.0)  # a floor of 200 points: nothing clears it
    with pytest.warns(AutoFallbackWarning, match="significance floor"):
        prog, info = search_scheme(noisy, 10_000 * KB, fake_cache())
    assert "positive measured gain" in info.fallback and "fallback:" in info.summary()
    # the fallback is the best the measured gains allow: the same scheme as with no floor at all
    assert info.scheme == search_scheme(table, 10_000 * KB, fake_cache())[1].scheme != et.Sparse()
    assert prog.memory.peak_bytes == info.peak <= 10_000 * KB and info.pieces


def test_no_positive_gain_at_all_trains_the_classifier_and_says_so():
    table = ContributionTable("fake", NAMES, 0.5, {1: -0.01, 3: 0.0}, {(2, 1.0): -0.02}, stderr=0.5)
    for t in (table, ContributionTable("fake", NAMES, 0.5, {1: -0.01}, {})):  # with and without a floor
        with pytest.warns(AutoFallbackWarning, match="only the classifier"):
            prog, info = search_scheme(t, 10_000 * KB, fake_cache())
        assert info.scheme == et.Sparse() and not info.pieces
        assert info.peak == info.base_peak == prog.memory.peak_bytes
        assert info.exact.predicted_peak == info.evolutionary.predicted_peak == info.predicted_peak


def test_an_infeasible_budget_message_never_contradicts_itself():
    assert "smallest budget that fits is 101" in str(InfeasibleBudget(100, 101))
    with pytest.raises(AssertionError, match="internal error"):
        InfeasibleBudget(131072, 6600)
