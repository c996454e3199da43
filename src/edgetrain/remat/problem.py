"""The rematerialization / paging problem of a training program (POET's, on our IR).

The train graph's node order is the plain schedule (positions 0..N-1). Nodes before the
first node that depends on the label are the forward phase. A *unit* is a recomputable
forward node (pure, no label dependence, reading only graph inputs and other units'
outputs), joined with the views of its storage. Every other node is *fixed*: it runs once,
at its position. Positions from the first label-dependent node on are cut into *stages*
(stage compression): a stage starts at each fixed node that reads a unit's storage, and
the recomputations and page-ins a schedule chooses for it run at its start. (POET's word,
kept in this package's API: `Stage`, `ScheduleProblem.stages`. A compiled program's
`stages` are something else: the graph after each compiler pass, by pass name.)

What the model counts (`plan.make_schedule` checks and prices a schedule with it) is an
upper bound of what the runtime measures when `apply.apply_schedule` runs the schedule:
at a forward position, the plain schedule's live bytes plus the units kept past their
last forward use; at a stage's first node (the one reading units), its fixed live bytes
plus every unit carried into, recomputed in or paged in at the stage; at the stage's
other nodes, their fixed live bytes plus the units carried on into the next stage.

With `mapped_weights` (build_problem's option; the standalone host binary maps its weights
file), each frozen weight is a unit too (`Unit.frozen`): not in `fixed_ram`, resident at the
forward nodes that read it (in `forward_live`), then kept, paged in again (read from the
file) or dropped like a paged activation, at its page-rounded bytes (weights.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import format_bytes
from ..ir import Graph

if TYPE_CHECKING:
    from ..devices import Device


@dataclass(frozen=True)
class Unit:
    """A recomputable group of forward nodes and the storages it produces."""

    index: int
    name: str
    nodes: tuple[int, ...]  # positions of its nodes in graph.nodes, ascending
    bytes: int  # RAM its output storages take while it is materialized
    time_s: float  # cost to (re)compute it on the device
    energy_j: float
    page_out_s: float
    page_out_j: float
    page_in_s: float
    page_in_j: float
    inputs: tuple[int, ...]  # units it reads: materialized when it is recomputed
    produced: int  # forward position of its first node
    last_forward: int  # last forward position at which it is live in the plain schedule
    last_stage: int  # last stage that needs it, directly or to recompute a unit; -1: none
    recompute_until: int  # recomputed only at stages s <= this (a weight it reads is updated
    #                      in place in that stage); -1: never in the backward
    holds: tuple[tuple[int, int], ...] = ()  # (first, last) stage spans where it must stay
    #                      resident (a fixed view of its storage is alive); first == 0 forces keep
    pageable: bool = True
    frozen: bool = False  # a frozen weight mapped from the weights file (mapped_weights): never
    #                      recomputed, paged out for free (it is in the file), paged in by reading it


@dataclass(frozen=True)
class Stage:
    """A span of the backward (POET's stage): consecutive fixed nodes, run after the
    recomputations and page-ins the schedule chooses for the stage."""

    index: int
    nodes: tuple[int, ...]
    needs: tuple[int, ...]  # units its first node reads (the others read none)
    fixed_bytes: int  # live bytes that are not unit storages at its first node
    rest_bytes: int  # the same, max over its other nodes (0 if it has one node): there only
    #                 the units carried into the next stage are still live
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class ScheduleProblem:
    device: "Device"
    graph: Graph
    units: tuple[Unit, ...]  # topological order: a unit's inputs have smaller indices
    stages: tuple[Stage, ...]
    forward_live: tuple[int, ...]  # live bytes at each forward position in the plain schedule
    fixed_ram: int  # RAM held all along: trained weights, optimizer state, frozen weights
    #                 when the device does not read them from flash (and they are not mapped)
    base_time_s: float  # every node once
    base_energy_j: float
    activation_bytes: int  # the plain schedule's peak of live bytes (no rematerialization)
    ram_inputs: frozenset = frozenset()  # graph inputs living in RAM (data, labels)
    trainable: tuple = ()  # graph inputs updated in place (weights, optimizer state)
    mapped_weights: bool = False  # frozen weights are units (Unit.frozen), resident only as the
    #                               schedule says, not in fixed_ram (weights.py)

    @property
    def forward_end(self) -> int:
        """B0: the first position of the backward phase."""
        return len(self.forward_live)

    def describe(self) -> str:
        return (f"{len(self.graph.nodes)} nodes -> {len(self.units)} units, {len(self.stages)} stages on "
                f"{self.device.name}; plain schedule {format_bytes(self.activation_bytes)} live at its peak "
                f"+ {format_bytes(self.fixed_ram)} weights")
