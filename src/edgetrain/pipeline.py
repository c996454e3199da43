"""The compiler as one declared list of named steps (`STEPS`), run phase by phase.

A step is one pass. It takes the compilation so far (`Build`, frozen) and the compile
options (`Options`, frozen: a step reads nothing else) and returns the next Build; the
runner verifies the Build's `graph` (ops.verify) and keeps it under the step's name, so
`prog.stages` lists every step that ran, in order, and each prints as text. A step runs
when its condition on the options holds (`when`: int8 only, batchnorm="train" only); it is
absent from `prog.stages` otherwise.

Phases, in order:
- "front": capture and quantization, and the layers an update scheme names (`front`). It
  does not read the update scheme, so update="auto"'s search compiles every candidate
  scheme from one front (api.py), and sparse/scheme_layers.py runs its first steps.
- "train": the loss, the backward over the scheme's trained selection, the updates, the
  fusions and the memory-minimising node order (`train`).
- then `plan`: the memory plan of the train graph and the budget check (no graph changes).
- "vjp", for torch.compile's backward (torch_backend/): the train phase's backward, pruning
  and fusion, started from the outputs' cotangents instead of a loss (`vjp`).

Each phase's result is narrowed to what the phase guarantees: `front` returns a `Front`
(captured, with its layer graph and forward graph), `train` a `Trained` (with its gradient
graph too); the steps in between pass the general `Build`.

To add a pass: write it in passes/ (Graph -> Graph), add a `Step` at its place in `STEPS`
with a past-participle name and its condition; `tests/core/test_pipeline.py` checks that
compile stages exactly the declared steps.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

from .autodiff import build_backward, grad_name
from .config import SGD, Budget
from .frontend import capture
from .frontend.capture import Captured
from .ir import Graph, Role, Value, ram_inputs, written_state
from .memory import MemoryReport, plan_memory, trained_channel_bytes
from .ops import verify
from .passes import apply_updates_early, attach_loss, eliminate_dead_code, insert_updates
from .passes.batchnorm import batchnorm_momenta, insert_stat_updates, use_batch_statistics
from .passes.fold import fold_batchnorm
from .passes.fuse import fuse_pointwise_depthwise, fuse_weight_grad_update
from .passes.fuse_batchnorm_backward import fuse_batchnorm_backward
from .passes.fuse_bn_activation import fuse_bn_activation
from .passes.input_split import split_input_transform
from .passes.lm_head import chunk_lm_head, loss_in_backward
from .passes.reorder import reorder_for_memory
from .passes.stream import stream_frozen_chains
from .passes.widen_scratch import widen_scratch
from .quantize import SPEC_ATTR, Quantized, dequantized_state, qas_scales, quantize_folded, quantize_frozen
from .quantize.headroom import with_headroom
from .quantize.integer_backward import calibrate_gradients, integerize_backward
from .trainable import Full, LoRA, add_adapters, find_layers, resolve_scheme

#: debug lines: each step run, its graph's size and its time
_log = logging.getLogger(__name__)


class BudgetError(ValueError):
    """The program does not fit the memory budget."""


@dataclass(frozen=True)
class Options:
    """compile()'s options as the steps read them (api.compile checks them first)."""

    loss: str = "cross_entropy"
    ignore_index: int = -100  # the class losses' label that counts nowhere (torch's default)
    update: Any = Full()  # a resolved UpdateScheme (update="auto" compiles each candidate)
    quantize: Optional[str] = None  # None (float32) or "int8"
    optimizer: SGD = SGD(lr=0.01)
    batchnorm: str = "eval"  # "eval" (running statistics) or "train" (batch statistics)
    budget: Optional[Budget] = None  # checked by `plan`
    calibration: Optional[Iterable] = None  # int8 calibration batches; None: the example inputs
    frozen: Optional[str] = None  # None (float32), "int8" or "int4": how frozen weights are stored
    #: int8: how many times wider the trained layers' weight scales and output ranges are (1: as calibrated)
    int8_headroom: float = 1.0
    backward: str = "float"  # "float" or "integer" (int8: the backward and updates in integers only)


#: the graph before the front's "captured" step: empty
NO_GRAPH = Graph((), (), (), ())


