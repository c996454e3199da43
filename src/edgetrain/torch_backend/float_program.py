"""The float path of torch.compile(backend="edgetrain"): each Dynamo graph at one set of
input shapes runs as edgetrain's forward graph (AOTAutograd's forward, translated with the
aten converters et.compile uses), and its backward is edgetrain's one autodiff
(`build_backward`) of that forward, started from the cotangents torch autograd hands in: a
vector-Jacobian product toward the trained parameters (and the graph inputs that need a
gradient, activations of an earlier graph at a graph break).

As in the int8 path (int8.py), the forward saves its inputs, not its activations: the
backward runs the planned training step (the forward again, then the reverse sweep, in one
node order: the graph the memory plan and the budget are for). The step's forward leaves
out in-place updates (a train-mode batch norm's running statistics), so they happen once,
in the forward.

Runners: the numpy reference runtime, or with options={"backend": "c"} each graph as one C
function built by backends/c/graph_lib.py (float32 kernels, the same ones et.compile's C
programs run), compiled at the first call.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .. import pipeline
from ..autodiff import grad_name
from ..interpreter import run_graph
from ..ir import FLOAT_DTYPES, Graph, Value, new_value
from ..memory import plan_memory, trained_channel_bytes
from ..ops import get_op
from .graphs import AotGraphs, FlatInput, entry_value, to_numpy
from .options import BackendOptions
from .translate import Transposed, Unused
from .translate_losses import check_class_labels


def _reference_runner(g: Graph, ram: list[str]):
    return lambda feeds: run_graph(g, feeds, ram)[0]


def _c_runner(g: Graph):
    """`g` built as C: feeds by input name -> {output name: array}."""
    from ..backends.c.graph_lib import build_graph_library
    from ..backends.c.host import DEFAULT_CFLAGS

    run = build_graph_library(g, DEFAULT_CFLAGS)
    names = [v.name for v in g.inputs]
    return lambda feeds: dict(zip(g.output_names, run([feeds[n] for n in names])))


def _placeholder(dtype) -> torch.Tensor:
    """What the graph returns for a value nobody reads (an empty tensor)."""
    return torch.empty(0, dtype=dtype if isinstance(dtype, torch.dtype) else torch.float32)


class FloatProgram:
    """`forward` (the Dynamo graph's outputs and the new values of the buffers it writes),
    `step` (the forward and the backward from the outputs' cotangents to `wrt`), their memory
    plans, and the runtime between torch tensors and numpy arrays."""

    def __init__(self, flat: list[FlatInput], opts: BackendOptions, gm: torch.fx.GraphModule,
                 mutated: tuple[int, ...], grad: bool):
        self.flat = flat
        self.runs = {"forward": 0, "backward": 0}
        g = AotGraphs(flat, opts.update, gm, mutated)
        self.g, self.entries, self.labels, self.forward = g, g.entries, g.labels, g.forward
        self.trainable = g.trainable
        inputs = [f.name for f in flat if f.kind == "input" and f.value.requires_grad
                  and f.value.dtype.is_floating_point] if grad else []
        self.wrt = {**(self.trainable if grad else {}), **{n: None for n in inputs}}
        self.data = g.ram_names()
        self.forward_memory = plan_memory(self.forward, self.data, g.written())
        self.step, self.tangents = self._step_graph() if self.wrt else (None, [])
        self.memory = self.forward_memory if self.step is None else plan_memory(
            self.step, self.ram_names(), list(self.trainable),
            trained_channel_bytes(self.trainable, {f.name: f.array for f in flat if f.kind == "param"}))
        self.backend = opts.backend
        if opts.backend == "c":
            self._run_fwd = _c_runner(self.forward)
            self._run_step = _c_runner(self.step) if self.step is not None else None
        else:
            self._run_fwd = _reference_runner(self.forward, self.data)
            self._run_step = _reference_runner(self.step, self.ram_names()) if self.step is not None else None

    def _step_graph(self) -> tuple[Optional[Graph], list[tuple[str, Value]]]:
        """The training step and its cotangent inputs, (forward output name, input), one per
        float output computed by the graph."""
        fwd = self.forward
        user = [(n, v) for n, v in zip(fwd.output_names, fwd.outputs) if n.startswith("out:")]
        tangents = [(n, new_value(v.type, f"tangent:{n[4:]}")) for n, v in user if v.dtype in FLOAT_DTYPES]
        if not tangents:
            return None, []
        pure = tuple(n for n in fwd.nodes if not get_op(n.op).mutates)  # the statistics move in the forward only
        g = fwd.replace(nodes=pure, outputs=tuple(v for _, v in user), output_names=tuple(n for n, _ in user))
        return pipeline.vjp(g, self.wrt, dict(tangents)).graph, tangents  # compile()'s backward steps

    def ram_names(self) -> list[str]:
        """The step's inputs in RAM: the data and the cotangents."""
        return self.data + [t.name for _, t in self.tangents]

    # -- running -----------------------------------------------------------------------------
    def __call__(self, tensors: list) -> tuple:
        """The Dynamo graph's outputs for its flat inputs (parameters, buffers, arguments)."""
        by_name = {f.name: t for f, t in zip(self.flat, tensors)}
        self.runs["forward"] += 1
        drawn = self.g.draw()  # every draw, used or not, as eager draws them all
        fixed = {**self.g.constants, **drawn}
        feeds = {v.name: fixed[v.name] if v.name in fixed else to_numpy(by_name[v.name]) for v in self.forward.inputs}
        check_class_labels(self.labels, feeds)
        routed = [n for n in self.wrt if by_name[n].requires_grad] if torch.is_grad_enabled() else []
        if self.step is not None and routed:
            outs = _FloatStep.apply(self, feeds, tensors, routed, *[by_name[n] for n in routed])
        else:
            outs = self.run_forward(feeds, tensors)
        value_of = dict(zip(self.forward.outputs, outs))

        def tensor(v):
            return value_of[v] if v in value_of else by_name[v.name]

        result = []
        for e in self.entries:
            v = entry_value(e)
            if isinstance(v, Value):
                result.append(tensor(v).t() if isinstance(e, Transposed) else tensor(v))
            elif isinstance(e, Unused):
                result.append(_placeholder(None))
            else:
                result.append(e)
        return tuple(result)

    def run_forward(self, feeds: dict, tensors: list) -> tuple:
        """The forward's user outputs as tensors; the inputs it writes are written."""
        outs = self._run_fwd(feeds)
        for i, _ in self.g.mutations:
            new, old = outs[f"mutated:{self.flat[i].name}"], feeds[self.flat[i].name]
            if not np.shares_memory(new, old):  # an in-place op wrote the buffer itself already
                with torch.no_grad():
                    tensors[i].copy_(torch.from_numpy(np.array(new, order="C")))
        n_user = len(self.forward.outputs) - len(self.g.mutations)
        return tuple(torch.from_numpy(np.array(outs[n])) for n in self.forward.output_names[:n_user])

    def run_step(self, feeds: dict, grad_outs) -> dict:
        """{name in wrt: d loss / d that tensor (its whole shape)}."""
        self.runs["backward"] += 1
        feeds = dict(feeds)
        index = {n: k for k, n in enumerate(self.forward.output_names)}
        for name, t in self.tangents:
            g = grad_outs[index[name]]
            feeds[t.name] = (np.zeros(t.shape, t.dtype) if g is None
                             else np.array(g.detach().numpy(), dtype=t.dtype, order="C").reshape(t.shape))
        out = self._run_step(feeds)
        grads = {}
        for f in self.flat:
            if f.name in self.wrt:
                gv, sel = out[grad_name(f.name)], self.wrt[f.name]
                grads[f.name] = gv if sel is None else sel.scatter(gv, tuple(f.value.shape))
        return grads


class _FloatStep(torch.autograd.Function):
    """The forward graph; its backward runs the planned training step."""

    @staticmethod
    def forward(ctx, prog: FloatProgram, feeds: dict, tensors: list, names: list, *routed):
        ctx.prog, ctx.feeds, ctx.names = prog, feeds, names
        ctx.dtypes = [t.dtype for t in routed]
        outs = prog.run_forward(feeds, tensors)
        ctx.mark_non_differentiable(*[o for o in outs if not o.dtype.is_floating_point])
        return outs

    @staticmethod
    def backward(ctx, *grad_outs):
        grads = ctx.prog.run_step(ctx.feeds, grad_outs)
        return (None, None, None, None) + tuple(torch.from_numpy(np.ascontiguousarray(grads[n])).to(d)
                                                for n, d in zip(ctx.names, ctx.dtypes))
