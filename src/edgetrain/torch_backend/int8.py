"""options={"quantize": "int8"}: each Dynamo graph runs as the int8 program a
microcontroller runs (batch norm folded, int8 weights and activations, edgetrain's
fixed-point int8 kernels), and its backward is edgetrain's compile-time autodiff of that
int8 graph, started from the gradients torch autograd hands in.

The PyTorch parameters stay float and the user's torch optimizer steps them
(quantization-aware training with a straight-through gradient). At every call they are
put on the device's integer grid, with scales fixed at the first call:

    w_int = clamp(round(a * W / s_w), -127, 127)        a = gamma / sqrt(var + eps) of a folded
    b_int = round((beta + a * (b - mean)) / (s_x * s_w))  batch norm (1 and no beta without one)

so d loss / d W = a / s_w * d loss / d w_int (zero where w_int clamps): edgetrain's int8
backward gives d loss / d w_int. A float SGD step on W then moves w_int by
lr * a^2 / s_w^2 * d loss / d w_int, Quantization-Aware Scaling's s_w^-2 (times a^2 on a
folded batch norm's weight).

- Scales: the published ones where option "specs" gives them (a pre-quantized model from
  `models.from_tiny_training`), else activations from the ranges seen on the calibration
  batches (option "calibration", default: the first call's inputs) and weights from the
  first call's values; all are kept for every later input shape (a smaller last batch), as
  the device keeps them.
- A folded batch norm's gamma gets no gradient (the device trains the folded weight, which
  W carries); the folded bias trains beta, or the conv's bias where the norm has no beta.
- The backward runs the planned training step (forward and backward in one node order,
  the graph the memory plan and the budget are for) on the inputs the forward saw.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .. import pipeline
from ..autodiff import grad_name
from ..interpreter import run_graph
from ..frontend.capture import CaptureError
from ..ir import FLOAT_DTYPES, Graph, TensorType, Value, new_value
from ..memory import plan_memory, trained_channel_bytes
from ..ops.fixed_point import INT32_MAX, INT32_MIN
from ..quantize import Quantized, quantize_int8
from ..quantize.qparams import WEIGHT_QMAX
from ..trainable import SchemeError, find_layers, resolve_scheme
from .graphs import AotGraphs, FlatInput, entry_value, to_numpy
from .options import BackendOptions, Named
from .translate import Transposed
from .translate_losses import check_class_labels


@dataclass(frozen=True)
class FixedScales:
    """What the first compiled shape fixed for all others: the calibrated ranges (keyed by
    each value's place in the folded graph) and every layer's weight scales."""

    ranges: dict
    weight_scales: dict


def value_keys(g: Graph) -> dict[Value, tuple]:
    """A key per value of `g` that names the same value in the graph of another input shape."""
    keys: dict[Value, tuple] = {v: ("input", v.name) for v in g.inputs}
    for i, n in enumerate(g.nodes):
        for j, o in enumerate(n.outputs):
            keys[o] = ("node", i, n.op, j)
    return keys


@dataclass(frozen=True)
class LayerMap:
    """How one quantized layer's int8 weight and int32 bias follow the float parameters."""

    weight: str  # the layer's weight: the int8 state's name and the torch parameter's
    bias: str  # the int32 bias's state name
    w_factor: np.ndarray  # float64 per output channel: a folded norm's gamma / sqrt(var + eps), else 1
    w_scales: np.ndarray  # float32
    acc_scales: np.ndarray  # float64 s_x * s_w
    bias_param: Optional[str]  # the torch parameter the bias trains (beta, else the conv bias), if any
    bias_factor: np.ndarray  # float64: b_real = bias_param * bias_factor + bias_const
    bias_const: np.ndarray


def layer_maps(q: Quantized, arrays: dict, params: set) -> dict[str, LayerMap]:
    folds = {f.weight: f for f in q.folds}
    maps = {}
    for w, layer in q.layers.items():
        s_w = np.asarray(layer.w_scales, dtype=np.float32)
        acc = np.float64(layer.x.scale) * s_w.astype(np.float64)
        ones, zeros = np.ones(len(s_w)), np.zeros(len(s_w))
        f = folds.get(w)
        if f is None:  # (a transposed convolution's weight scales are per row of its layout)
            bias_param = layer.bias if layer.bias in params else None
            rows = np.asarray(layer.row_scales, dtype=np.float32)
            maps[w] = LayerMap(w, layer.bias, np.ones(len(rows)), rows, acc, bias_param, ones, zeros)
            continue
        mean, var = (np.asarray(arrays[k], dtype=np.float64) for k in (f.mean, f.var))
        gamma = np.asarray(arrays[f.norm_weight], dtype=np.float64) if f.norm_weight else ones
        a = gamma / np.sqrt(var + f.eps)
        b0 = np.asarray(arrays[f.conv_bias], dtype=np.float64) if f.conv_bias else zeros
        if f.norm_bias:
            maps[w] = LayerMap(w, layer.bias, a, s_w, acc, f.norm_bias, ones, (b0 - mean) * a)
        elif f.conv_bias:
            maps[w] = LayerMap(w, layer.bias, a, s_w, acc, f.conv_bias, a, -mean * a)
        else:
            maps[w] = LayerMap(w, layer.bias, a, s_w, acc, None, ones, -mean * a)
    return maps


def _channels(a: np.ndarray, ndim: int) -> torch.Tensor:
    return torch.from_numpy(a).reshape((-1,) + (1,) * (ndim - 1))


def _on_grid(x: torch.Tensor, lo: float, hi: float, clamp_grad: bool) -> tuple[torch.Tensor, np.ndarray]:
    """(x rounded to the integer grid with a straight-through gradient, the integers). With
    `clamp_grad` the gradient is zero where rounding alone would leave [lo, hi] (the
    integer clamps), as in PyTorch's FakeQuantize."""
    c = torch.clamp(x, lo - 0.5, hi + 0.5) if clamp_grad else x
    r = torch.clamp(torch.round(c.detach()), lo, hi)
    return c + (r - c).detach(), r.numpy()


class Int8Program:
    """One Dynamo graph at one set of input shapes, as the int8 program: `forward` (its
    user outputs), `step` (forward and the backward from the outputs' cotangents to the
    trained int tensors), their memory plans, and the map from torch tensors to its state."""

    def __init__(self, flat: list[FlatInput], opts: BackendOptions, gm: torch.fx.GraphModule,
                 fixed: Optional[FixedScales], calibration: Optional[list]):
        self.flat = flat
        self.runs = {"forward": 0, "backward": 0}
        g = AotGraphs(flat, Named(frozenset()), gm, random=False)
        if g.constants:
            raise CaptureError("quantize='int8': the graph builds constant tensors (an attention mask); the int8 "
                               "program has no attention kernels")
        self.entries, self.labels = g.entries, g.labels
        self.float_outputs, self.float_inputs = g.forward.outputs, tuple(g.fw_inputs)  # what entries name
        self.data = [f.name for f in flat if f.kind == "input"]
        arrays = {f.name: f.array if f.kind == "param" else to_numpy(f.value)
                  for f in flat if f.kind in ("param", "buffer")}
        self.params = {f.name: f.value for f in flat if f.kind == "param"}
        if fixed is None:
            batches = calibration or [tuple(to_numpy(f.value) for f in flat if f.kind == "input")]
            q = quantize_int8(g.forward, arrays, opts.specs or {}, batches)
            keys = value_keys(q.folded)
            self.fixed = FixedScales({keys[v]: r for v, r in q.ranges.items()},
                                     {w: np.asarray(l.w_scales, np.float32) for w, l in q.layers.items()})
        else:
            q = quantize_int8(g.forward, arrays, opts.specs or {}, (), ranges=self._ranges(fixed),
                              weight_scales=fixed.weight_scales)
            self.fixed = fixed
        self.q = q
        self.maps = layer_maps(q, arrays, set(self.params))
        self.state_names = [v.name for v in q.graph.inputs if v.name in q.arrays]
        self.bias_of = {m.bias: m for m in self.maps.values()}
        self.trainable = self._resolve(opts.update)
        self.forward = q.graph
        self.forward_memory = plan_memory(q.graph, self.data, [])
        self.step, self.tangents = self._step_graph()
        self.memory = self.forward_memory if self.step is None else plan_memory(
            self.step, self.ram_names(), list(self.trainable),
            trained_channel_bytes(self.trainable, q.arrays))

    @staticmethod
    def _ranges(fixed: FixedScales):
        def ranges(folded: Graph, values):
            keys = value_keys(folded)
            missing = [v for v in values if keys[v] not in fixed.ranges]
            if missing:
                raise CaptureError("quantize='int8': the graph for these input shapes differs from the one "
                                   "calibrated at the first call, so its int8 scales cannot be kept")
            return {v: fixed.ranges[keys[v]] for v in values}

        return ranges

    # -- which int tensors train, and the torch parameter each one's gradient reaches --------
    def source(self, name: str) -> Optional[str]:
        if name in self.maps:
            return name
        if name in self.bias_of:
            return self.bias_of[name].bias_param
        return name if name in self.params else None

    def _resolve(self, update) -> dict:
        names = [n for n in self.state_names if self.source(n) is not None]
        live = {n for n in names if self.params[self.source(n)].requires_grad}
        if isinstance(update, Named):
            return {n: None for n in names if n in live and self.source(n) in update.names}
        arrays = {n: self.q.folded_arrays[n] for n in self.state_names if n in self.q.folded_arrays
                  and (n in self.maps or n in self.bias_of or n in self.params)}
        try:
            return resolve_scheme(update, find_layers(self.q.folded, set(arrays)), arrays, set(arrays) - live)
        except SchemeError as err:
            if "trains no parameter" in str(err):
                return {}
            raise

    def _step_graph(self) -> tuple[Optional[Graph], list[tuple[int, Value]]]:
        """The training step and its cotangent inputs, (forward output index, input), one per
        float output."""
        if not self.trainable:
            return None, []
        g = self.q.graph
        tangents = [(i, new_value(TensorType(v.shape, v.dtype), f"tangent:{i}"))
                    for i, v in enumerate(g.outputs) if v.dtype in FLOAT_DTYPES]
        step = pipeline.vjp(g, self.trainable, {g.output_names[i]: t for i, t in tangents}).graph
        return step, tangents  # compile()'s backward steps

    # -- running -----------------------------------------------------------------------------
    def state(self, by_name: dict) -> tuple[dict, list]:
        """The int8 state from the torch tensors: ({state name: array}, [(trained state
        name, the torch tensor its gradient enters)])."""
        feeds, route = {}, []
        grad = torch.is_grad_enabled()
        for name in self.state_names:
            want = grad and name in self.trainable
            if name in self.maps:
                m = self.maps[name]
                w = by_name[name]
                wf = (w.double() * _channels(m.w_factor, w.dim())).float()
                x = wf / _channels(m.w_scales, w.dim())
                t, ints = _on_grid(x if want else x.detach(), -WEIGHT_QMAX, WEIGHT_QMAX, clamp_grad=True)
                feeds[name] = ints.astype(np.int8)
            elif name in self.bias_of:
                m = self.bias_of[name]
                src = by_name.get(m.bias_param) if m.bias_param else None
                real = torch.from_numpy(m.bias_const)
                if src is not None:
                    real = real + src.double() * torch.from_numpy(m.bias_factor)
                x = real / torch.from_numpy(m.acc_scales)
                t, ints = _on_grid(x if want else x.detach(), INT32_MIN, INT32_MAX, clamp_grad=False)
                feeds[name] = ints.astype(np.int32)
            else:
                t = by_name[name]
                feeds[name] = to_numpy(t).copy()
            if want:
                route.append((name, t))
        return feeds, route

    def __call__(self, tensors: list) -> tuple:
        """The Dynamo graph's outputs for its flat inputs (parameters, buffers, arguments)."""
        by_name = {f.name: t for f, t in zip(self.flat, tensors)}
        self.runs["forward"] += 1
        feeds, route = self.state(by_name)
        for name in self.data:
            feeds[name] = to_numpy(by_name[name]).copy()
        check_class_labels(self.labels, feeds)
        if route:
            outs = _Int8Step.apply(self, feeds, [n for n, _ in route], *[t for _, t in route])
        else:
            outs = self.run_forward(feeds)
        value_of = dict(zip(self.float_outputs, outs))  # the int8 graph keeps the float graph's outputs
        inputs = {v: by_name[v.name] for v in self.float_inputs}

        def tensor(v):
            return value_of[v] if v in value_of else inputs[v]

        result = []
        for e in self.entries:
            v = entry_value(e)
            if isinstance(v, Value):
                result.append(tensor(v).t() if isinstance(e, Transposed) else tensor(v))
            else:
                result.append(e)
        return tuple(result)

    def run_forward(self, feeds: dict) -> tuple:
        outs, _ = run_graph(self.forward, feeds, self.data)
        return tuple(torch.from_numpy(np.array(outs[n])) for n in self.forward.output_names)

    def run_step(self, feeds: dict, grad_outs) -> dict:
        """{trained state name: d loss / d that int tensor (its whole shape)}."""
        self.runs["backward"] += 1
        feeds = dict(feeds)
        for i, t in self.tangents:
            g = grad_outs[i]
            feeds[t.name] = (np.zeros(t.shape, t.dtype) if g is None
                             else np.ascontiguousarray(g.detach().numpy(), dtype=t.dtype))
        out, _ = run_graph(self.step, feeds, self.ram_names())
        grads = {}
        for name, sel in self.trainable.items():
            gv = out[grad_name(name)]
            grads[name] = gv if sel is None else sel.scatter(gv, self.q.arrays[name].shape)
        return grads

    def ram_names(self) -> list[str]:
        """The step's inputs in RAM: the data and the cotangents."""
        return self.data + [t.name for _, t in self.tangents]


class _Int8Step(torch.autograd.Function):
    """The int8 forward; its backward runs the planned training step."""

    @staticmethod
    def forward(ctx, prog: Int8Program, feeds: dict, names: list, *routed):
        ctx.prog, ctx.feeds, ctx.names = prog, feeds, names
        ctx.dtypes = [t.dtype for t in routed]
        return prog.run_forward(feeds)

    @staticmethod
    def backward(ctx, *grad_outs):
        grads = ctx.prog.run_step(ctx.feeds, grad_outs)
        return (None, None, None) + tuple(torch.from_numpy(np.ascontiguousarray(grads[n])).to(d)
                                          for n, d in zip(ctx.names, ctx.dtypes))