@dataclass(frozen=True)
class Build:
    """The compilation so far: the graph the last step made and what the steps found.

    What every step reads and returns; `Front` and `Trained` narrow it to what their phase
    guarantees."""

    model: Any  # the nn.Module
    example_inputs: tuple
    graph: Graph = NO_GRAPH  # the last step's graph
    stages: Mapping[str, Graph] = field(default_factory=dict)  # every step's graph, in order
    cap: Optional[Captured] = None
    params: Mapping = field(default_factory=dict)  # the parameters an update scheme may train
    state: Mapping = field(default_factory=dict)  # the program's weights and buffers
    layer_graph: Optional[Graph] = None  # the graph update schemes are resolved on (int8: folded)
    layer_arrays: Mapping = field(default_factory=dict)  # its arrays (int8: folded weights)
    folds: tuple = ()  # the batch norms folded into convolutions (int8)
    quantized: Optional[Quantized] = None
    data_inputs: tuple = ()  # the graphs' data inputs (int8: the samples the input transform makes)
    transform: Optional[Graph] = None  # int8: float samples -> int8 samples, run as each is read in
    forward: Optional[Graph] = None  # the forward graph `predict` runs (the front's last graph)
    layers: tuple = ()  # sparse.Layer of layer_graph, in forward order
    trainable: Mapping = field(default_factory=dict)  # parameter -> None (all of it) or ChannelSelect
    batch_stats: tuple = ()  # batchnorm="train": each batch norm's statistics
    grads: Optional[Graph] = None  # the pruned backward: the program's gradient graph
    cotangents: Mapping[str, str] = field(default_factory=dict)  # "vjp": output -> its gradient's input
    adapters: tuple = ()  # LoRA: the adapters' parameter names (what the scheme trains)
    #: state -> state as the original model's names hold it (frozen="int8"/"int4": the weights
    #: dequantized under their own names), composed before the int8 export; None: as is
    frozen_export: Optional[Callable] = None

    @property
    def ram_inputs(self) -> frozenset[str]:
        """The graph's inputs held in RAM (data, label, step), read from their roles."""
        return ram_inputs(self.graph)

    @property
    def captured(self) -> Captured:
        """`cap`, which the steps after the front's "captured" step read (a "vjp" Build has none)."""
        if self.cap is None:
            raise ValueError("this step reads the captured model: it runs after the front's 'captured' step")
        return self.cap


@dataclass(frozen=True, kw_only=True)
class Front(Build):
    """The front phase's Build: captured, with the graph update schemes are resolved on and
    the forward graph `predict` runs. The train phase's steps keep these set."""

    cap: Captured
    layer_graph: Graph
    forward: Graph

    def __post_init__(self) -> None:
        unset = [f.name for f in fields(self) if f.kw_only and getattr(self, f.name) is None]
        if unset:
            raise TypeError(f"a {type(self).__name__} Build needs {', '.join(unset)} set")


@dataclass(frozen=True, kw_only=True)
class Trained(Front):
    """The train phase's Build: the training step (`graph`) and its gradient graph."""

    grads: Graph


_Phase = TypeVar("_Phase", bound=Front)


def narrowed(kind: type[_Phase], b: Build) -> _Phase:
    """`b` as the phase's Build `kind`; TypeError when a field the phase guarantees is unset."""
    return kind(**{f.name: getattr(b, f.name) for f in fields(Build)})


@dataclass(frozen=True)
class Step:
    """One pass: `run(build, options) -> build`, staged under `name` when `when(options)`,
    in each phase of `phases`."""

    name: str
    phases: tuple[str, ...]
    run: Callable[[Build, Options], Build]
    when: Callable[[Options], bool] = lambda o: True


def _int8(o: Options) -> bool:
    return o.quantize == "int8"


def _headroom(o: Options) -> bool:
    return o.quantize == "int8" and o.int8_headroom != 1


def _integer_backward(o: Options) -> bool:
    return o.quantize == "int8" and o.backward == "integer"


def _batch_train(o: Options) -> bool:
    return o.batchnorm == "train"


def _vocabulary_loss(o: Options) -> bool:
    """A language model's loss: classes (the vocabulary) in the output's last dim."""
    return o.loss in ("sequence_cross_entropy", "causal_lm")


def _lora(o: Options) -> bool:
    return isinstance(o.update, LoRA)


def _frozen_quantized(o: Options) -> bool:
    return o.frozen is not None


# --- front --------------------------------------------------------------------------------
def _capture(b: Build, o: Options) -> Build:
    cap = capture(b.model, tuple(b.example_inputs))
    params = dict(cap.params)
    return replace(b, graph=cap.graph, cap=cap, params=params, state={**cap.params, **cap.buffers},
                   layer_graph=cap.graph, layer_arrays=params, data_inputs=tuple(cap.inputs))


