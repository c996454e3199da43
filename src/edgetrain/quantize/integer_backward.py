"""`backward="integer"`: an int8 training step whose backward and updates are integers only.

`integerize_backward(graph, gradient_ranges, ...)` rewrites the float32 backward of an int8
training step (after the updates are inserted) into the ops of ops/igrad.py and
ops/icross_entropy.py. The forward keeps its integers; its float classifier output becomes
the int32 accumulators the integer loss reads. Every float32 gradient becomes an int16
tensor q standing for q * 2**e with one static exponent e per tensor:

- the loss gradient's is fixed: the softmax's (p - onehot) / count in Q15, 2**k finer
  for a batch of up to 2**(k + LABEL_SLACK_BITS) positions;
- a convolution's input gradient or a sum of two gradients gets the exponent that puts the
  largest magnitude seen in a calibration run (`gradient_ranges`, from the float backward
  on calibration samples: `calibrate_gradients`) at 2**HEADROOM_BITS below int16's bound;
- views, broadcasts, saturation masks and channel selections keep their input's exponent; a
  constant factor (a mean's 1/count) moves it by its power of two and multiplies by the rest.

A weight's gradient and its SGD update become one op that computes each weight's int64
gradient sum and applies it at once in Q16 with stochastic rounding (the float update's
counter hash), the QAS factor and the learning rate folded into one multiplier per row.
SGD's momentum buffer becomes int32 in weight steps (Q16) with the learning rate folded in;
weight decay is one more fixed-point term (ops/igrad.py). An op of the backward without an
integer form raises IntegerBackwardError, naming it.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional

import numpy as np

from ..interpreter import run_graph
from ..ir import Graph, Node, Role, TensorType, Value, new_value
from ..ops.igrad_fixed import MULT_BITS, UPDATE_FRAC, exponent_for, mantissa_shift
from ..ops.qgradupdate import fusable
from ..ops.qoptim import row_scales
from ..passes.dce import eliminate_dead_code
from .calibrate import chunk_feeds

#: a calibrated gradient's largest magnitude lands at 2**(15 - HEADROOM_BITS): room for
#: gradients up to 2**HEADROOM_BITS times larger than calibration saw before they saturate
HEADROOM_BITS = 2
#: calibration batches of the compiled batch size run through the float backward, at most
CALIBRATION_BATCHES = 8
#: the calibration run's labels: random classes from this seed (early training's gradients)
LABEL_SEED = 0
_TARGET_BITS = 15 - HEADROOM_BITS
#: the loss gradient saturates only when fewer than 1/2**LABEL_SLACK_BITS of the positions count
#: (the rest carry ignore_index)
LABEL_SLACK_BITS = 3


class IntegerBackwardError(ValueError):
    """The program's backward has an op, loss or optimizer setting without an integer form."""


def calibrate_gradients(g: Graph, state: Mapping[str, np.ndarray], batches: Iterable, data: tuple,
                        transform: Optional[Graph], classes: int) -> dict[Value, float]:
    """The largest |value| of every float32 tensor of training step `g` over calibration
    `batches` (float model inputs; `transform` makes them the graph's int8 data), labels drawn
    at random from `classes`. The step runs on a copy of `state`: nothing is updated."""
    probe_values = [o for n in g.nodes for o in n.outputs if o.dtype == "float32"]
    probe = g.replace(outputs=tuple(probe_values), output_names=tuple(f"v{i}" for i in range(len(probe_values))))
    src_data = transform.inputs_with(Role.DATA) if transform is not None else tuple(g.input(n) for n in data)
    label, step = g.the_input(Role.LABEL), g.the_input(Role.STEP)
    if label is None:
        raise IntegerBackwardError("backward='integer' trains with a loss on labels")
    rng = np.random.default_rng(LABEL_SEED)
    peak = {v: 0.0 for v in probe_values}
    seen = 0
    for batch in batches:
        for feeds in chunk_feeds(batch, src_data, {}):
            if seen >= CALIBRATION_BATCHES:
                break
            if transform is not None:
                feeds = run_graph(transform, feeds)[0]
            feeds = {**{v.name: np.array(state[v.name]) for v in g.inputs if v.name in state}, **feeds}
            feeds[label.name] = rng.integers(0, classes, size=label.shape).astype(np.int64)
            feeds.update({v.name: np.zeros(v.shape, v.dtype) for v in g.inputs_with(Role.OPTIMIZER_STATE)})
            if step is not None:
                feeds[step.name] = np.array(0, np.int32)
            out, _ = run_graph(probe, feeds)
            for i, v in enumerate(probe_values):
                peak[v] = max(peak[v], float(np.max(np.abs(out[f"v{i}"]), initial=0.0)))
            seen += 1
    if not seen:
        raise IntegerBackwardError("backward='integer' calibrates its gradients on at least one batch of inputs")
    return peak


