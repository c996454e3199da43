"""MemoryReport: what a compiled training program holds, by kind, at its peak."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from ..ir import Graph, Role
from .arena import ArenaPlan, held_bytes_timeline, plan_arena, storage_spans
from .liveness import inplace_merges, lifetimes, live_bytes_timeline


@dataclass(frozen=True)
class MemoryReport:
    """Bytes. `peak_bytes` (SRAM at the peak) = `arena_bytes` (one statically planned
    arena holding activations, saved tensors, gradients, inputs and temporaries, every
    tensor at a fixed offset: `arena.offsets`; an elementwise op's output reuses a dying
    input's storage in place where the op allows it) + `trainable_bytes` (trained weights
    and their optimizer state, which must sit in RAM; `optimizer_bytes` is the optimizer
    state's part, momentum, which for int8 weights is float32 and outweighs them). `activation_bytes` is the peak of
    live bytes in the node order without in-place reuse (what the reference runtime,
    which allocates every output, holds), so the arena can be below it. Frozen weights,
    buffers and constants are read-only (`flash_bytes`: flash on a microcontroller)."""

    peak_bytes: int
    activation_bytes: int
    trainable_bytes: int
    frozen_bytes: int
    weight_bytes: int
    peak_step: int
    peak_op: str
    timeline: tuple[int, ...]
    ops: tuple[str, ...]
    arena_bytes: int = 0
    arena: ArenaPlan | None = field(default=None, repr=False, compare=False)
    #: of `trainable_bytes`, the optimizer's state (SGD momentum buffers)
    optimizer_bytes: int = 0
    #: arena bytes held at each node with in-place reuse (each storage once, aligned): what
    #: the planned arena holds then, never above `arena_bytes` (`timeline` counts an in-place
    #: result and the input it overwrites twice)
    held_timeline: tuple[int, ...] = ()

    @property
    def flash_bytes(self) -> int:
        """Read-only weights and constants (flash on a microcontroller)."""
        return self.frozen_bytes

    def summary(self) -> str:
        from ..config import format_bytes as kb

        trained = self.trainable_bytes - self.optimizer_bytes
        state = (f"trained weights {kb(trained)} + optimizer state {kb(self.optimizer_bytes)}" if self.optimizer_bytes
                 else f"trained weights {kb(trained)}")
        return (f"peak {kb(self.peak_bytes)} = arena {kb(self.arena_bytes)} (live peak without "
                f"in-place reuse {kb(self.activation_bytes)} at node {self.peak_step}, {self.peak_op}) + {state}; "
                f"flash {kb(self.frozen_bytes)}; all weights {kb(self.weight_bytes)}")

    def plot(self, path) -> str:
        """Draw the arena bytes held per node (PNG) and return the path (reports/memory_timeline.py)."""
        from ..config import format_bytes
        from ..reports.memory_timeline import plot_timeline

        return plot_timeline(self, path, format_bytes)


def trained_channel_bytes(trainable: Mapping[str, object], state: Mapping[str, object]) -> dict[str, int]:
    """For each weight trained on some channels only (`trainable[name]` a ChannelSelect
    with `dim` and `index`), the bytes of those channels: `plan_memory`'s `sram_bytes`."""
    return {p: state[p].nbytes * len(sel.index) // state[p].shape[sel.dim]
            for p, sel in trainable.items() if sel is not None}


def plan_memory(g: Graph, ram_inputs: Iterable[str], trainable: Iterable[str],
                sram_bytes: Optional[Mapping[str, int]] = None) -> MemoryReport:
    """Account every byte of `g` for its node order. `ram_inputs` name the graph inputs
    that live in RAM (data, labels); `trainable` the inputs updated in place (weights and
    optimizer state); all other inputs are read-only, but the page store (role PAGE_STORE),
    which lives in secondary storage and counts nowhere. The optimizer state is the inputs of
    role OPTIMIZER_STATE. `sram_bytes` gives, for a weight
    trained on some channels only, the bytes of those channels: they sit in SRAM and the
    rest of the tensor stays in flash (the weight is stored as its two parts)."""
    ram_inputs, trainable, sram_bytes = set(ram_inputs), set(trainable), dict(sram_bytes or {})
    lts = lifetimes(g, ram_inputs)
    merges = inplace_merges(g, lts)
    arena = plan_arena(lts, merges=merges)
    timeline = live_bytes_timeline(g, lts)
    peak_step = max(range(len(timeline)), key=timeline.__getitem__) if timeline else 0
    activation = timeline[peak_step] if timeline else sum(lt.nbytes for lt in lts)
    t_bytes = frozen = weights = optimizer = 0
    for v, role in zip(g.inputs, g.roles):
        if v.name in ram_inputs or role is Role.PAGE_STORE:
            continue
        in_sram = sram_bytes.get(v.name, v.type.nbytes) if v.name in trainable else 0
        t_bytes += in_sram
        frozen += v.type.nbytes - in_sram
        if role is Role.OPTIMIZER_STATE:
            optimizer += in_sram
        else:
            weights += v.type.nbytes
    return MemoryReport(peak_bytes=arena.size + t_bytes, activation_bytes=activation, trainable_bytes=t_bytes,
                        frozen_bytes=frozen, weight_bytes=weights, peak_step=peak_step,
                        peak_op=g.nodes[peak_step].op if g.nodes else "",
                        timeline=tuple(timeline), ops=tuple(n.op for n in g.nodes),
                        arena_bytes=arena.size, arena=arena, optimizer_bytes=optimizer,
                        held_timeline=tuple(held_bytes_timeline(storage_spans(lts, merges), len(g.nodes))))
