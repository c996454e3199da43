"""compile(): the pass list, from an nn.Module to a training Program."""
from __future__ import annotations

from typing import Iterable, Optional, Union

import torch

from .autodiff import build_backward
from .config import SGD, Budget
from .frontend import capture
from .ir import Graph
from .memory import plan_memory, trained_channel_bytes
from .ops import verify
from .passes import apply_updates_early, attach_loss, eliminate_dead_code, insert_updates
from .passes.batchnorm import batchnorm_momenta, insert_stat_updates, use_batch_statistics
from .passes.fuse import fuse_pointwise_depthwise, fuse_weight_grad_update
from .passes.fuse_batchnorm_backward import fuse_batchnorm_backward
from .passes.input_split import split_input_transform
from .passes.loss import LABEL, LOSSES
from .passes.reorder import reorder_for_memory
from .passes.stream import stream_frozen_chains
from .passes.updates import STEP, momentum_name
from .program import Program
from .quantize import SPEC_ATTR, dequantized_state, qas_scales, quantize_int8
from .sparse import Full, UpdateScheme, find_layers, resolve_scheme
from .sparse.auto import SEARCHES, CostCache, search_scheme
from .sparse.contribution import ContributionError, as_table
from .sparse.search import InfeasibleBudget

BACKENDS = ("reference", "c")
QUANTIZE = (None, "int8")
#: batch norm in the training step: "eval" on running statistics (the on-device default, as
#: fine-tuning at batch 1 needs), "train" on batch statistics with torch's running updates
BATCHNORM = ("eval", "train")


class BudgetError(ValueError):
    """The program does not fit the memory budget."""


