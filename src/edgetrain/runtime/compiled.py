"""CompiledProgram: everything the compiler decided about a model, as one frozen value.

It holds the graphs (every stage, and the forward, gradient and train graphs that run), the
memory report, the trained selection and its scheme, the quantization, the schedule and its
page store, the initial state and how to export it; it holds no running state. Running it
is a runner's job (runtime/runner.py; the reference runner in backends/reference_runner.py,
the C runner in backends/c/host.py), and
`edgetrain.Program` is the facade holding one compiled program and one runner. A pass that
changes a compiled program makes another (`dataclasses.replace`, remat/apply.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

import numpy as np

from ..ir import Graph, Role
from ..memory import MemoryReport


def _frozen_map(m: Optional[Mapping]) -> Mapping:
    return MappingProxyType(dict(m or {}))


def _read_only(a) -> np.ndarray:
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class CompiledProgram:
    """A model compiled for training (module docstring). Mappings are read-only views,
    arrays read-only copies."""

    inputs: tuple  # the model's inputs, as the user passes them
    #: the compiled graphs' data inputs: `inputs`, or for an int8 program the int8 samples
    #: that `input_transform` (float data -> int8, run as each sample is read in) makes
    graph_inputs: tuple
    input_transform: Optional[Graph]
    stages: Mapping[str, Graph]  # every intermediate graph, by pass
    forward_graph: Graph
    grad_graph: Graph
    train_graph: Graph
    trainable: Mapping[str, Any]  # param -> None (all of it) or the ChannelSelect trained
    layers: tuple
    memory: MemoryReport
    loss: str
    optimizer: Any  # config.SGD
    #: model.state_dict() key -> the state tensor holding it
    state_aliases: Mapping[str, str]
    #: the initial weights, buffers and optimizer state (momentum starts at zero)
    initial_state: Mapping[str, np.ndarray]
    #: state -> the float state the original model loads (int8: dequantized), None: as is
    export: Optional[Callable] = None
    quantize: Optional[str] = None
    scheme: Any = None  # the update scheme it trains (for update="auto": the one chosen)
    search: Any = None  # for update="auto": how the scheme was chosen (sparse.auto.SearchInfo)
    schedule: Any = None  # the rematerialization / paging schedule it runs (remat/apply.py)
    page_store: Any = None  # where that schedule pages tensors to (schedule.apply.PageStore)
    #: captured op -> the model source lines it comes from (backends name them when they lack an op)
    op_sources: Mapping[str, tuple] = field(default_factory=dict)
    #: node index of stages['captured'] -> the model source line it came from
    source_lines: Mapping[int, str] = field(default_factory=dict)
    #: int8: weight name -> its layer's quantization (quantize.convert.QuantLayer: the weight's
    #: per-channel scales, the input's scale), what gives integer parameters their real values
    quant_layers: Mapping[str, Any] = field(default_factory=dict)
    #: the class losses' label that counts nowhere (torch's ignore_index; passes/loss.py)
    ignore_index: int = -100

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "inputs", tuple(self.inputs))
        set_(self, "graph_inputs", tuple(self.graph_inputs))
        for name in ("stages", "trainable", "state_aliases", "op_sources", "source_lines", "quant_layers"):
            set_(self, name, _frozen_map(getattr(self, name)))
        st = self.initial_state
        if not (isinstance(st, MappingProxyType) and all(not a.flags.writeable for a in st.values())):
            set_(self, "initial_state", MappingProxyType({k: _read_only(v) for k, v in st.items()}))

    @classmethod
    def build(cls, *, inputs, state: Mapping[str, np.ndarray], stages, forward: Graph, grad_graph: Graph,
              train_graph: Graph, trainable, layers, memory: MemoryReport, loss: str, optimizer, state_aliases,
              export=None, quantize=None, graph_inputs=None, input_transform=None, scheme=None, op_sources=None,
              source_lines=None, search=None, quant_layers=None, ignore_index: int = -100) -> "CompiledProgram":
        """The compiled program of compile()'s results; `state` the weights and buffers (the
        optimizer's momenta are added, at zero)."""
        init = dict(state)
        g = train_graph
        of_param = {g.owner(m).name: m for m in g.inputs_with(Role.OPTIMIZER_STATE)}
        for m in (of_param[p] for p in trainable if p in of_param):  # in the order of the trained parameters
            init[m.name] = np.zeros(m.shape, dtype=m.dtype)
        return cls(inputs=tuple(inputs), graph_inputs=tuple(graph_inputs) if graph_inputs is not None else
                   tuple(inputs), input_transform=input_transform, stages=stages, forward_graph=forward,
                   grad_graph=grad_graph, train_graph=train_graph, trainable=trainable, layers=tuple(layers),
                   memory=memory, loss=loss, optimizer=optimizer, state_aliases=state_aliases, initial_state=init,
                   export=export, quantize=quantize, scheme=scheme, search=search, op_sources=op_sources or {},
                   source_lines=source_lines or {}, quant_layers=quant_layers or {}, ignore_index=int(ignore_index))

    def fresh_state(self) -> dict[str, np.ndarray]:
        """A writable copy of the initial state (what a new runner starts from)."""
        return {k: np.array(v, copy=True) for k, v in self.initial_state.items()}


#: the names a Program and a runner read from their compiled program
COMPILED_FIELDS = frozenset(f.name for f in fields(CompiledProgram))