class _Rewriter:
    """One pass over the nodes: `sub` maps an old value to its new one, `exp` a new int16
    gradient to its exponent; `pending` holds a weight or bias gradient until its update."""

    def __init__(self, ranges: Mapping[Value, float]):
        self.ranges = ranges
        self.nodes: list[Node] = []
        self.sub: dict[Value, Value] = {}
        self.exp: dict[Value, int] = {}
        self.pending: dict[Value, tuple[Node, Value]] = {}  # old gradient -> (its node, its int16 g)
        self.classifier: dict[Value, tuple] = {}  # new integer logits -> (real scale per class, zero point)
        self.loss_only: set[Value] = set()  # float values read by the loss (and views of them) only
        self.const: dict[Value, float] = {}
        self.ce_grad: dict[tuple, Value] = {}
        self.inputs: dict[Value, Value] = {}  # a float momentum buffer -> its int32 one
        self.momenta: set[Value] = set()  # the new momentum buffers the updates write (int32 outputs)

    def v(self, old: Value) -> Value:
        return self.sub.get(old, old)

    def emit(self, op: str, inputs, types, attrs, exp=None) -> list[Value]:
        outs = [new_value(t) for t in types]
        self.nodes.append(Node(op, tuple(inputs), tuple(outs), attrs))
        if exp is not None:
            self.exp[outs[-1]] = exp
        return outs

    def converted(self, v: Value) -> bool:
        return self.v(v) in self.exp or self.v(v) in self.classifier

    def calibrated_exp(self, old: Value) -> int:
        return exponent_for(self.ranges.get(old, 0.0), _TARGET_BITS)

    def rewrite(self, n: Node) -> None:
        ins = [self.v(v) for v in n.inputs]
        a = dict(n.attrs)
        if n.op == "const" and n.out.dtype == "float32":
            self.const[n.out] = float(a["value"])
        if n.op == "qconv2d" and a.get("float_out"):
            (z,) = self.emit("qconv2d", ins, [TensorType(n.out.shape, "int32")], {**a, "acc_out": True})
            self.sub[n.out] = z
            self.classifier[z] = (tuple(float(a["x_scale"]) * float(s) for s in a["w_scales"]), 0)
            return
        if n.op == "dequantize" and n.out in self.loss_only:  # int8 logits (a global mean's): the loss reads them
            self.sub[n.out] = ins[0]
            self.classifier[ins[0]] = ((float(a["scale"]),) * n.out.shape[1], int(a["zero"]))
            return
        if n.op != "qsgd_update" and any(v in self.pending for v in n.inputs):
            raise IntegerBackwardError(f"backward='integer' has no integer form of {n.op} on a weight gradient "
                                       f"(a layer trained on some output channels only?); use backward='float'")
        if not any(self.converted(v) for v in n.inputs) and n.op not in ("qconv2d_grad_weight", "qconv2d_grad_bias",
                                                                         "cross_entropy_grad", "qsgd_update"):
            self.nodes.append(Node(n.op, tuple(ins), n.outputs, n.attrs))
            return
        handler = getattr(self, "_" + n.op, None)
        if handler is None:
            raise IntegerBackwardError(f"backward='integer' has no integer form of {n.op} (in the backward of this "
                                       f"program); use backward='float'")
        handler(n, ins, a)

    # --- the loss ----------------------------------------------------------------------------
    def _reshape(self, n, ins, a):
        x = ins[0]
        (y,) = self.emit(n.op, ins, [TensorType(n.out.shape, x.dtype)], a, self.exp.get(x))
        self.sub[n.out] = y
        if x in self.classifier:
            self.classifier[y] = self.classifier[x]

    _expand = _index_select = _qmask_grad = _permute = _reshape

    def _cross_entropy(self, n, ins, a):
        z, label = ins
        if z not in self.classifier:
            raise IntegerBackwardError("backward='integer' needs the loss right after an int8 classifier layer")
        scales, zero = self.classifier[z]
        ms = [mantissa_shift(s, 16) for s in scales]
        # (p - onehot) / count in Q15, 2**k finer: room for a count down to 1/2**LABEL_SLACK_BITS of the labels
        k = max(0, math.ceil(math.log2(max(1, label.type.numel))) - LABEL_SLACK_BITS)
        loss, grad = self.emit("icross_entropy", [z, label], [n.out.type, TensorType(z.shape, "int16")],
                               {"mult": tuple(m for m, _ in ms), "shift": tuple(s for _, s in ms), "zero": zero,
                                "grad_shift": k,
                                "class_dim": 1, "ignore_index": int(a.get("ignore_index", -100))}, exp=-15 - k)
        self.sub[n.out] = loss
        self.ce_grad[(z, label)] = grad

    def _cross_entropy_grad(self, n, ins, a):
        grad = self.ce_grad.get((ins[1], ins[2]))
        if grad is None:
            raise IntegerBackwardError("backward='integer': the loss gradient without its loss")
        self.sub[n.out] = grad

    # --- arithmetic on gradients -------------------------------------------------------------
    def _mul(self, n, ins, a):
        consts = [self.const.get(v) for v in n.inputs]
        gi = 0 if consts[1] is not None else 1
        c = consts[1 - gi]
        g = ins[gi]
        if c is None or g not in self.exp or n.out.shape != g.shape or c <= 0:
            raise IntegerBackwardError("backward='integer': only a gradient times a positive constant")
        mult, shift = mantissa_shift(c)  # c ~= mult * 2**-shift, mult below 2**(MULT_BITS + 1)
        # q * mult * 2**-(MULT_BITS + 1): at most q, on an exponent MULT_BITS + 1 - shift higher
        (y,) = self.emit("igrad_scale", [g], [TensorType(g.shape, "int16")],
                         {"mult": (mult,), "shift": (MULT_BITS + 1,)}, self.exp[g] + MULT_BITS + 1 - shift)
        self.sub[n.out] = y

    def _add(self, n, ins, a):
        x, y = ins
        if x not in self.exp or y not in self.exp or x.shape != y.shape:
            raise IntegerBackwardError("backward='integer': only a sum of two gradients of one shape")
        e = self.calibrated_exp(n.out)
        (s,) = self.emit("igrad_add", [x, y], [TensorType(x.shape, "int16")],
                         {"shift_a": e - self.exp[x], "shift_b": e - self.exp[y]}, e)
        self.sub[n.out] = s

    def _qconv2d_grad_input(self, n, ins, a):
        g, w = ins
        ws = [float(s) for s in a["w_scales"]]
        _, fm = mantissa_shift(max(ws))
        mult = tuple(int(round(s * 2.0 ** fm)) for s in ws)
        if max(mult) > 2 ** (MULT_BITS + 1):
            raise IntegerBackwardError("backward='integer': a weight scale out of range")
        e = self.calibrated_exp(n.outputs[0])
        keys = ("input_shape", "stride", "padding", "dilation", "groups")
        (gx,) = self.emit("iconv_grad_input", [g, w], [TensorType(n.outputs[0].shape, "int16")],
                          {**{k: a[k] for k in keys}, "mult": mult, "shift": e + fm - self.exp[g]}, e)
        self.sub[n.outputs[0]] = gx

    _qconv2d_dw_grad_input = _qconv2d_grad_input

    # --- weight and bias updates -------------------------------------------------------------
    def _qconv2d_grad_weight(self, n, ins, a):
        self.pending[n.out] = (n, ins[-1])  # (x, g) or (g,)

    _qconv2d_grad_bias = _qconv2d_grad_weight

    def _qsgd_update(self, n, ins, a):
        w, gw, step = n.inputs[:3]
        src = gw
        if src not in self.pending:
            raise IntegerBackwardError("backward='integer': an update whose gradient is not a convolution's")
        gnode, g = self.pending[src]
        if gnode.op == "qconv2d_grad_weight" and not fusable(gnode.attrs, gnode.inputs[0].shape[1]):
            raise IntegerBackwardError(f"backward='integer' trains dense or depthwise convolutions, not "
                                       f"groups={gnode.attrs['groups']}")
        scales = np.asarray(gnode.attrs["scales"], np.float64) * row_scales(a).astype(np.float64)
        ms = [mantissa_shift(float(a["lr"]) * s, UPDATE_FRAC + self.exp[g]) for s in scales]
        decay = mantissa_shift(float(a["lr"]) * float(a["weight_decay"]), UPDATE_FRAC)
        common = {"mult": tuple(m for m, _ in ms), "shift": tuple(s for _, s in ms), "qmin": a["qmin"],
                  "qmax": a["qmax"], "seed": a["seed"], "param_id": a["param_id"], "dim": a["dim"],
                  "index": a["index"], "momentum_q16": int(round(float(a["momentum"]) * 2 ** UPDATE_FRAC)),
                  "decay_mult": decay[0], "decay_shift": decay[1]}
        moms = []
        if len(n.inputs) > 3:  # SGD's momentum buffer: int32 in weight steps (Q16), the learning rate folded in
            old = n.inputs[3]
            moms = [new_value(TensorType(old.shape, "int32"), old.name)]
            self.inputs[old] = moms[0]
        types = [w.type] + [m.type for m in moms]
        if gnode.op == "qconv2d_grad_bias":
            outs = self.emit("iconv_bias_update", [ins[0], g, ins[2], *moms], types, common)
        else:
            ga = gnode.attrs
            geo = {k: ga[k] for k in ("weight_shape", "x_zero", "stride", "padding", "dilation", "groups")}
            x = self.v(gnode.inputs[0])
            outs = self.emit("iconv_grad_weight_update", [x, g, ins[0], ins[2], *moms], types, {**geo, **common})
        for old, new in zip(n.outputs, outs):
            self.sub[old] = new
        self.momenta.update(outs[1:])


