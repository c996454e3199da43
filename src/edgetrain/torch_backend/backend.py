"""The torch.compile backend: each graph TorchDynamo hands over is compiled, at its first
call and for each new set of input shapes, into edgetrain graphs whose memory is planned and
which the reference runtime runs. AOTAutograd hands over the forward (its inference graph:
functionalized, decomposed, no backward); the backward is edgetrain's own autodiff of it
(float_program.py; int8.py for options={"quantize": "int8"}), so an op trains under
torch.compile exactly when it trains under et.compile.

At the first call the real inputs are at hand: the parameters' names (from Dynamo's
sources), their values (a Sparse scheme picks channels by weight norm) and static shapes
(a graph Dynamo made dynamic is specialized per shape, as a memory plan is static).
Errors (unsupported op, budget) reach the caller then, as edgetrain's own exceptions.
"""
from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..api import BudgetError
from ..frontend.capture import CaptureError
from ..ir import Graph
from ..memory import MemoryReport
from .graphs import flat_inputs, source_name
from .options import BackendOptions, parse_options
from .detach import replace_detaches
from .rnn import replace_rnns
from .translate import decompositions

#: compiled graphs kept for `last_programs()` (a training script compiles a handful)
KEEP_PROGRAMS = 32
_PROGRAMS: collections.deque = collections.deque(maxlen=KEEP_PROGRAMS)


@dataclass
class CompiledGraph:
    """One Dynamo graph for one set of input shapes, as edgetrain compiled it: the forward
    graph AOTAutograd handed over, translated, and `step`, the training step (the forward,
    then edgetrain's backward from the outputs' cotangents) with `memory` its plan (the
    forward's alone for a graph run without gradients)."""

    names: tuple[str, ...]  # AOTAutograd's flat inputs (parameters by their model names)
    trainable: dict  # parameter name -> None (whole) or ChannelSelect
    forward: Graph
    forward_memory: MemoryReport
    step: Optional[Graph] = None
    memory: Optional[MemoryReport] = None
    runs: dict = field(default_factory=lambda: {"forward": 0, "backward": 0})
    quantize: Optional[str] = None  # "int8": the graphs are the int8 program's (int8.py)
    int8: Optional[object] = None  # then its int8.Int8Program (scales, layer maps, the torch <-> int map)
    backend: str = "reference"  # what runs the graphs: the reference runtime or "c" (options["backend"])

    def summary(self) -> str:
        if self.step is None:
            return f"forward only: {self.memory.summary()}"
        return f"training step, {len(self.trainable)} trained tensors: {self.memory.summary()}"


#: int8 scales fixed by the first compiled shape of a graph, for Dynamo's recompilations of it
#: (a new batch size brings a new graph module): id of the graph's first parameter -> (a weak
#: reference to it, {(id of the options, parameter and buffer names): int8.FixedScales})
_SCALES: dict = {}


def _scales_slot(flat, options) -> Optional[tuple[dict, tuple]]:
    params = [f.value for f in flat if f.kind == "param"]
    if not params:
        return None
    first = params[0]
    ref, slot = _SCALES.get(id(first), (None, None))
    if ref is None or ref() is not first:
        slot = {}
        key = id(first)
        _SCALES[key] = (weakref.ref(first, lambda _r, k=key: _SCALES.pop(k, None)), slot)
    return slot, (id(options), tuple(f.name for f in flat if f.kind in ("param", "buffer")))


def last_programs() -> list[CompiledGraph]:
    """The graphs compiled most recently (oldest first)."""
    return list(_PROGRAMS)


def _check_budget(report: MemoryReport, budget, what: str) -> None:
    if budget is None:
        return
    if budget.sram is not None and report.peak_bytes > budget.sram:
        raise BudgetError(f"the {what} needs {report.peak_bytes:,} B of SRAM at its peak ({report.summary()}), "
                          f"over the budget of {budget.sram:,} B; the smallest budget that fits this update "
                          f"scheme is {report.peak_bytes:,} B")
    if budget.flash is not None and report.frozen_bytes > budget.flash:
        raise BudgetError(f"the {what}'s read-only weights need {report.frozen_bytes:,} B of flash, over the "
                          f"budget of {budget.flash:,} B")


def _boxed(fn):
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fn)