def _fold(b: Build, o: Options) -> Build:
    folded, arrays, folds = fold_batchnorm(b.graph, b.state)
    return replace(b, graph=folded, layer_graph=folded, layer_arrays=arrays, folds=tuple(folds))


def _calibration(b: Build, o: Options):
    """The int8 calibration batches: the options', else the example inputs."""
    return o.calibration if o.calibration is not None else [tuple(b.example_inputs)]


def _convert(b: Build, o: Options) -> Build:
    q = quantize_folded(b.graph, b.layer_arrays, b.folds, getattr(b.model, SPEC_ATTR, {}), _calibration(b, o))
    params = {k: v for k, v in q.folded_arrays.items() if k in q.arrays and k not in b.captured.buffers}
    return replace(b, graph=q.graph, quantized=q, params=params, state=dict(q.arrays))


def _split_input(b: Build, o: Options) -> Build:
    split = split_input_transform(b.graph, b.captured.inputs)
    if split is None:
        return b
    # the device reads int8 samples: the float image never sits in RAM
    return replace(b, graph=split.rest, transform=split.transform, data_inputs=tuple(split.transform.output_names))


# --- train --------------------------------------------------------------------------------
def _add_adapters(b: Build, o: Options) -> Build:
    g, state, names = add_adapters(b.graph, b.state, o.update, seed=o.optimizer.seed)
    params = {**b.params, **{n: state[n] for n in names}}
    return replace(b, graph=g, forward=g, state=state, params=params, adapters=tuple(names))


def _quantize_frozen(b: Build, o: Options) -> Build:
    assert o.frozen is not None, "the step runs when options.frozen is set (_frozen_quantized)"
    g, state, export = quantize_frozen(b.graph, b.state, b.trainable, o.frozen)
    return replace(b, graph=g, forward=g, state=state, frozen_export=export)


def _widen_headroom(b: Build, o: Options) -> Build:
    """The front's int8 program rebuilt with headroom for the layers the scheme trains (known only
    now: the front is independent of the scheme): their weight scales and output ranges widened."""
    assert b.quantized is not None, "the step runs on int8 programs (_headroom)"
    q = with_headroom(b.quantized, getattr(b.model, SPEC_ATTR, {}), b.trainable, o.int8_headroom)
    b = _split_input(replace(b, graph=q.graph, quantized=q, state=dict(q.arrays)), o)
    return replace(b, forward=b.graph)


def _batch_statistics(b: Build, o: Options) -> Build:
    g, stats = use_batch_statistics(b.graph, batchnorm_momenta(b.model))
    return replace(b, graph=g, batch_stats=tuple(stats))


def _backward(b: Build, o: Options) -> Build:
    loss = None if b.cotangents else "loss"  # "vjp": from the cotangents
    return replace(b, graph=build_backward(b.graph, loss, b.trainable, b.cotangents or None))


def _gradient_outputs(b: Build, o: Options) -> Build:
    names = [grad_name(n) for n in b.trainable]
    return replace(b, graph=b.graph.replace(outputs=tuple(b.graph.output(n) for n in names),
                                            output_names=tuple(names)))


def _prune(b: Build, o: Options) -> Build:
    g = eliminate_dead_code(b.graph)
    return replace(b, graph=g, grads=g)


def _fuse_bn_backward(b: Build, o: Options) -> Build:
    g = fuse_batchnorm_backward(b.graph)  # in the gradient graph and the training step alike
    return replace(b, graph=g, grads=g)


def _fuse_bn_activation(b: Build, o: Options) -> Build:
    g = fuse_bn_activation(b.graph)  # in the gradient graph and the training step alike
    return replace(b, graph=g, grads=g)


def _updates(b: Build, o: Options) -> Build:
    opt = o.optimizer
    scales = qas_scales(b.quantized.layers, opt.qas) if b.quantized is not None else None
    return replace(b, graph=insert_updates(b.graph, b.trainable, opt.lr, opt.momentum, opt.weight_decay, scales,
                                           opt.seed))


def _integerize(b: Build, o: Options) -> Build:
    """The float backward and updates rewritten in integers, gradient exponents calibrated on the
    float backward (quantize/integer_backward.py)."""
    classes = b.forward.outputs[0].shape[1] if b.forward is not None else 0
    ranges = calibrate_gradients(b.graph, b.state, _calibration(b, o), b.data_inputs, b.transform, classes)
    return replace(b, graph=integerize_backward(b.graph, ranges))


def _widen_scratch(b: Build) -> Build:
    def peak(g: Graph) -> int:
        return plan_graph(g, b.trainable, b.state).peak_bytes

    return replace(b, graph=widen_scratch(b.graph, peak, set(b.ram_inputs)))


