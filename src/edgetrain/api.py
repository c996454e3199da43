"""compile(): check the arguments, run the pipeline (pipeline.py), build the Program."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Optional, Union

import torch

from . import pipeline
from .config import SGD, Budget
from .passes.loss import LOSSES
from .pipeline import BudgetError, Options
from .program import Program
from .quantize.frozen import FROZEN
from .quantize.headroom import check_headroom
from .sparse import Full, UpdateScheme
from .sparse.auto import SEARCHES, CostCache, search_scheme
from .sparse.contribution import ContributionError, as_table
from .sparse.search import InfeasibleBudget

BACKENDS = ("reference", "c")
QUANTIZE = (None, "int8")
#: batch norm in the training step: "eval" on running statistics (the on-device default, as
#: fine-tuning at batch 1 needs), "train" on batch statistics with torch's running updates
BATCHNORM = ("eval", "train")
#: how the training step computes its backward: float32 arithmetic, or integers only (int8 programs)
BACKWARDS = ("float", "integer")


def compile(model: torch.nn.Module, example_inputs: tuple, loss: Union[str, torch.nn.Module] = "cross_entropy",
            update: Union[UpdateScheme, str] = Full(), quantize: Optional[str] = None,
            optimizer: SGD = SGD(lr=0.01), budget: Optional[Budget] = None,
            backend: str = "reference", calibration: Optional[Iterable] = None,
            contributions=None, search: str = "exact", batchnorm: str = "eval",
            frozen: Optional[str] = None, ignore_index: int = -100, int8_headroom: float = 1,
            threads: Optional[int] = None, backward: str = "float") -> Program:
    """Compile `model` into a training program for inputs shaped like `example_inputs`.

    loss: one of passes/loss.py's LOSSES, or the torch loss module that computes it
    (nn.CrossEntropyLoss(ignore_index=...), nn.MSELoss(), nn.L1Loss(), nn.BCEWithLogitsLoss(),
    with reduction="mean" and no class weights or label smoothing). The class losses do not
    count a label equal to `ignore_index` (torch's default -100; a CrossEntropyLoss module
    brings its own).

    quantize="int8" trains the int8 model a microcontroller runs: batch norm folded, int8
    weights and activations, int32 biases, QAS when `optimizer.qas`. Its scales come from
    the published parameters of a pre-quantized model (`models.from_tiny_training`),
    otherwise from the ranges seen on `calibration` (an iterable of input batches, each an
    array or a tuple of arrays; default: the example inputs). `int8_headroom` H (1 to 127,
    default 1) gives the layers the update scheme trains room to grow: each trained weight's
    int8 scales are H times wider (its pretrained weights take 127 / H steps) and the int8
    outputs of those layers (and what qadd / qcat compute from them) get ranges H times wider
    than calibrated; frozen layers keep theirs (quantize/headroom.py). backward="integer" (int8
    only) computes every gradient, the loss and the SGD update in integers, no float arithmetic
    in the training step (for cores without an FPU; quantize/integer_backward.py): int16
    gradients with static power-of-two exponents calibrated on `calibration`, the cross-entropy
    loss, SGD's momentum and weight decay in fixed point; `prog.gradients` stays the float backward.

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
    does.

    frozen="int8" | "int4" stores every frozen linear and embedding weight (the ones the update
    scheme does not train: with update=LoRA(...), the whole base) quantized, per output channel
    in int8 or in 4-bit groups of 32 inputs (ops/qweights.py gives the layout), dequantized
    inside the kernels; `edgetrain.quantize.dequantized(model, frozen, example_inputs, update)` is the PyTorch model
    with the values the program computes with.

    threads: backend="c" built with OpenMP (backends/c/host.py OPENMP_CFLAGS), its GEMM tiles and its
    kernels' parallel loops on that many threads (an int >= 1); the results do not depend on it. Without
    it, the default serial library (its BLAS on $EDGETRAIN_BLAS_THREADS threads). The reference runtime
    does not use it."""
    if threads is not None:  # backend="c"'s thread count (CRunner): an int >= 1
        from .backends.c.host import check_threads

        threads = check_threads(threads)
    loss, ignore_index = loss_spec(loss, ignore_index)
    _check_args(example_inputs, loss, update, quantize, optimizer, budget, backend, contributions, search,
                batchnorm)
    _check_frozen(frozen, quantize)
    int8_headroom = _check_headroom(int8_headroom, quantize)
    _check_backward(backward, quantize, loss)
    options = Options(loss=loss, ignore_index=ignore_index, update=update, quantize=quantize, optimizer=optimizer,
                      batchnorm=batchnorm, backward=backward,
                      budget=budget, calibration=calibration, frozen=frozen, int8_headroom=int8_headroom)
    if isinstance(update, str):
        return _compile_auto(model, tuple(example_inputs), options, backend, contributions, search, threads)
    return _on_backend(_program(model, pipeline.front(model, tuple(example_inputs), options), options), backend,
                       threads)


def _program(model: torch.nn.Module, front: pipeline.Front, options: Options) -> Program:
    """The Program of `options.update` from the pipeline's front: the train phase, the plan."""
    b = pipeline.train(front, options)
    memory = pipeline.plan(b, options)
    cap = b.cap
    return Program(inputs=cap.inputs, graph_inputs=b.data_inputs, input_transform=b.transform, state=b.state,
                   stages=b.stages, forward=b.forward, grad_graph=b.grads, train_graph=b.graph,
                   trainable=b.trainable, layers=b.layers, memory=memory, loss=options.loss,
                   ignore_index=options.ignore_index,
                   optimizer=options.optimizer,
                   state_aliases=_state_aliases(model, set(cap.params) | set(cap.buffers)),
                   export=pipeline.export_of(b), quantize=options.quantize, scheme=options.update,
                   op_sources=_op_sources(cap), source_lines=cap.source,
                   quant_layers=b.quantized.layers if b.quantized is not None else None)