def _shape_key(args) -> tuple:
    key = [torch.is_grad_enabled()]
    for a in args:
        key.append((tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else a)
    return tuple(key)


def inference_graph(gm: torch.fx.GraphModule, args) -> tuple[torch.fx.GraphModule, tuple[int, ...]]:
    """AOTAutograd's forward graph of `gm` (functionalized and decomposed, no backward), and
    the flat input indices whose new values it returns first (inputs the graph mutates: a
    train-mode batch norm's buffers)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(fw_gm, _fake_inputs):
        ctx = torch._guards.TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None)
        if meta is None:
            raise CaptureError("AOTAutograd did not say which inputs its graph mutates")
        if any(i.mutates_metadata for i in meta.input_info) or getattr(meta, "num_intermediate_bases", 0):
            raise CaptureError("the graph changes an input's shape or returns views of its intermediates; "
                               "edgetrain runs graphs whose inputs keep their shapes")
        graphs.append((fw_gm, tuple(meta.mutated_inp_runtime_indices)))
        return _boxed(lambda *a: None)

    # the inference graph (the forward alone, no partition); AOTAutograd leaves its metadata
    # (which inputs the graph mutates) on the tracing context
    with torch.no_grad(), torch._guards.tracing(torch._guards.TracingContext(None)):
        aot_autograd(fw_compiler=keep, inference_compiler=keep, decompositions=decompositions())(gm, list(args))
    if len(graphs) != 1:
        raise CaptureError("AOTAutograd did not hand over one inference graph")
    return graphs[0]


class EdgetrainGraph:
    """What the backend returns to Dynamo for one graph: compiles at the first call with
    each new set of input shapes (`programs`: that key -> CompiledGraph)."""

    def __init__(self, gm: torch.fx.GraphModule, options):
        self.gm, self.options = replace_detaches(replace_rnns(gm)), options  # Dynamo drops its sources from the graph after this call:
        self.sources = [(n.name, source_name(n)) for n in gm.graph.nodes if n.op == "placeholder"]
        self._opts: Optional[BackendOptions] = None
        self._compiled: dict = {}
        self._scales: dict = {}  # int8 scales of a graph without parameters (else in _SCALES): {None: FixedScales}
        self.programs: dict = {}

    def __call__(self, *args):
        if self._opts is None:
            self._opts = parse_options(self.options)
        if self._opts.quantize == "int8":
            return self._call_int8(args)
        key = _shape_key(args)
        prog = self._compiled.get(key)
        tensors = self._tensors(args)
        if prog is None or prog.g.stale(tensors):  # a buffer folded into the graphs was changed since
            prog = self._compile(key, args)
        return prog(tensors)

    def _compile(self, key, args):
        from .float_program import FloatProgram

        gm, mutated = inference_graph(self.gm, args)
        prog = FloatProgram(flat_inputs(self.gm, self.sources, args), self._opts, gm, mutated,
                            torch.is_grad_enabled())
        _check_budget(prog.memory, self._opts.budget, "training step" if prog.step is not None else "forward graph")
        record = CompiledGraph(tuple(f.name for f in prog.flat), prog.trainable, prog.forward, prog.forward_memory,
                               step=prog.step, memory=prog.memory, runs=prog.runs, backend=prog.backend)
        _PROGRAMS.append(record)
        self._compiled[key] = prog
        self.programs[key] = record
        return prog

    # -- quantize="int8" (int8.py): AOTAutograd's inference graph, quantized; edgetrain's backward --
    def _tensors(self, args) -> list:
        return ([p for _, p in self.gm.named_parameters(remove_duplicate=False)]
                + [b for _, b in self.gm.named_buffers(remove_duplicate=False)] + list(args))

    def _call_int8(self, args):
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        prog = self._compiled.get(key)
        if prog is None:
            prog = self._compile_int8(key, args)
        tensors = self._tensors(args)
        if torch.is_grad_enabled():
            for f, t in zip(prog.flat, tensors):
                if f.kind == "input" and t.requires_grad:
                    raise CaptureError(f"quantize='int8' cannot pass a gradient to the graph input {f.name} "
                                       f"(an activation from an earlier graph: the model has a graph break "
                                       f"before a trained layer); compile the model as one graph "
                                       f"(torch._dynamo.explain(model)(x) shows the breaks)")
        return prog(tensors)

    def _compile_int8(self, key, args):
        from .int8 import Int8Program

        gm, mutated = inference_graph(self.gm, args)
        flat = flat_inputs(self.gm, self.sources, args)
        if mutated:
            raise CaptureError(f"quantize='int8' folds batch norm into its convolution, but the graph updates "
                               f"{flat[mutated[0]].name} (batch norm in training mode); call model.eval() "
                               f"before the training loop")
        slot, key = _scales_slot(flat, self.options) or (self._scales, None)
        prog = Int8Program(flat, self._opts, gm, slot.get(key), self._opts.calibration)
        _check_budget(prog.memory, self._opts.budget, "int8 training step" if prog.step is not None else
                      "int8 forward graph")
        slot[key] = prog.fixed
        record = CompiledGraph(tuple(f.name for f in flat), prog.trainable, prog.forward, prog.forward_memory,
                               step=prog.step, memory=prog.memory, runs=prog.runs, quantize="int8",
                               int8=prog)
        _PROGRAMS.append(record)
        self._compiled[key] = prog
        self.programs[key] = record
        return prog


def edgetrain_backend(gm: torch.fx.GraphModule, example_inputs, options=None, mode=None):
    """torch.compile(model, backend="edgetrain", options={"update": ..., "quantize": ..., "budget": ...,
    "calibration": ..., "specs": ..., "backend": "reference" | "c"})."""
    if mode not in (None, "default"):
        raise ValueError(f"torch.compile(backend='edgetrain') has no mode {mode!r}; pass options= instead")
    return EdgetrainGraph(gm, options)