def compile(model: torch.nn.Module, example_inputs: tuple, loss: str = "cross_entropy",
            update: Union[UpdateScheme, str] = Full(), quantize: Optional[str] = None,
            optimizer: SGD = SGD(lr=0.01), budget: Optional[Budget] = None,
            backend: str = "reference", calibration: Optional[Iterable] = None,
            contributions=None, search: str = "exact", batchnorm: str = "eval") -> Program:
    """Compile `model` into a training program for inputs shaped like `example_inputs`.

    quantize="int8" trains the int8 model a microcontroller runs: batch norm folded, int8
    weights and activations, int32 biases, QAS when `optimizer.qas`. Its scales come from
    the published parameters of a pre-quantized model (`models.from_tiny_training`),
    otherwise from the ranges seen on `calibration` (an iterable of input batches, each an
    array or a tuple of arrays; default: the example inputs).

    update="auto" searches the Sparse scheme with the largest summed gain in `contributions`
    (a sparse.ContributionTable or the path of its JSON) whose peak fits `budget.sram`,
    with the exact solver or the paper's evolutionary one (`search`); `prog.search` tells
    how (sparse/auto.py).

    batchnorm="train" trains batch norm as torch's model.train() does: each step normalises
    with the batch's mean and biased variance (the gradient flows through them) and moves
    running_mean / running_var towards the batch's mean and unbiased variance by the
    module's momentum, counting num_batches_tracked (float programs only; batches need more
    than one value per channel). `predict` keeps using the running statistics (model.eval()).
    The default "eval" trains on the running statistics, as on-device fine-tuning at batch 1
    does."""
    _check_args(example_inputs, loss, update, quantize, optimizer, budget, backend, contributions, search,
                batchnorm)
    if isinstance(update, str):
        return _compile_auto(model, tuple(example_inputs), loss, quantize, optimizer, budget, backend, calibration,
                             contributions, search, batchnorm)
    stages: dict[str, Graph] = {}

    def stage(name: str, g: Graph) -> Graph:
        stages[name] = verify(g)
        return g

    cap = capture(model, tuple(example_inputs))
    forward = stage("captured", cap.graph)
    params, state = dict(cap.params), {**cap.params, **cap.buffers}
    grad_scales, export, transform = None, None, None
    data_inputs = tuple(cap.inputs)
    if quantize == "int8":
        q = quantize_int8(forward, state, getattr(model, SPEC_ATTR, {}),
                          calibration if calibration is not None else [tuple(example_inputs)])
        stage("folded", q.folded)
        layer_graph, layer_arrays = q.folded, q.folded_arrays
        forward = q.graph
        split = split_input_transform(forward, cap.inputs)
        if split is not None:  # the device reads int8 samples: the float image never sits in RAM
            transform, forward = split.transform, split.rest
            data_inputs = tuple(split.transform.output_names)
        forward = stage("quantized", forward)
        params = {k: v for k, v in q.folded_arrays.items() if k in q.arrays and k not in cap.buffers}
        state = dict(q.arrays)
        grad_scales = qas_scales(q.layers, optimizer.qas)
        base = {**cap.params, **cap.buffers}

        def export(st, q=q, base=base):
            return dequantized_state(base, st, q.layers, q.folds)
    else:
        layer_graph, layer_arrays = forward, params
    layers = find_layers(layer_graph, set(params))
    trainable = resolve_scheme(update, layers, {k: layer_arrays[k] for k in params}, set(cap.frozen_params))
    train_forward, batch_stats = forward, ()
    if batchnorm == "train":
        train_forward, batch_stats = use_batch_statistics(forward, batchnorm_momenta(model))
        train_forward = stage("batch_statistics", train_forward)
    with_loss = stage("with_loss", attach_loss(train_forward, loss))
    joint = stage("backward", build_backward(with_loss, "loss", trainable))
    grads = stage("pruned", eliminate_dead_code(joint))
    grads = stage("fused_bn_backward", fuse_batchnorm_backward(grads))  # in the gradients and the step alike
    updated = stage("updates", insert_updates(grads, trainable, optimizer.lr, optimizer.momentum,
                                              optimizer.weight_decay, grad_scales, optimizer.seed))
    if batch_stats:
        updated = stage("batch_stat_updates", insert_stat_updates(updated, batch_stats))
    ram_inputs = set(data_inputs) | {LABEL, STEP}
    early = apply_updates_early(updated)
    if quantize == "int8":  # frozen expansion convs stream into their depthwise conv, channel by channel;
        early = fuse_pointwise_depthwise(early)  # frozen chains at the forward peak run row by row
        early = stream_frozen_chains(early, data_inputs)
        early = fuse_weight_grad_update(early)  # weight gradients applied one channel at a time
    train = stage("reordered", reorder_for_memory(early, ram_inputs))

    state_names = list(trainable) + ([momentum_name(p) for p in trainable] if optimizer.momentum else [])
    state_names += [n for s in batch_stats for n in (s.running_mean, s.running_var, s.tracked) if n is not None]
    memory = plan_memory(train, ram_inputs, state_names, trained_channel_bytes(trainable, state))
    if budget is not None and budget.sram is not None and memory.peak_bytes > budget.sram:
        raise BudgetError(f"the program needs {memory.peak_bytes:,} B of SRAM at its peak "
                          f"({memory.summary()}), over the budget of {budget.sram:,} B; "
                          f"the smallest budget that fits this update scheme is {memory.peak_bytes:,} B")
    if budget is not None and budget.flash is not None and memory.frozen_bytes > budget.flash:
        raise BudgetError(f"read-only weights need {memory.frozen_bytes:,} B of flash, over the budget "
                          f"of {budget.flash:,} B")
    prog = Program(inputs=cap.inputs, graph_inputs=data_inputs, input_transform=transform, state=state,
                   stages=stages, forward=forward, grad_graph=grads, train_graph=train, trainable=trainable,
                   layers=tuple(layers), memory=memory, loss=loss,
                   optimizer=optimizer, state_aliases=_state_aliases(model, set(cap.params) | set(cap.buffers)),
                   export=export, quantize=quantize, scheme=update, op_sources=_op_sources(cap),
                   source_lines=cap.source)
    return _on_backend(prog, backend)


def _op_sources(cap) -> dict[str, tuple[str, ...]]:
    """Each captured op's model source lines, in graph order, without repeats."""
    out: dict[str, list[str]] = {}
    for i, n in enumerate(cap.graph.nodes):
        line = cap.source.get(i)
        if line and line not in out.setdefault(n.op, []):
            out[n.op].append(line)
    return {op: tuple(lines) for op, lines in out.items()}