def _graph_pass(f: Callable[[Graph], Graph]) -> Callable[[Build, Options], Build]:
    return lambda b, o: replace(b, graph=f(b.graph))


FRONT, TRAIN, VJP = ("front",), ("train",), ("vjp",)
STEPS: tuple[Step, ...] = (
    Step("captured", FRONT, _capture),
    Step("folded", FRONT, _fold, _int8),  # batch norm folded into the convolution before it
    Step("converted", FRONT, _convert, _int8),  # the int8 graph, its scales calibrated
    Step("quantized", FRONT, _split_input, _int8),  # the float -> int8 input transform split off
    Step("adapters_added", TRAIN, _add_adapters, _lora),  # LoRA: the adapters, before the selection
    # frozen="int8"/"int4": every frozen linear / embedding weight read from its quantized form
    Step("frozen_quantized", TRAIN, _quantize_frozen, _frozen_quantized),
    # int8_headroom > 1: the trained layers' int8 weight scales and output ranges widened
    Step("headroom_widened", TRAIN, _widen_headroom, _headroom),
    Step("batch_statistics", TRAIN, _batch_statistics, _batch_train),
    Step("with_loss", TRAIN, lambda b, o: replace(b, graph=attach_loss(b.graph, o.loss,
                                                                            ignore_index=o.ignore_index))),
    # a linear head's logits and loss computed a vocabulary chunk at a time, never whole
    Step("lm_head_chunked", TRAIN, _graph_pass(chunk_lm_head), _vocabulary_loss),
    Step("backward", TRAIN + VJP, _backward),
    Step("gradient_outputs", VJP, _gradient_outputs),  # the gradients alone, not the forward's outputs
    Step("pruned", TRAIN + VJP, _prune),
    Step("fused_bn_backward", TRAIN + VJP, _fuse_bn_backward),
    Step("fused_bn_activations", TRAIN, _fuse_bn_activation),  # batch norm [+ add] + ReLU / clamp in one pass
    # the chunked head's loss given by its gradient node: one sweep of the vocabulary's logits fewer
    Step("lm_loss_in_backward", TRAIN, _graph_pass(loss_in_backward), _vocabulary_loss),
    Step("updates", TRAIN, _updates),
    # backward="integer": every gradient, the loss and the updates in integers (no float arithmetic)
    Step("integer_backward", TRAIN, _integerize, _integer_backward),
    Step("batch_stat_updates", TRAIN, lambda b, o: replace(b, graph=insert_stat_updates(b.graph, b.batch_stats)),
         _batch_train),
    Step("updates_early", TRAIN, _graph_pass(apply_updates_early)),  # each update right after its gradient
    # int8: frozen expansion convs stream into their depthwise conv, channel by channel
    Step("fused_pointwise_depthwise", TRAIN, _graph_pass(fuse_pointwise_depthwise), _int8),
    # int8: frozen chains at the forward peak run row by row
    Step("streamed", TRAIN, lambda b, o: replace(b, graph=stream_frozen_chains(b.graph, b.data_inputs)), _int8),
    # weight gradients applied one row at a time (embeddings: the touched rows), never whole
    Step("fused_grad_updates", TRAIN, _graph_pass(fuse_weight_grad_update)),
    Step("reordered", TRAIN, lambda b, o: replace(b, graph=reorder_for_memory(b.graph, b.ram_inputs))),
    # int8: fused expansions' and streams' scratch as wide as the step's peak has room for (faster kernels)
    Step("widened_scratch", TRAIN, lambda b, o: _widen_scratch(b), _int8),
)
PHASES = ("front", "train", "vjp")


def steps(phase: str, options: Options) -> tuple[Step, ...]:
    """The steps of `phase` that run under `options`, in order."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: the phases are {PHASES}")
    return tuple(s for s in STEPS if phase in s.phases and s.when(options))


def run_steps(b: Build, options: Options, todo: Iterable[Step]) -> Build:
    """`b` after each step of `todo`, each one's graph verified and staged under its name."""
    for s in todo:
        t0 = time.perf_counter()
        b = s.run(b, options)
        b = replace(b, stages={**b.stages, s.name: verify(b.graph)})
        _log.debug("compiler step %s: %d nodes, %.3f s", s.name, len(b.graph.nodes), time.perf_counter() - t0)
    return b


#: the front steps that make the graph update schemes are resolved on (int8: batch norm folded)
LAYER_STEPS = ("captured", "folded")


