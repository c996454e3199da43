"""update="auto": the sparse scheme with the largest summed contribution that fits a memory
budget (Tiny Training, MCUNetV3, section 3.2), found from measured gains and measured
costs, then compiled and checked.

Pieces and groups: one group for "biases of the last k layers" (k from the contribution
table) and one per analysed layer ("its weights at ratio r"), each with a "none" option.
Only pieces whose measured gain clears the noise (SIGNIFICANCE standard errors) and that
of every smaller piece of their group are offered (`offered`).

Costs come from compiled programs, never a formula: the baseline (classifier only) and,
for each offered piece, baseline + piece, compiled as the caller compiles (same model,
quantization, optimizer). A piece adds its trained weights (and optimizer state) to SRAM,
exactly additive, and may raise the arena (saved activations, gradient buffers). Arena
growth is far from additive: on mbv2-w0.35 the summed backward-pass growth of five
pieces was 3.5 times the real one, because the pieces share the backward working set,
and the arena is mostly set by the forward pass. So a scheme's predicted peak is

    baseline trainable + sum of the pieces' trainable + max(baseline arena, each piece's arena)

The exact search maximises the summed gain under this model: for each arena level L (the
baseline's or a piece's), keep the pieces whose arena is at most L and solve the
multiple-choice knapsack over trainable bytes with `solve_exact` (capacity: budget -
baseline trainable - L); the best level wins. The evolutionary search gets the same
prediction as a non-additive cost. The chosen scheme is compiled; if its real peak is
over the budget (the prediction was low), the internal budget is lowered by the error
(by at most half of what it has above the baseline's peak) and the search repeated, at
most MAX_ROUNDS times; the program returned always fits (at worst the baseline). If the
baseline does not fit, InfeasibleBudget names its peak.

When no piece clears the significance floor (a table measured on few images: its standard
error is large), the search falls back to the pieces with a positive measured gain, and
with none of those to the baseline; `SearchInfo.fallback` says which and why, and an
AutoFallbackWarning is issued.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Hashable

from ..trainable import Sparse
from .contribution import SIGNIFICANCE, ContributionTable
from .search import GAIN_TIE_RTOL, InfeasibleBudget, Option, evolutionary_search, solve_exact

SEARCHES = ("exact", "evolutionary")
#: solve -> compile -> check rounds; each lowers the internal budget by the last error, and
#: the prediction is within a few KB on the paper's models: two rounds are typical
MAX_ROUNDS = 8
NONE = "none"  # the "do not train this" choice of every group
# a piece is offered only if its gain exceeds SIGNIFICANCE (contribution.py) standard errors
# of a gain (`ContributionTable.stderr`): with ~70 measured pieces, some gain a few points by
# chance alone, and the search would pick exactly those (one-sided 2.3 % false positives)


class AutoFallbackWarning(UserWarning):
    """update="auto" could not choose as designed (no piece clears the significance floor)
    and fell back; `SearchInfo.fallback` says to what."""


@dataclass(frozen=True)
class Measured:
    """What a compiled program holds at its peak (bytes)."""

    peak: int
    arena: int
    trainable: int
    weights: tuple[str, ...] = ()  # the weight of each layer Sparse can name, by index

    @classmethod
    def of(cls, prog) -> "Measured":
        m = prog.memory
        weights = tuple(layer.weight for layer in prog.layers if layer.kind in ("conv", "linear"))[:-1]
        return cls(m.peak_bytes, m.arena_bytes, m.trainable_bytes, weights)


@dataclass(frozen=True)
class Piece:
    """One offered option: its contribution, and its cost measured on baseline + piece."""

    choice: Hashable  # ("bias", k) or ("weight", layer, ratio)
    gain: float
    trainable: int  # trained bytes added to the baseline's
    arena: int  # arena of the program baseline + this piece


@dataclass(frozen=True)
class SolverRun:
    method: str
    scheme: Sparse
    gain: float
    predicted_peak: int
    seconds: float
    evaluations: int
    pieces: tuple[Piece, ...] = ()  # the chosen pieces


@dataclass(frozen=True)
class Round:
    budget: int  # the internal budget the solver worked with
    scheme: Sparse
    predicted_peak: int
    peak: int  # real peak of the compiled scheme


@dataclass(frozen=True)
class SearchInfo:
    """How update="auto" chose `scheme` (on the program: `prog.search`)."""

    budget: int
    search: str  # the solver whose scheme was compiled
    scheme: Sparse
    predicted_gain: float  # summed contribution of the scheme
    predicted_accuracy: float  # the table's baseline accuracy + predicted_gain (gains add up only roughly)
    predicted_peak: int
    peak: int  # the compiled program's real peak
    base_peak: int  # the baseline's (classifier only): the smallest budget that fits
    exact: SolverRun  # both solvers at the last round's internal budget
    evolutionary: SolverRun
    rounds: tuple[Round, ...]
    pieces: tuple[Piece, ...]
    compiles: int  # compiles by the cache so far
    seconds: float
    fallback: str = ""  # why the search chose among weaker evidence ("": it did not)

    def summary(self) -> str:
        note = f"; fallback: {self.fallback}" if self.fallback else ""
        return (f"{self.scheme} for {self.budget / 1024:,.0f} KB: summed gain {100 * self.predicted_gain:+.1f} "
                f"points, peak {self.peak / 1024:,.1f} KB "
                f"(predicted {self.predicted_peak / 1024:,.1f} KB), {self.search} search; "
                f"exact gain {100 * self.exact.gain:+.1f} in {self.exact.seconds:.2f} s, evolutionary "
                f"{100 * self.evolutionary.gain:+.1f} in {self.evolutionary.seconds:.2f} s; "
                f"{len(self.rounds)} round(s), {self.compiles} compiles, {self.seconds:.0f} s{note}")


def scheme_of(choices) -> Sparse:
    bias, weights = 0, {}
    for c in choices:
        if c == NONE:
            continue
        if c[0] == "bias":
            bias = max(bias, c[1])
        else:
            weights[c[1]] = c[2]
    return Sparse(bias_last=bias, weights=weights)


class CostCache:
    """Compiles schemes and remembers what each holds (`measured`: {scheme: Measured}), and
    the last program it compiled until someone asks for it (programs are large: only that
    one is kept, and handed out once). Keep one per model and compile settings to reuse
    measured costs across budgets."""

    def __init__(self, compile_fn: Callable[[Sparse], object]):
        self.compile_fn, self.measured, self.compiles = compile_fn, {}, 0
        self._last: tuple = (None, None)  # (scheme, program)

    def program(self, scheme: Sparse):
        """The compiled program of `scheme` (compiled again unless it was the last one)."""
        if self._last[0] == scheme:
            prog, self._last = self._last[1], (None, None)
            return prog
        prog = self.compile_fn(scheme)
        self.compiles += 1
        self.measured[scheme] = Measured.of(prog)
        self._last = (scheme, prog)
        return prog

    def measure(self, scheme: Sparse) -> Measured:
        if scheme not in self.measured:
            self.program(scheme)
        return self.measured[scheme]


def offered(gains: dict, floor: float = 0.0) -> list:
    """The keys (sizes: bias depth or channel ratio) worth offering: a gain above `floor`
    and above that of every smaller size in the group. A larger piece of one group never
    costs less (it trains a superset: more bytes in SRAM, a backward pass at least as
    deep), so one that gains no more is dominated and need not be compiled."""
    out, best = [], floor
    for key in sorted(gains):
        if gains[key] > best:
            out.append(key)
            best = gains[key]
    return out


def _pieces(table: ContributionTable, base: Measured, cache: CostCache, floor: float) -> list[list[Piece]]:
    """Groups of offered pieces (gain above `floor`), each with its measured cost."""
    def piece(choice, gain, scheme):
        m = cache.measure(scheme)
        return Piece(choice, gain, max(0, m.trainable - base.trainable), m.arena)

    groups = [[piece(("bias", k), table.bias_gains[k], Sparse(bias_last=k))
               for k in offered(table.bias_gains, floor)]]
    for i in sorted({i for i, _ in table.weight_gains}):
        gains = {r: g for (j, r), g in table.weight_gains.items() if j == i}
        groups.append([piece(("weight", i, r), gains[r], Sparse(weights={i: r})) for r in offered(gains, floor)])
    none = Piece(NONE, 0.0, 0, base.arena)
    return [[none] + g for g in groups if g]


def predicted_peak(pieces, base: Measured) -> int:
    return base.trainable + sum(p.trainable for p in pieces) + max([base.arena] + [p.arena for p in pieces])


def _options(group: list[Piece]) -> list[Option]:
    return [Option(p.choice, p.gain, p.trainable) for p in group]


def solve_levels(groups: list[list[Piece]], base: Measured, budget: int) -> SolverRun:
    """The best scheme under the predicted peak: one knapsack (solve_exact) per arena level."""
    t0 = time.perf_counter()
    best, method, evaluations = None, "milp", 0
    # the baseline's own level is always there: with no groups the answer is the baseline
    for level in sorted({base.arena} | {max(base.arena, p.arena) for g in groups for p in g}):
        capacity = budget - base.trainable - level
        if capacity < 0:
            break
        sub = [[p for p in g if p.arena <= level] for g in groups]
        r = solve_exact([_options(g) for g in sub], capacity)
        evaluations += 1
        method = r.method
        chosen = [g[j] for g, j in zip(sub, r.indices)]
        if best is None or _better(r.gain, predicted_peak(chosen, base), best[0], best[1]):
            best = (r.gain, predicted_peak(chosen, base), chosen)
    if best is None:
        raise InfeasibleBudget(budget, predicted_peak([], base), "the baseline, training only the classifier")
    gain, peak, chosen = best
    return SolverRun(f"exact ({method}, {evaluations} arena levels)", scheme_of(p.choice for p in chosen),
                     gain, peak, time.perf_counter() - t0, evaluations, tuple(chosen))


def _better(gain: float, peak: int, best_gain: float, best_peak: int) -> bool:
    """More gain (beyond float noise), or as much for a smaller peak."""
    tol = GAIN_TIE_RTOL * max(1.0, abs(best_gain))
    return gain > best_gain + tol or (gain >= best_gain - tol and peak < best_peak)


def solve_evolutionary(groups: list[list[Piece]], base: Measured, budget: int, seed: int = 0) -> SolverRun:
    """The paper's evolutionary search with the predicted peak as its (non-additive) cost."""
    def cost(genome):
        return predicted_peak([g[j] for g, j in zip(groups, genome)], base)

    r = evolutionary_search([_options(g) for g in groups], budget, cost=cost, seed=seed)
    chosen = tuple(g[j] for g, j in zip(groups, r.indices))
    # the peak from `cost` itself (with no groups the search reports a cost of 0)
    return SolverRun("evolutionary", scheme_of(r.choices), r.gain, predicted_peak(chosen, base), r.seconds,
                     r.evaluations, chosen)


