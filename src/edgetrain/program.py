"""Program: the public facade of a model compiled for training.

It holds a frozen compiled program (runtime/compiled.py: graphs, memory report, trained
selection, quantization, schedule, ...) and a runner (runtime/runner.py; the reference runner
of backends/reference_runner.py, the C runner of backends/c/host.py) that holds the weights
and runs `step`, `gradients` and `predict`.
The compiled program's fields read as the Program's own through explicit read-only properties
(`prog.train_graph`, `prog.memory`, ...: one per CompiledProgram field, checked by a test); what
only a runner has (the C runner's `c_files`, `check_guards`, ...) is `prog.runner.<name>`.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Mapping, Optional

import numpy as np

from .runtime.compiled import COMPILED_FIELDS, CompiledProgram
from .backends.reference_runner import ReferenceRunner
from .runtime.runner import (MAX_TRAIN_MAGNITUDE, NonFiniteLossError, Runner, as_array,
                     check_trainable)
from .runtime.trained import TrainedTensor, trained_tensors, with_trained
from .trainable.lora import LoRA, merge_adapters, peft_state_dict

__all__ = ["Program", "NonFiniteLossError", "MAX_TRAIN_MAGNITUDE", "TrainedTensor", "as_array", "check_trainable"]


def compiled_field(name: str, doc: str) -> property:
    """A read-only property of Program reading field `name` of its compiled program."""
    return property(lambda self: getattr(self.compiled, name), doc=f"{doc} (CompiledProgram.{name}).")


class Program:
    """A model compiled for training (`compiled`) and what runs it (`runner`). Weights live
    in `self.state` (numpy arrays, the runner's)."""

    def __init__(self, compiled: Optional[CompiledProgram] = None, runner: Optional[Runner] = None, **fields):
        """`Program(compiled, runner)`, the runner by default the reference one; or
        `Program(**fields)` with compile()'s keywords (CompiledProgram.build)."""
        if compiled is None:
            compiled = CompiledProgram.build(**fields)
        elif fields:
            raise TypeError("Program(compiled, runner) takes no other arguments")
        if runner is not None and runner.compiled is not compiled:
            raise ValueError("the runner runs another compiled program")
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "runner", runner if runner is not None else ReferenceRunner(compiled))
        #: the linked firmware's size report (backends.c.cortexm.FirmwareSize), once
        #: `record_firmware` noted it
        object.__setattr__(self, "firmware", None)

    def __setattr__(self, name: str, value) -> None:
        if name in ("state", "steps"):
            setattr(self.runner, name, value)
        elif name in COMPILED_FIELDS or name in ("compiled", "runner"):
            raise AttributeError(f"Program.{name} is part of the frozen compiled program: make another "
                                 f"(dataclasses.replace(prog.compiled, ...), prog.replace(...))")
        else:
            object.__setattr__(self, name, value)

    def __copy__(self) -> "Program":
        """A shallow copy: the same compiled program, a shallow copy of the runner (sharing its
        state until either's `state` is rebound)."""
        return Program(self.compiled, copy.copy(self.runner))

    # --- the compiled program's fields, read-only -----------------------------------------------
    inputs = compiled_field("inputs", "the model's inputs, as the user passes them")
    graph_inputs = compiled_field("graph_inputs", "the compiled graphs' data inputs")
    input_transform = compiled_field("input_transform", "int8: the graph making int8 samples of float data")
    stages = compiled_field("stages", "every intermediate graph, by pass")
    forward_graph = compiled_field("forward_graph", "the forward (predict) graph")
    grad_graph = compiled_field("grad_graph", "the gradient graph (no update)")
    train_graph = compiled_field("train_graph", "the training step's graph")
    trainable = compiled_field("trainable", "param -> None (all of it) or the ChannelSelect trained")
    layers = compiled_field("layers", "the model's conv / linear layers, in forward order")
    memory = compiled_field("memory", "the memory plan of the training step (MemoryReport)")
    loss = compiled_field("loss", "the training loss's name")
    ignore_index = compiled_field("ignore_index", "the class losses' ignored label")
    optimizer = compiled_field("optimizer", "the optimizer (edgetrain.SGD)")
    state_aliases = compiled_field("state_aliases", "the model's state_dict key -> state name")
    initial_state = compiled_field("initial_state", "the weights the program starts from")
    export = compiled_field("export", "int8: the state -> the model's float values")
    quantize = compiled_field("quantize", "None (float32) or 'int8'")
    scheme = compiled_field("scheme", "the update scheme it trains")
    search = compiled_field("search", "update='auto': how the scheme was chosen")
    schedule = compiled_field("schedule", "the rematerialization / paging schedule it runs")
    page_store = compiled_field("page_store", "where that schedule pages tensors to")
    op_sources = compiled_field("op_sources", "captured op -> the model source lines it comes from")
    source_lines = compiled_field("source_lines", "captured node index -> its model source line")
    quant_layers = compiled_field("quant_layers", "int8: weight name -> its layer's quantization")

    # --- state in and out --------------------------------------------------------------------
    @property
    def state(self) -> dict:
        return self.runner.state

    @property
    def steps(self) -> int:
        return self.runner.steps

    @property
    def backend(self) -> str:
        return self.runner.backend

    def load_state(self, state: Mapping[str, np.ndarray] = (), steps: Optional[int] = None) -> None:
        """Replace state entries by `state`'s and the step count by `steps` (a checkpoint's)."""
        self.runner.load_state(state, steps)

    def trained_tensors(self) -> dict[str, TrainedTensor]:
        """{name: TrainedTensor}: a copy of the part of each tensor the scheme trains, at its
        storage dtype, with (int8) the scale and zero point giving its real values
        (runtime/trained.py). What a federated client sends."""
        return trained_tensors(self.compiled, self.state)

    def load_trained(self, values: Mapping[str, np.ndarray]) -> None:
        """Write the trained parts `values` ({name: array} of the shapes and dtypes that
        `trained_tensors` gives) into the state; the rest of each tensor is kept."""
        self.load_state(with_trained(self.compiled, self.state, values))

    def state_dict(self, prefix: Optional[str] = None) -> dict:
        """The current weights as torch tensors under the original model's state_dict keys.
        An int8 program gives its weights' real values (w_scale * w), with each batch norm
        folded into its convolution turned into the identity carrying the folded bias.

        A LoRA program gives its adapters only, under peft's keys
        (`base_model.model.<module>.lora_A.weight`, `...lora_B.weight`), which
        peft.set_peft_model_state_dict and PeftModel.from_pretrained load; `prefix` is stripped
        from each module name: the attribute a wrapper holds the Hugging Face model under (a
        model `self.m = hf_model` compiles with modules named "m.model.layers...": prefix="m.")."""
        import torch

        c = self.compiled
        if isinstance(c.scheme, LoRA):
            sd = peft_state_dict(self.state, list(c.trainable), prefix)
            return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in sd.items()}
        if prefix is not None:
            raise ValueError("state_dict(prefix=...) names a LoRA program's adapters; this program trains no "
                             f"adapters ({c.scheme!r})")
        return self._model_state_dict(self.state)

    def merged_state_dict(self) -> dict:
        """The original model's state_dict (keys as `state_dict` gives for programs without
        adapters) with a LoRA program's adapters merged into their base weights as peft's
        merge_and_unload does: W + (B @ A) * alpha / rank (a convolution: B's 1x1 kernel times
        A's). For a program without adapters, `state_dict()`."""
        c = self.compiled
        if not isinstance(c.scheme, LoRA):
            return self._model_state_dict(self.state)
        base = c.export(self.state) if c.export is not None else self.state
        merged = merge_adapters(base, self.state, list(c.trainable), c.scheme.scaling)
        return self._model_state_dict(merged, exported=True)

    def _model_state_dict(self, state: Mapping[str, np.ndarray], exported: bool = False) -> dict:
        """`state` (exported to the model's float values unless `exported`) as torch tensors
        under the original model's state_dict keys."""
        import torch

        c = self.compiled
        if not exported and c.export is not None:
            state = c.export(state)
        return {k: torch.from_numpy(np.array(state[name], copy=True)) for k, name in c.state_aliases.items()}

    # --- running ---------------------------------------------------------------------------
    def step(self, x, y) -> float:
        """One training step in place; returns the loss. A non-finite loss or weight raises
        NonFiniteLossError and leaves the weights as they were before this step."""
        return self.runner.step(x, y)

    def gradients(self, x, y) -> dict[str, np.ndarray]:
        """Gradients of the loss for the trained parameters, without updating. A parameter
        trained on some channels only gets zeros in the others. For an int8 program the
        gradients of int weights and biases are with respect to the integers themselves
        (d loss / d w_int = w_scale * d loss / d w_real), before QAS."""
        return self.runner.gradients(x, y)

    def predict(self, x) -> np.ndarray:
        """Model outputs for a batch of any size (run in chunks of the compiled batch)."""
        return self.runner.predict(x)

    # --- new programs ------------------------------------------------------------------------
    def replace(self, **changes) -> "Program":
        """The same program with compiled fields changed (dataclasses.replace), run by a runner
        of the same kind from a copy of this one's state."""
        c = dataclasses.replace(self.compiled, **changes)
        return Program(c, self.runner.rebind(c))

    def apply(self, sched, page_file=None) -> "Program":
        """A new program running `sched` (from `edgetrain.remat(self, ...)`): its train graph
        rewritten to recompute and page tensors as the schedule says, pages written to
        `page_file` (default: a temporary file), run by a runner of the same kind from a copy
        of this one's state. See remat/apply.py."""
        from .remat.apply import apply_schedule

        c = apply_schedule(self.compiled, sched, page_file)
        return Program(c, self.runner.rebind(c))

    def record_firmware(self, size) -> None:
        """Note the size report of this program's firmware (backends/c/cortexm.py: flash, SRAM,
        stack, instructions per step) as `self.firmware`; the compiled program is unchanged."""
        object.__setattr__(self, "firmware", size)

    def emit_c(self, out_dir, target: str = "host", samples=(), embed_weights=None, graphs=None):
        """Write this program as a C project (backends/c: host library or Cortex-M firmware)
        into `out_dir`; returns its path. `graphs`: which graphs to emit (backends.c.export.emit_c)."""
        from .backends.c.export import emit_c

        return emit_c(self, out_dir, target=target, samples=samples, embed_weights=embed_weights, graphs=graphs)

    # --- what it trains ------------------------------------------------------------------------
    def update_summary(self) -> str:
        """The update scheme and the layers it chose (frozen, requires_grad=False layers are never chosen)."""
        from .trainable import LoRA, describe_selection
        from .trainable.lora import adapter_modules

        if isinstance(self.scheme, LoRA):
            mods = adapter_modules(self.trainable)
            return f"{self.scheme}: trains adapters on {len(mods)} layers: {', '.join(mods)}"
        return f"{self.scheme}: trains {describe_selection(list(self.compiled.layers), self.trainable)}"

    def __repr__(self) -> str:
        n = sum(self.state[p].size for p in self.trainable)
        return (f"Program(trains {len(self.trainable)} tensors / {n:,} weights, loss={self.loss}, "
                f"{len(self.train_graph.nodes)} nodes; {self.memory.summary()})")
