"""The torch.compile backend: each graph TorchDynamo hands over is compiled, at its first
call and for each new set of input shapes, through AOTAutograd into edgetrain graphs
(graphs.py) whose memory is planned and which the reference runtime runs.

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

import numpy as np
import torch

from ..api import BudgetError
from ..frontend.capture import CaptureError
from ..ir import Graph
from ..memory import MemoryReport, plan_memory, trained_channel_bytes
from .graphs import AotGraphs, FlatInput, flat_inputs, source_name, to_numpy
from .options import BackendOptions, parse_options
from .translate import Transposed, Unused

#: compiled graphs kept for `last_programs()` (a training script compiles a handful)
KEEP_PROGRAMS = 32
_PROGRAMS: collections.deque = collections.deque(maxlen=KEEP_PROGRAMS)


@dataclass
class CompiledGraph:
    """One Dynamo graph for one set of input shapes, as edgetrain compiled it: the forward
    and backward graphs AOTAutograd handed over, translated; `step` is both in one node
    order (one training step) and `memory` its plan (the forward's alone for a graph run
    without gradients)."""

    names: tuple[str, ...]  # AOTAutograd's flat inputs (parameters by their model names)
    trainable: dict  # parameter name -> None (whole) or ChannelSelect
    forward: Graph
    forward_memory: MemoryReport
    backward: Optional[Graph] = None
    backward_memory: Optional[MemoryReport] = None
    step: Optional[Graph] = None
    memory: Optional[MemoryReport] = None
    runs: dict = field(default_factory=lambda: {"forward": 0, "backward": 0})
    quantize: Optional[str] = None  # "int8": the graphs are the int8 program's (int8.py)
    int8: Optional[object] = None  # then its int8.Int8Program (scales, layer maps, the torch <-> int map)

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
        _SCALES[id(first)] = (weakref.ref(first, lambda _r, k=id(first): _SCALES.pop(k, None)), slot)
    return slot, (id(options), tuple(f.name for f in flat if f.kind in ("param", "buffer")))


def last_programs() -> list[CompiledGraph]:
    """The graphs compiled most recently (oldest first)."""
    return list(_PROGRAMS)


def _to_torch(a: np.ndarray) -> torch.Tensor:
    a = np.asarray(a)  # (not ascontiguousarray: it makes a 0-d loss 1-d)
    return torch.from_numpy(a if a.flags.c_contiguous and a.flags.writeable else np.array(a, order="C"))


def _placeholder(node) -> torch.Tensor:
    """What the forward returns for a value nobody reads (an empty tensor of its dtype)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return torch.empty(0, dtype=val.dtype if isinstance(val, torch.Tensor) else torch.float32)


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


