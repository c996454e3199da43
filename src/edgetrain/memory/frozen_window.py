"""The frozen weights resident during a step whose frozen tensors are mapped from a file.

A host program that maps its weights file (backends/c/weights_file.py, ET_MAP_WEIGHTS) reads a
frozen tensor's pages from the page cache when a kernel first touches them, and drops the pages
of a large one (at least `release_min` bytes) after the node that reads it when the next node
does not read it too. So the frozen bytes resident at a node are the large tensors it (and the
node before it, when they share one) reads, plus every small frozen tensor read so far (never
dropped; counted by their bytes, as they lie side by side in the file), plus the partial pages at
the ends of the dropped ones (only whole pages inside a tensor are dropped); never more than the
pages of every frozen byte. `frozen_window` walks a graph's node order and gives the most at once; a
step's modelled RAM is then arena + state held in RAM + that window, instead of + every frozen
byte. Not modelled: the kernel's fault-around (Linux maps up to 64 KiB of pages already in the
page cache around a faulting one, which can hold pages of a neighbouring tensor until that one is
dropped) and the page cache itself (shared, reclaimable, not the process's RSS).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

#: the page size the model rounds to (the host's: x86-64 and most aarch64 Linux)
PAGE_BYTES = 4096


@dataclass(frozen=True)
class FrozenWindow:
    """Bytes. `peak_bytes`: the most frozen bytes resident at once (page-rounded), at node
    `at_node`; `total_bytes`: every frozen tensor's bytes (what an unmapped program holds);
    `kept_bytes`: those of the small tensors, never dropped once read."""

    peak_bytes: int
    at_node: int
    total_bytes: int
    kept_bytes: int


def pages_touched(n: int, page: int = PAGE_BYTES) -> int:
    """Bytes of the pages a tensor of n bytes at an unknown (64-byte aligned) offset can touch."""
    return 0 if n <= 0 else (-(-n // page) + 1) * page


def frozen_window(reads: Sequence[Iterable[str]], sizes: Mapping[str, int], release_min: int,
                  page: int = PAGE_BYTES) -> FrozenWindow:
    """The resident frozen bytes of a node order: `reads[i]` names the frozen tensors node i reads
    (views resolved to the tensor they view), `sizes` their bytes; a tensor of at least
    `release_min` bytes is dropped after a node that reads it unless the next node reads it too,
    leaving at most two partial pages."""
    reads = [set(r) for r in reads]
    unknown = {n for r in reads for n in r} - set(sizes)
    if unknown:
        raise KeyError(f"frozen_window: no size for {sorted(unknown)[:3]}")
    def held(name):  # a small tensor shares its pages with its neighbours in the file: its bytes
        return pages_touched(sizes[name], page) if sizes[name] >= release_min else sizes[name]

    resident: dict[str, int] = {}
    peak, at = 0, -1
    for i, r in enumerate(reads):
        for name in r:
            resident[name] = held(name)
        now = sum(resident.values())
        if now > peak:
            peak, at = now, i
        later = reads[i + 1] if i + 1 < len(reads) else set()
        for name in r:
            if sizes[name] >= release_min and name not in later:
                resident[name] = min(2 * page, pages_touched(sizes[name], page))
    total = sum(sizes.values())
    kept = sum(b for b in sizes.values() if b < release_min)
    return FrozenWindow(min(peak, pages_touched(total, page)), at, total, kept)
