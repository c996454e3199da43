"""What each graph input is: its role, a field of the graph, never spelled in its name.

A graph input's name binds it to an array (the state dict, the feeds, the C symbols); its
role says what kind of array that is, so that passes, planners and backends ask the graph
("which input is the label?", "which inputs live in RAM?") instead of parsing names.
`Graph.roles` holds one role per input, `Graph.owners` ties each optimizer-state input to
the parameter it belongs to; the verifier (ops/verify.py) checks them.
"""
from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .graph import Graph


class Role(Enum):
    """The kind of a graph input."""

    #: a model input (a batch of samples; the int8 samples of a split input transform)
    DATA = "data"
    #: the loss's targets: class indices or regression targets
    LABEL = "label"
    #: the count of training steps taken (keys the stochastic rounding of int8 updates)
    STEP = "step"
    #: a model parameter (trained or not, as the update scheme decides)
    PARAMETER = "parameter"
    #: read-only: buffers, lifted constants, parameters with requires_grad=False
    FROZEN = "frozen"
    #: the optimizer's state of one parameter (SGD momentum), updated in place each step
    OPTIMIZER_STATE = "optimizer state"
    #: a batch norm's running statistic written by the training step (batchnorm="train"):
    #: a buffer, yet state the step updates in place, so it sits in RAM, not flash
    RUNNING_STAT = "running statistic"
    #: the byte store a paging schedule writes tensors to and reads them back from
    PAGE_STORE = "page store"
    #: the incoming gradient of an output (torch.compile's backward takes one per output)
    TANGENT = "tangent"


#: roles of the inputs fed on every call and held in RAM (the arena) while a graph runs; the
#: others are state (weights, optimizer state, running statistics) or the page store
RAM_ROLES = frozenset({Role.DATA, Role.LABEL, Role.STEP, Role.TANGENT})
#: roles a graph has at most one input of
SINGLE_ROLES = (Role.LABEL, Role.STEP, Role.PAGE_STORE)


def in_ram(role: Role) -> bool:
    """Whether an input of this role is fed each call and held in RAM (data, label, step,
    tangent)."""
    return role in RAM_ROLES


def ram_inputs(g: "Graph") -> frozenset[str]:
    """Names of the inputs of `g` that live in RAM (data, label, step, tangents): what the memory
    planner, the reorderer and the runtimes count as arena-resident inputs."""
    return frozenset(v.name for v, r in zip(g.inputs, g.roles) if in_ram(r))


#: roles of the state a training step writes in place whatever the update scheme trains
STEP_STATE_ROLES = frozenset({Role.OPTIMIZER_STATE, Role.RUNNING_STAT})


def written_state(g: "Graph", trained: Iterable[str]) -> list[str]:
    """Names of the state `g`'s training step writes in place: the parameters in `trained`
    (the update scheme's choice), then every optimizer-state and running-statistic input.
    The memory report counts them in RAM (SRAM on a microcontroller), the rest in flash."""
    names = [v.name for v in g.inputs if v.name in set(trained)]
    return names + [v.name for v, r in zip(g.inputs, g.roles) if r in STEP_STATE_ROLES]