class _Specialization:
    """AOTAutograd's partitioner and compilers for one Dynamo graph at one set of input
    shapes, and the runtime of what they compiled."""

    def __init__(self, flat: list[FlatInput], opts: BackendOptions):
        self.flat, self.opts = flat, opts
        self.partitioned: list = []  # (fw module, bw module, num_fwd_outputs)
        self.g: Optional[AotGraphs] = None
        self.record: Optional[CompiledGraph] = None

    def _plan(self, g: Graph, ram) -> MemoryReport:
        sram = trained_channel_bytes(self.g.trainable, {f.name: f.array for f in self.flat if f.kind == "param"})
        return plan_memory(g, ram, self.g.trainable, sram)

    # -- AOTAutograd hooks: the partitioner is wrapped so that the forward compiler sees the
    # -- backward graph too (AOTAutograd compiles that one at the first .backward())
    def partition(self, joint, joint_inputs, **kw):
        from torch._functorch.partitioners import default_partition

        fw, bw = default_partition(joint, joint_inputs, **kw)
        self.partitioned.append((fw, bw, kw["num_fwd_outputs"]))
        return fw, bw

    def compile_inference(self, gm, _fake_inputs):
        self.g = AotGraphs(self.flat, self.opts.update, gm, len(gm.graph.output_node().args[0]))
        report = self._plan(self.g.forward, self.g.ram_names())
        _check_budget(report, self.opts.budget, "forward graph")
        self._record(CompiledGraph(self._names(), self.g.trainable, self.g.forward, report, memory=report))
        return _boxed(self._run_forward)

    def compile_forward(self, gm, _fake_inputs):
        match = [p for p in self.partitioned if p[0] is gm]
        if not match:
            raise CaptureError("AOTAutograd's forward graph is not the one its partitioner made")
        _, bw_gm, n_user = match[-1]
        self.g = g = AotGraphs(self.flat, self.opts.update, gm, n_user)
        g.add_backward(bw_gm)
        self.bw_code = bw_gm.code
        step = self._plan(g.step, g.ram_names() + [v.name for v in g.tangents])
        _check_budget(step, self.opts.budget, "training step")
        self._record(CompiledGraph(self._names(), g.trainable, g.forward, self._plan(g.forward, g.ram_names()),
                                   g.backward, self._plan(g.backward, g.bw_ram_names()), g.step, step))
        return _boxed(self._run_forward)

    def compile_backward(self, gm, _fake_inputs):
        if gm.code != self.bw_code:
            raise CaptureError("AOTAutograd's backward graph changed after partitioning; edgetrain planned "
                               "the one its partitioner made")
        return _boxed(self._run_backward)

    def _names(self):
        return tuple(f.name for f in self.flat)

    def _record(self, rec: CompiledGraph) -> None:
        self.record = rec
        _PROGRAMS.append(rec)

    # -- runtime: torch tensors <-> numpy arrays at the boundary -------------------------------
    def _run_forward(self, *args):
        from ..backends.reference import run_graph

        g = self.g
        feeds = {v.name: to_numpy(args[i]) for i, v in g.fw_bind}
        for v, classes in g.labels.items():
            labels = feeds[v.name]
            if labels.size and (labels.min() < 0 or labels.max() >= classes):
                raise ValueError(f"class labels must lie in [0, {classes}), got {labels.min()}..{labels.max()} "
                                 f"(edgetrain's cross entropy has no ignore_index)")
        outs, _ = run_graph(g.forward, feeds, g.ram_names())
        by_value = dict(zip(g.forward.outputs, g.forward.output_names))

        def tensor(v):
            i = g.fw_inputs.get(v)
            return args[i] if i is not None else _to_torch(outs[by_value[v]])

        result = []
        for node, e in zip(g.out_nodes, g.entries):
            if isinstance(e, Transposed):
                result.append(tensor(e.value).t())
            elif isinstance(e, Unused):
                result.append(_placeholder(node))
            else:
                result.append(e if e is None or isinstance(e, (int, float)) else tensor(e))
        self.record.runs["forward"] += 1
        return tuple(result)

    def _run_backward(self, *args):
        from ..backends.reference import run_graph

        g = self.g
        need = set(g.backward.inputs)
        feeds = {v.name: to_numpy(a.t() if kind == "transposed" else a)
                 for (kind, v), a in zip(g.feed, args) if v is not None and v in need}
        outs, _ = run_graph(g.backward, feeds, g.bw_ram_names())
        grads = []
        for f, name in zip(self.flat, g.grad_names):
            if name is None:
                grads.append(None)
                continue
            grad = outs[name]
            sel = g.trainable.get(f.name) if f.kind == "param" else None
            if sel is not None:  # the selected channels' gradient; torch wants the whole tensor's
                grad = sel.scatter(grad, tuple(f.value.shape))
            grads.append(_to_torch(grad))
        self.record.runs["backward"] += 1
        return tuple(grads)


def _shape_key(args) -> tuple:
    key = [torch.is_grad_enabled()]
    for a in args:
        key.append((tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else a)
    return tuple(key)


class EdgetrainGraph:
    """What the backend returns to Dynamo for one graph: compiles at the first call with
    each new set of input shapes (`programs`: that key -> CompiledGraph)."""

    def __init__(self, gm: torch.fx.GraphModule, options):
        self.gm, self.options = gm, options  # Dynamo drops its sources from the graph after this call:
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
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compile(key, args)
        return fn(*args)  # AOTAutograd's function takes unpacked arguments, whatever its _boxed_call says

    def _compile(self, key, args):
        from torch._dynamo.backends.common import aot_autograd

        spec = _Specialization(flat_inputs(self.gm, self.sources, args), self._opts)
        compiler = aot_autograd(fw_compiler=spec.compile_forward, bw_compiler=spec.compile_backward,
                                inference_compiler=spec.compile_inference, partition_fn=spec.partition)
        fn = compiler(self.gm, list(args))
        self._compiled[key] = fn
        self.programs[key] = spec.record
        return fn

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
        from torch._dynamo.backends.common import aot_autograd

        from .int8 import Int8Program

        graphs = []

        def keep(gm, _fake_inputs):
            graphs.append(gm)
            return _boxed(lambda *a: None)

        with torch.no_grad():  # AOTAutograd's inference graph: the forward alone, no partition
            aot_autograd(fw_compiler=keep, inference_compiler=keep)(self.gm, list(args))
        if len(graphs) != 1:
            raise CaptureError("AOTAutograd did not hand over one inference graph")
        flat = flat_inputs(self.gm, self.sources, args)
        slot, key = _scales_slot(flat, self.options) or (self._scales, None)
        prog = Int8Program(flat, self._opts, graphs[0], slot.get(key), self._opts.calibration)
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
    "calibration": ...})."""
    if mode not in (None, "default"):
        raise ValueError(f"torch.compile(backend='edgetrain') has no mode {mode!r}; pass options= instead")
    return EdgetrainGraph(gm, options)