def vjp(graph: Graph, wrt: Mapping, cotangents: Mapping[str, Value]) -> Build:
    """The "vjp" phase (torch.compile's backward): `graph`'s reverse sweep from `cotangents`
    (output name -> the input holding its gradient, added with role TANGENT) to `wrt`
    ({input: None | ChannelSelect}); its `graph` outputs the gradients `grad:<name>`."""
    g = graph.with_inputs({t: Role.TANGENT for t in cotangents.values()})
    b = Build(None, (), graph=g, trainable=dict(wrt), cotangents={n: t.name for n, t in cotangents.items()})
    return run_steps(b, Options(), steps("vjp", Options()))


def layer_front(model, example_inputs: tuple, options: Options) -> Build:
    """The front up to the graph update schemes are resolved on (`layer_graph`), without
    calibrating or quantizing: what contribution analysis needs (sparse/scheme_layers.py)."""
    todo = [s for s in steps("front", options) if s.name in LAYER_STEPS]
    return run_steps(Build(model, tuple(example_inputs)), options, todo)


def front(model, example_inputs: tuple, options: Options) -> Front:
    """The "front" phase: the forward graph the device runs, its state, and the layers an
    update scheme names. Independent of `options.update` (and of the optimizer)."""
    b = run_steps(Build(model, tuple(example_inputs)), options, steps("front", options))
    f = narrowed(Front, replace(b, forward=b.graph))
    return replace(f, layers=tuple(find_layers(f.layer_graph, set(f.params))))


def select_trainable(b: Front, update) -> dict:
    """What `update` trains on the front `b`: {parameter: None (all of it) | ChannelSelect}."""
    if isinstance(update, LoRA):
        return {n: None for n in b.adapters}
    frozen = set(b.cap.frozen_params)
    return resolve_scheme(update, list(b.layers), {k: b.layer_arrays[k] for k in b.params}, frozen)


#: the train steps that run before the trained selection is resolved (they add parameters)
SELECTION_STEPS = ("adapters_added",)


def train(front: Front, options: Options) -> Trained:
    """The "train" phase on a front: the training step's graph (`graph`), its gradient graph
    (`grads`) and the trained selection of `options.update` (LoRA: resolved after the
    adapters are added). The steps that change the forward (adapters, quantized frozen
    weights) set `forward` too: `predict` computes what the training step computes."""
    todo = steps("train", options)
    b = narrowed(Front, run_steps(front, options, [s for s in todo if s.name in SELECTION_STEPS]))
    b = replace(b, trainable=select_trainable(b, options.update))
    return narrowed(Trained, run_steps(b, options, [s for s in todo if s.name not in SELECTION_STEPS]))


def plan(b: Build, options: Options) -> MemoryReport:
    """The memory plan of the trained Build's graph; BudgetError when over `options.budget`."""
    memory = plan_graph(b.graph, b.trainable, b.state)
    budget = options.budget
    # Budget's sizes are bytes (int) or None once constructed (config.parse_bytes)
    if budget is not None and isinstance(budget.sram, int) and memory.peak_bytes > budget.sram:
        raise BudgetError(f"the program needs {memory.peak_bytes:,} B of SRAM at its peak "
                          f"({memory.summary()}), over the budget of {budget.sram:,} B; "
                          f"the smallest budget that fits this update scheme is {memory.peak_bytes:,} B")
    if budget is not None and budget.flash is not None:
        check_flash(memory, budget)
    return memory


def plan_graph(g: Graph, trainable: Mapping, state: Mapping) -> MemoryReport:
    """The memory plan of a training step `g` (also a scheduled one, remat/apply.py): its RAM
    inputs and the state it writes read from the inputs' roles, a trained channel selection
    held in SRAM as its channels only."""
    return plan_memory(g, ram_inputs(g), written_state(g, trainable), trained_channel_bytes(trainable, state))


def check_flash(memory: MemoryReport, budget: Budget) -> None:
    """BudgetError when the read-only weights (and buffers) exceed `budget.flash`."""
    if isinstance(budget.flash, int) and memory.frozen_bytes > budget.flash:
        raise BudgetError(f"read-only weights need {memory.frozen_bytes:,} B of flash, over the budget "
                          f"of {budget.flash:,} B")


def export_of(b: Trained) -> Optional[Callable]:
    """state -> the float state the original model loads (int8: dequantized); None: as is."""
    q = b.quantized
    if q is None:
        return b.frozen_export
    base = {**b.cap.params, **b.cap.buffers}
    return lambda st: dequantized_state(base, st, q.layers, q.folds)