def search_scheme(table: ContributionTable, budget: int, cache: CostCache, search: str = "exact",
                  seed: int = 0) -> tuple[object, SearchInfo]:
    """(program, SearchInfo): the compiled scheme that maximises the table's summed gain
    with a real peak within `budget` bytes. `cache` compiles (and remembers) schemes."""
    if search not in SEARCHES:
        raise ValueError(f"search={search!r}: use one of {SEARCHES}")
    t0 = time.perf_counter()
    base = cache.measure(Sparse())  # compiled once per cache, whatever the budget
    if base.peak > budget:
        raise InfeasibleBudget(budget, base.peak, "the baseline, training only the classifier")
    table.check_layers(base.weights)
    groups, fallback = _offered_groups(table, base, cache)
    internal, rounds, best = budget, [], (None, None, base.peak)
    for _ in range(MAX_ROUNDS):
        exact = solve_levels(groups, base, internal)
        evo = solve_evolutionary(groups, base, internal, seed)
        pick = exact if search == "exact" else evo
        if pick.scheme == Sparse():
            break
        peak = cache.measure(pick.scheme).peak
        rounds.append(Round(internal, pick.scheme, pick.predicted_peak, peak))
        if peak <= budget:
            best = (pick, cache.program(pick.scheme), peak)
            break
        # assume this prediction's error recurs, but give up at most half the slack per round
        internal = min(internal - 1, max(budget - (peak - pick.predicted_peak), (internal + base.peak) // 2))
        if internal < base.peak:  # no room left above the baseline, which fits: take it
            break
    pick, prog, peak = best
    if prog is None:  # nothing beyond the classifier fits or gains: the baseline itself
        prog = cache.program(Sparse())
    info = SearchInfo(budget=budget, search=search, scheme=pick.scheme if pick else Sparse(),
                      predicted_gain=pick.gain if pick else 0.0,
                      predicted_accuracy=table.base_accuracy + (pick.gain if pick else 0.0),
                      predicted_peak=pick.predicted_peak if pick else predicted_peak([], base), peak=peak,
                      base_peak=base.peak, exact=exact, evolutionary=evo, rounds=tuple(rounds),
                      pieces=tuple(p for g in groups for p in g if p.choice != NONE),
                      compiles=cache.compiles, seconds=time.perf_counter() - t0, fallback=fallback)
    if fallback:
        warnings.warn(f"update='auto' fell back: {fallback}; chose {info.scheme}", AutoFallbackWarning,
                      stacklevel=2)
    return prog, info


def _offered_groups(table: ContributionTable, base: Measured, cache: CostCache) -> tuple[list, str]:
    """(groups of offered pieces, why a fallback was needed or ""). Pieces must clear the
    significance floor; when none does, those with a positive measured gain are the best
    evidence there is (and with none of those either, the baseline is what remains)."""
    floor = SIGNIFICANCE * table.stderr
    groups = _pieces(table, base, cache, floor)
    if groups or floor <= 0:
        return groups, ("" if groups else "no piece has a positive measured gain: only the classifier is trained")
    groups = _pieces(table, base, cache, 0.0)
    why = (f"no piece's gain clears the significance floor of {100 * floor:.2f} points ({SIGNIFICANCE:g} standard "
           f"errors of the contribution table; measure it on more images to lower it)")
    if groups:
        return groups, why + ": chose among the pieces with a positive measured gain"
    return groups, why + " and none has a positive gain: only the classifier is trained"
