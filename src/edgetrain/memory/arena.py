"""Static memory planning: one arena, an offset for every storage lifetime.

Two tensors may share addresses only if their lifetimes (inclusive node-index intervals,
`liveness.lifetimes`) do not overlap. `plan_arena` is the greedy-by-size best-fit packer
of TFLite Micro's and the Tiny Training Engine's planners: the largest tensors are placed
first, each in the smallest gap left between already placed tensors that are live at the
same time, or above them all. `plan_arena_first_fit_in_order` is the simple baseline and
the test oracle for validity: tensors in schedule order, each at the lowest gap that fits.

Both are pure functions `lifetimes -> ArenaPlan`; `ArenaPlan.check` verifies a plan
independently of how it was made (no two time-overlapping tensors share an address).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import numpy as np

from ..ir import Value
from .liveness import Lifetime

#: Byte alignment of every tensor's offset (and so of its padded size): SIMD loads on
#: Cortex-M (LDRD / the Helium and NEON vector loads) and CMSIS-NN kernels want 4- to
#: 16-byte aligned buffers; 16 covers all of them and 128-bit host SIMD.
ALIGNMENT = 16


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """`n` rounded up to a multiple of `alignment`."""
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class ArenaPlan:
    """`offsets`: the byte offset in the arena of every lifetime's root; `size`: arena
    bytes (max of offset + aligned size); `peak_live`: the most aligned bytes live at one
    time, a lower bound on `size` for any plan."""

    offsets: Mapping[Value, int]
    size: int
    peak_live: int
    alignment: int = ALIGNMENT

    def check(self, lifetimes: Sequence[Lifetime], merges: Sequence[tuple[Value, Value]] = ()) -> "ArenaPlan":
        """Raise AssertionError if a lifetime has no or a misaligned offset, ends past
        `size`, or shares addresses with a lifetime that overlaps it in time (storages
        joined by an in-place `merges` pair must share their offset). Returns self."""
        joined, storage = merge_lifetimes(lifetimes, merges)
        for lt in lifetimes:
            assert lt.root in self.offsets, f"{lt.root} (nodes {lt.start}..{lt.end}) has no offset"
            s = storage[lt.root]
            assert self.offsets[lt.root] == self.offsets[s], f"{lt.root} is reused in place but not at {s}'s offset"
        rows = []
        for lt in joined:  # each storage once, its members checked to share its offset above
            off, n = self.offsets[lt.root], align_up(lt.nbytes, self.alignment)
            assert off >= 0 and off % self.alignment == 0, \
                f"{lt.root} at offset {off} is not {self.alignment}-byte aligned"
            assert off + n <= self.size, f"{lt.root} spans [{off}, {off + n}) past the arena size {self.size}"
            if n:
                rows.append((lt.start, lt.end, off, off + n, lt))
        rows.sort(key=lambda r: r[:4])
        if not rows:
            return self
        start, end, lo, hi = (np.array([r[k] for r in rows], dtype=np.int64) for k in range(4))
        for i in range(len(rows)):
            # rows after i that start while i is live (starts are sorted)
            last = int(np.searchsorted(start, end[i], side="right"))
            clash = np.flatnonzero((lo[i + 1:last] < hi[i]) & (lo[i] < hi[i + 1:last]))
            if clash.size:
                a, b = rows[i][4], rows[i + 1 + int(clash[0])][4]
                raise AssertionError(
                    f"{a.root} (nodes {a.start}..{a.end}, bytes [{lo[i]}, {hi[i]})) and "
                    f"{b.root} (nodes {b.start}..{b.end}, bytes [{self.offsets[b.root]}, "
                    f"{self.offsets[b.root] + align_up(b.nbytes, self.alignment)})) are live at the same "
                    f"time and overlap in the arena")
        return self


def merge_lifetimes(lifetimes: Sequence[Lifetime],
                    merges: Sequence[tuple[Value, Value]] = ()) -> tuple[list[Lifetime], dict[Value, Value]]:
    """Lifetimes with each in-place chain (input root, output root), ... joined into one
    storage (the first root; from the earliest start to the latest end, the largest size),
    and the map from every root to the root of its storage."""
    if not merges:
        return list(lifetimes), {lt.root: lt.root for lt in lifetimes}
    parent = {lt.root: lt.root for lt in lifetimes}

    def find(v):
        while parent[v] is not v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for a, b in merges:
        ra, rb = find(a), find(b)
        if ra is not rb:
            parent[rb] = ra
    groups: dict[Value, list[Lifetime]] = {}
    for lt in lifetimes:
        groups.setdefault(find(lt.root), []).append(lt)
    merged = [Lifetime(r, min(x.start for x in m), max(x.end for x in m), max(x.nbytes for x in m))
              for r, m in groups.items()]
    return merged, {lt.root: find(lt.root) for lt in lifetimes}


def storage_spans(lifetimes: Sequence[Lifetime], merges: Sequence[tuple[Value, Value]] = (),
                  alignment: int = ALIGNMENT) -> list[tuple[Lifetime, int, int, int]]:
    """Who holds each arena storage when, with in-place reuse: (member lifetime, first node,
    last node, the storage's aligned bytes) for every lifetime holding bytes. A storage joined
    by `merges` is held by each member from its own start until the next member starts (the
    last one to the storage's end), so at each node a storage counts once. Storages live at
    one node have disjoint addresses in any valid plan: their bytes at a node add up to at
    most the arena's size."""
    joined, storage = merge_lifetimes(lifetimes, merges)
    size = {lt.root: align_up(lt.nbytes, alignment) for lt in joined}
    end = {lt.root: lt.end for lt in joined}
    members: dict[Value, list[Lifetime]] = {}
    for lt in sorted(lifetimes, key=lambda x: x.start):
        members.setdefault(storage[lt.root], []).append(lt)
    spans = []
    for root, ms in members.items():
        for k, m in enumerate(ms):
            last = ms[k + 1].start - 1 if k + 1 < len(ms) else end[root]
            if size[root] and last >= m.start:
                spans.append((m, m.start, last, size[root]))
    return spans


def held_bytes_timeline(spans: Sequence[tuple[Lifetime, int, int, int]], nodes: int) -> list[int]:
    """Arena bytes held at each of `nodes` nodes (`storage_spans`' storages, each once); none for
    a graph without nodes (whose inputs still live one step: liveness.lifetimes)."""
    delta = np.zeros(nodes + 1, dtype=np.int64)
    for _, a, b, n in spans:
        if a < nodes:
            delta[a] += n
            delta[min(b, nodes - 1) + 1] -= n
    return np.cumsum(delta[:-1]).tolist()


def peak_live_bytes(lifetimes: Sequence[Lifetime], alignment: int = ALIGNMENT) -> int:
    """Max over time of the aligned bytes of the lifetimes live at that time."""
    events = sorted([(lt.start, align_up(lt.nbytes, alignment)) for lt in lifetimes]
                    + [(lt.end + 1, -align_up(lt.nbytes, alignment)) for lt in lifetimes])
    peak = acc = 0
    for _, d in events:  # at equal times the frees (negative) come first
        acc += d
        peak = max(peak, acc)
    return peak


# A chooser picks, among the fitting gaps (given as their start offsets and sizes, in
# address order), the index of the gap to use.
Chooser = Callable[[np.ndarray, np.ndarray], int]


def _best_fit(starts: np.ndarray, sizes: np.ndarray) -> int:
    return int(np.argmin(sizes))  # the first (lowest) of the smallest gaps


def _first_fit(starts: np.ndarray, sizes: np.ndarray) -> int:
    return 0


def _pack(lifetimes: Sequence[Lifetime], order: Sequence[int], choose: Chooser, alignment: int) -> ArenaPlan:
    """Place the lifetimes in `order`, each into the gap `choose` picks among the gaps
    between placed tensors that overlap it in time, or above them all when none fits."""
    n = len(lifetimes)
    p_start, p_end, p_lo, p_hi = (np.empty(n, dtype=np.int64) for _ in range(4))
    k = 0  # placed tensors (of nonzero size) occupy rows [0, k)
    offsets: dict[Value, int] = {}
    for i in order:
        lt = lifetimes[i]
        need = align_up(lt.nbytes, alignment)
        if need == 0:
            offsets[lt.root] = 0
            continue
        live = np.flatnonzero((p_start[:k] <= lt.end) & (p_end[:k] >= lt.start))
        off = _gap_offset(p_lo[live], p_hi[live], need, choose)
        offsets[lt.root] = off
        p_start[k], p_end[k], p_lo[k], p_hi[k] = lt.start, lt.end, off, off + need
        k += 1
    size = int(p_hi[:k].max()) if k else 0
    return ArenaPlan(offsets=MappingProxyType({lt.root: offsets[lt.root] for lt in lifetimes}), size=size,
                     peak_live=peak_live_bytes(lifetimes, alignment), alignment=alignment)


def _gap_offset(lo: np.ndarray, hi: np.ndarray, need: int, choose: Chooser) -> int:
    """The offset for `need` bytes among occupied ranges [lo, hi) (any order)."""
    if lo.size == 0:
        return 0
    by_addr = np.argsort(lo, kind="stable")
    lo, hi = lo[by_addr], hi[by_addr]
    top = np.maximum.accumulate(hi)                 # highest end among ranges so far
    gap_start = np.concatenate(([0], top[:-1]))     # a gap runs from there to the next lo
    gap_size = lo - gap_start
    fits = np.flatnonzero(gap_size >= need)
    if fits.size == 0:
        return int(top[-1])
    return int(gap_start[fits[choose(gap_start[fits], gap_size[fits])]])


def _validate(lifetimes: Sequence[Lifetime], alignment: int) -> None:
    if not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"alignment must be a positive int, got {alignment!r}")
    seen: set[Value] = set()
    for lt in lifetimes:
        if lt.root in seen:
            raise ValueError(f"{lt.root} has two lifetimes; each storage root needs exactly one")
        seen.add(lt.root)
        if lt.start > lt.end or lt.nbytes < 0:
            raise ValueError(f"bad lifetime {lt.root}: nodes {lt.start}..{lt.end}, {lt.nbytes} bytes")


#: orders tried by `plan_arena` (the first wins ties): largest first (TFLite's greedy by
#: size), largest size x duration first, longest-lived first, in schedule order, and in
#: reverse order of death
PACKING_ORDERS: tuple[Callable[[Lifetime, int], tuple], ...] = (
    lambda lt, i: (-lt.nbytes, lt.start, i),
    lambda lt, i: (-lt.nbytes * (lt.end - lt.start + 1), lt.start, i),
    lambda lt, i: (-(lt.end - lt.start), -lt.nbytes, i),
    lambda lt, i: (lt.start, -lt.nbytes, i),
    lambda lt, i: (-lt.end, -lt.nbytes, i),
)


def plan_arena(lifetimes: Sequence[Lifetime], alignment: int = ALIGNMENT,
               merges: Sequence[tuple[Value, Value]] = ()) -> ArenaPlan:
    """Greedy best fit: in each of PACKING_ORDERS (largest first, ties: earlier start,
    then input order; ...), each tensor at the smallest gap that holds it among the
    tensors live at the same time; the smallest of these arenas.
    `merges` (input root, output root) pairs share one storage: in-place reuse
    (`liveness.inplace_merges`)."""
    _validate(lifetimes, alignment)
    joined, storage = merge_lifetimes(lifetimes, merges)
    plan = None
    for key in PACKING_ORDERS:  # greedy packing is order-sensitive: keep the smallest arena
        order = sorted(range(len(joined)), key=lambda i: key(joined[i], i))
        candidate = _pack(joined, order, _best_fit, alignment)
        if plan is None or candidate.size < plan.size:
            plan = candidate
    if not merges:
        return plan
    offsets = MappingProxyType({lt.root: plan.offsets[storage[lt.root]] for lt in lifetimes})
    return ArenaPlan(offsets=offsets, size=plan.size, peak_live=plan.peak_live, alignment=alignment)


def plan_arena_first_fit_in_order(lifetimes: Sequence[Lifetime], alignment: int = ALIGNMENT) -> ArenaPlan:
    """Baseline: in schedule order (ties: input order), each at the lowest gap that fits."""
    _validate(lifetimes, alignment)
    order = sorted(range(len(lifetimes)), key=lambda i: (lifetimes[i].start, i))
    return _pack(lifetimes, order, _first_fit, alignment)