def _on_backend(prog: Program, backend: str) -> Program:
    """The program run by `backend` (the reference runner, or the C backend's CRunner)."""
    if backend == "c":
        from .backends.c.host import to_c_program
        from .backends.capabilities import check_program

        check_program(prog, "c")  # an op without a C kernel: refused before any C is built
        return to_c_program(prog)
    return prog


def _compile_auto(model, example_inputs, loss, quantize, optimizer, budget, backend, calibration, contributions,
                  search, batchnorm="eval") -> Program:
    table = as_table(contributions)
    if table.meta.get("quantize", quantize) != quantize:
        raise ContributionError(f"the contribution table was measured for quantize={table.meta['quantize']!r} "
                                f"(its channel choice), not {quantize!r}")

    def compile_scheme(scheme):
        return compile(model, example_inputs, loss, scheme, quantize, optimizer, None, "reference", calibration,
                       batchnorm=batchnorm)

    try:
        prog, info = search_scheme(table, budget.sram, CostCache(compile_scheme), search, seed=optimizer.seed)
    except InfeasibleBudget as err:
        raise BudgetError(f"update='auto': {err}") from err
    if budget.flash is not None and prog.memory.frozen_bytes > budget.flash:
        raise BudgetError(f"read-only weights need {prog.memory.frozen_bytes:,} B of flash, over the budget "
                          f"of {budget.flash:,} B")
    return _on_backend(prog.replace(search=info), backend)


def _state_aliases(model: torch.nn.Module, names: set[str]) -> dict[str, str]:
    """Map each key of model.state_dict() to the captured tensor holding it (tied weights
    appear under several keys but are captured once)."""
    sd = model.state_dict(keep_vars=True)
    by_ptr = {t.data_ptr(): k for k, t in sd.items() if k in names}
    out = {}
    for k, t in sd.items():
        target = k if k in names else by_ptr.get(t.data_ptr())
        if target is None:
            raise ValueError(f"state_dict entry {k!r} is not used by the captured graph and shares no storage "
                             f"with one that is")
        out[k] = target
    return out


def _check_args(example_inputs, loss, update, quantize, optimizer, budget, backend, contributions=None,
                search="exact", batchnorm="eval"):
    if not isinstance(example_inputs, (tuple, list)) or not example_inputs:
        raise TypeError("example_inputs must be a non-empty tuple of arrays or tensors, e.g. (x,)")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if isinstance(update, str):
        _check_auto(update, budget, contributions, search)
    elif contributions is not None:
        raise ValueError("contributions= is used only with update='auto'")
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize={quantize!r}: use None (float32) or 'int8'")
    if not isinstance(optimizer, SGD):
        raise TypeError(f"optimizer must be edgetrain.SGD, got {type(optimizer).__name__}")
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be edgetrain.Budget, got {type(budget).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: available backends are {BACKENDS}")
    if batchnorm not in BATCHNORM:
        raise ValueError(f"batchnorm={batchnorm!r}: use 'eval' (running statistics) or 'train' (batch statistics, "
                         f"running statistics updated as torch's model.train())")
    if batchnorm == "train" and quantize is not None:
        raise ValueError("batchnorm='train' needs a float program: quantize='int8' folds batch norm into the "
                         "convolution before it")


def _check_auto(update, budget, contributions, search):
    if update != "auto":
        raise ValueError(f"update={update!r}: pass 'auto', Full(), BiasOnly(), LastK(k) or Sparse(...)")
    if not isinstance(budget, Budget) or budget.sram is None:
        raise ValueError("update='auto' searches under a memory budget: pass budget=edgetrain.Budget(sram=...)")
    if contributions is None:
        raise ValueError("update='auto' maximises measured accuracy gains: pass contributions= a "
                         "ContributionTable or the path of its JSON, made by "
                         "edgetrain.sparse.analyze_contributions(model, (x, y), (x_test, y_test)).save(path) "
                         "or by bench/contribution.py (docs/results/contrib-<model>.json)")
    if search not in SEARCHES:
        raise ValueError(f"search={search!r}: use one of {SEARCHES}")