def integerize_backward(g: Graph, ranges: Mapping[Value, float]) -> Graph:
    """`g` (an int8 training step with its float32 backward and updates) with an integer-only
    backward (see the module's text); `ranges` from `calibrate_gradients` on `g`."""
    r = _Rewriter(ranges)
    readers = g.consumers()
    for n in reversed(g.nodes):  # the float values only the loss reads (through views)
        for o in n.outputs:
            users = readers.get(o, [])
            if o.dtype == "float32" and users and all(u.op in ("cross_entropy", "cross_entropy_grad") or
                                                      u.op == "reshape" and u.out in r.loss_only for u in users):
                r.loss_only.add(o)
    for n in g.nodes:
        if n.op == "reshape" and n.inputs[0] in r.pending:  # a linear layer's or a conv1d's weight gradient
            r.pending[n.out] = r.pending[n.inputs[0]]
            continue
        r.rewrite(n)
    left = [o for o in g.outputs if o.dtype == "float32" and o.shape != () and r.v(o) is o]
    if left:
        raise IntegerBackwardError(f"backward='integer' leaves a float32 output: {left[0]}")
    outputs = tuple(r.v(o) for o in g.outputs)
    for o, new in zip(g.outputs, outputs):
        if new.type != o.type and new not in r.momenta:
            raise IntegerBackwardError(f"backward='integer' changes output {o} to {new}")
    inputs = tuple(r.inputs.get(v, v) for v in g.inputs)
    owners = tuple((r.inputs.get(s, s), p) for s, p in g.owners)
    return eliminate_dead_code(g.replace(inputs=inputs, roles=g.roles, owners=owners, nodes=tuple(r.nodes),
                                         outputs=outputs))


__all__ = ["HEADROOM_BITS", "IntegerBackwardError", "calibrate_gradients", "integerize_backward"]