def _op_sources(cap) -> dict[str, tuple[str, ...]]:
    """Each captured op's model source lines, in graph order, without repeats."""
    out: dict[str, list[str]] = {}
    for i, n in enumerate(cap.graph.nodes):
        line = cap.source.get(i)
        if line and line not in out.setdefault(n.op, []):
            out[n.op].append(line)
    return {op: tuple(lines) for op, lines in out.items()}


def _on_backend(prog: Program, backend: str, threads: Optional[int] = None) -> Program:
    """The program run by `backend` (the reference runner, or the C backend's CRunner on `threads`)."""
    if backend == "c":
        from .backends.c.host import to_c_program
        from .backends.capabilities import check_program

        check_program(prog, "c")  # an op without a C kernel: refused before any C is built
        from .backends.c.host import OPENMP_CFLAGS

        # threads= asks for the threaded (OpenMP) library; without it, the default serial build
        return to_c_program(prog, OPENMP_CFLAGS if threads is not None else None, threads)
    return prog


def _compile_auto(model, example_inputs: tuple, options: Options, backend, contributions, search,
                  threads: Optional[int] = None) -> Program:
    """update="auto": the search (sparse/auto.py) compiles each candidate scheme from one front."""
    table = as_table(contributions)
    if table.meta.get("quantize", options.quantize) != options.quantize:
        raise ContributionError(f"the contribution table was measured for quantize={table.meta['quantize']!r} "
                                f"(its channel choice), not {options.quantize!r}")
    front = pipeline.front(model, example_inputs, options)

    def compile_scheme(scheme):
        return _program(model, front, replace(options, update=scheme, budget=None))

    budget = options.budget
    try:
        prog, info = search_scheme(table, budget.sram, CostCache(compile_scheme), search,
                                   seed=options.optimizer.seed)
    except InfeasibleBudget as err:
        raise BudgetError(f"update='auto': {err}") from err
    if budget.flash is not None:
        pipeline.check_flash(prog.memory, budget)
    return _on_backend(prog.replace(search=info), backend, threads)


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


#: torch's loss modules compile() takes for a loss name, and the settings it computes as torch
#: does (anything else is refused rather than silently computed otherwise)
TORCH_LOSSES = {"CrossEntropyLoss": "cross_entropy", "MSELoss": "mse", "L1Loss": "l1",
                "BCEWithLogitsLoss": "bce_with_logits"}


def loss_spec(loss, ignore_index: int = -100) -> tuple[str, int]:
    """(loss name, ignore_index) of compile()'s `loss`: a name as it is, or a torch loss module
    (TORCH_LOSSES) with its ignore_index; anything compile() cannot compute as torch does is
    a ValueError naming the setting."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if not isinstance(loss, torch.nn.Module):
        return loss, ignore_index
    kind = type(loss).__name__
    if kind not in TORCH_LOSSES:
        raise ValueError(f"loss={kind}(): edgetrain computes {', '.join(TORCH_LOSSES)} (or a name of {LOSSES})")
    if getattr(loss, "reduction", "mean") != "mean":
        raise ValueError(f"loss={kind}(reduction={loss.reduction!r}): edgetrain trains on the mean only")
    for attr, off in (("weight", None), ("pos_weight", None), ("label_smoothing", 0.0)):
        v = getattr(loss, attr, off)
        if v is not None and not (off is not None and float(v) == off):
            raise ValueError(f"loss={kind}({attr}=...): not supported (class weights and label smoothing are not "
                             f"computed); use the plain {kind}()")
    if kind == "CrossEntropyLoss":
        if ignore_index != -100 and ignore_index != loss.ignore_index:
            raise ValueError(f"ignore_index={ignore_index} and {kind}(ignore_index={loss.ignore_index}) differ: "
                             f"give it once")
        ignore_index = int(loss.ignore_index)
    return TORCH_LOSSES[kind], ignore_index


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


def _check_frozen(frozen, quantize):
    if frozen not in FROZEN:
        raise ValueError(f"frozen={frozen!r}: use None (float32), 'int8' or 'int4'")
    if frozen is not None and quantize is not None:
        raise ValueError(f"frozen={frozen!r} stores a float program's frozen weights quantized; quantize='int8' "
                         f"already stores every weight in int8: pass one of the two")


def _check_backward(backward, quantize, loss) -> None:
    if backward not in BACKWARDS:
        raise ValueError(f"backward={backward!r}: use one of {BACKWARDS}")
    if backward == "integer" and (quantize != "int8" or loss != "cross_entropy"):
        raise ValueError("backward='integer' trains an int8 program with the cross-entropy loss: pass "
                         f"quantize='int8' and loss='cross_entropy' (got quantize={quantize!r}, loss={loss!r})")


def _check_headroom(headroom, quantize) -> float:
    h = check_headroom(headroom)
    if h != 1 and quantize != "int8":
        raise ValueError(f"int8_headroom={headroom!r} widens int8 scales: it needs quantize='int8'")
    return h


def _check_auto(update, budget, contributions, search):
    if update != "auto":
        raise ValueError(f"update={update!r}: pass 'auto', Full(), BiasOnly(), LastK(k), Sparse(...) or LoRA(...)")
    if not isinstance(budget, Budget) or budget.sram is None:
        raise ValueError("update='auto' searches under a memory budget: pass budget=edgetrain.Budget(sram=...)")
    if contributions is None:
        raise ValueError("update='auto' maximises measured accuracy gains: pass contributions= a "
                         "ContributionTable or the path of its JSON, made by "
                         "edgetrain.sparse.analyze_contributions(model, (x, y), (x_test, y_test)).save(path) "
                         "or by bench/contribution.py (docs/results/contrib-<model>.json)")
    if search not in SEARCHES:
        raise ValueError(f"search={search!r}: use one of {SEARCHES}")
