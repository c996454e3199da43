"""quantize_graph: a float forward graph (batch norm folded) -> the int8 graph a
microcontroller runs, with int8 weights, int32 biases and int8 activations.

Each node of the float graph gets one of these kinds (`plan_quantization`), from its
op's int8 rule (`OpDef.int8`: the kind, the int8 op, the nodes it applies to):
- "qconv"   conv2d / linear with constant weights (+ a following ReLU / clamp, fused as
            the output clamp) -> qconv2d (a linear is a 1x1 convolution on reshaped data);
            conv_transpose2d -> qconv_transpose2d (TFLite's int8 TRANSPOSE_CONV), its weight
            on one scale per group (`quantize_transposed_weight`);
            a layer whose output is the graph's output returns float32 logits;
- "qadd"    add of two int8 tensors of one shape;
- "same"    ops that keep their input's scale: global mean (-> qmean), ReLU / clamp
            (-> qclamp), max / average pooling (-> qmax_pool2d / qavg_pool2d),
            reshape / permute (run on the int8 data as they are);
- "qcat"    cat of int8 tensors -> qcat on the calibrated range of the result. As the
            TFLite converter does, an input calibrated here that feeds nothing but the cat
            takes the cat's scale and zero point (then qcat copies it); any other input is
            requantized by qcat;
- "float"   everything else stays float32; int8 inputs are dequantized first, and a
            float tensor entering a qconv is quantized.
Every int8 tensor has one QParams: from the published spec of a pre-quantized model where
it names them, else from calibration ranges.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import numpy as np

from ..ir import Graph, Node, TensorType, Value, new_value
from ..ops import ACTIVATION_TAG, Emitter, get_op
from ..ops.fixed_point import INT8_MAX, INT8_MIN, quantize_multiplier
from ..ops.qconv_transpose import QCONV_TRANSPOSE_OP, TRANSPOSED_KEYS
from ..ops.qelementwise import qadd_attrs
from ..ops.qpool import qcat_attrs
from .qparams import MIN_WEIGHT_RANGE, WEIGHT_QMAX, QParams, quantize_bias, quantize_weight



class QuantizeError(ValueError):
    pass


@dataclass(frozen=True)
class LayerSpec:
    """Published int8 parameters of one conv/linear layer (keyed by its weight's name)."""

    weight: np.ndarray  # int8, the layer's weight shape
    w_scales: np.ndarray  # float32 per output channel
    bias: np.ndarray  # int32 per output channel
    x: QParams
    y: Optional[QParams]  # None: calibrate (or float output)


@dataclass(frozen=True)
class QuantLayer:
    """What the update and the export need to know about one quantized layer."""

    weight: str
    bias: str
    x: QParams
    w_scales: tuple[float, ...]  # per output channel (the bias's and the requantization's)
    #: the weight's scale per row (dim 0) of its stored layout where that differs from
    #: w_scales: a transposed convolution's (C_in, C_out / groups, kH, kW) weight (one scale a group)
    w_row_scales: Optional[tuple[float, ...]] = None

    @property
    def row_scales(self) -> tuple[float, ...]:
        """The weight's scale per row of its stored layout (what QAS, the update and the export read)."""
        return self.w_row_scales if self.w_row_scales is not None else self.w_scales


@dataclass
class Plan:
    kinds: dict[Node, str] = field(default_factory=dict)  # node -> kind
    act: dict[Node, Node] = field(default_factory=dict)  # layer node -> fused activation
    absorbed: set = field(default_factory=set)  # fused activation nodes
    int8: set = field(default_factory=set)  # float-graph values held as int8


def _int8_kind(n: Node) -> Optional[str]:
    """The int8 kind of node n's op where its rule applies to n, else None (float)."""
    rule = get_op(n.op).int8
    return rule.kind if rule is not None and rule.applies(n) else None


def _is_activation(n: Node) -> bool:
    return ACTIVATION_TAG in get_op(n.op).tags


def weight_view(g: Graph, v: Value, producers: Mapping[Value, Node], users) -> Optional[Node]:
    """The reshape node making layer weight `v` from a parameter read by it alone (a conv1d runs
    as conv2d on a (O, C, 1, K) view of its weight), else None."""
    src = producers.get(v)
    if src is None or src.op != "reshape" or src.inputs[0] in producers or users.get(src.inputs[0]) != [src]:
        return None
    return src


def layer_weight(n: Node, producers: Mapping[Value, Node]) -> Value:
    """The parameter holding layer n's weight: its operand 1, or the parameter it is a view of."""
    w = n.inputs[1]
    src = producers.get(w)
    return src.inputs[0] if src is not None and src.op == "reshape" else w


def plan_quantization(g: Graph, consts: set[str]) -> Plan:
    users = g.consumers()
    producers = g.producers()
    outputs = set(g.outputs)
    p = Plan()
    for n in g.nodes:
        if n in p.absorbed:
            continue
        ins = n.inputs
        kind = _int8_kind(n)
        view = weight_view(g, ins[1], producers, users) if kind == "qconv" and len(ins) > 1 else None
        params = ((view.inputs[0],) if view is not None else ins[1:2]) + ins[2:]
        # a weight another node also reads (GPT-2's LM head tied to its embedding) stays float:
        # the int8 layer would replace the one tensor both read (conv2d's shape rule makes
        # its input 4-D)
        if kind == "qconv" and all(v.name in consts for v in params) and ins[0].name not in consts \
                and all(users.get(v) == [n] for v in ins[1:]):
            p.kinds[n] = "qconv"
            if view is not None:  # the weight's view is made from the int8 weight by the layer itself
                p.kinds.pop(view, None)
                p.absorbed.add(view)
            nxt = users.get(n.out, [])
            if len(nxt) == 1 and _is_activation(nxt[0]) and n.out not in outputs and nxt[0].out not in outputs:
                p.act[n] = nxt[0]
                p.absorbed.add(nxt[0])
            y = p.act[n].out if n in p.act else n.out
            if y not in outputs:
                p.int8.add(y)
        elif kind == "qadd" and len(ins) == 2 and all(v in p.int8 for v in ins) and ins[0].shape == ins[1].shape:
            p.kinds[n] = "qadd"
            p.int8.add(n.out)
        elif kind == "qcat" and ins and all(v in p.int8 for v in ins):
            p.kinds[n] = "qcat"
            p.int8.add(n.out)
        elif kind == "same" and ins[0] in p.int8:
            p.kinds[n] = "same"
            p.int8.add(n.out)
        else:
            p.kinds[n] = "float"
    return p


def layer_output(p: Plan, n: Node) -> Value:
    return p.act[n].out if n in p.act else n.out


def assign_qparams(g: Graph, p: Plan, specs: Mapping[str, LayerSpec],
                   calibrate: Callable[[list[Value]], dict[Value, tuple[float, float]]]) -> dict[Value, QParams]:
    """QParams of every int8 value and every float value a qconv quantizes: published
    where the spec names them, calibrated otherwise; scale-keeping ops pass theirs on."""
    qp: dict[Value, QParams] = {}
    layers = [n for n in g.nodes if p.kinds.get(n) == "qconv"]
    producers = g.producers()
    for n in layers:
        spec = specs.get(layer_weight(n, producers).name)
        if spec is None:
            continue
        y = layer_output(p, n)
        if spec.y is not None and y in p.int8:
            qp[y] = spec.y
        qp.setdefault(n.inputs[0], spec.x)
    same = [n for n in g.nodes if p.kinds.get(n) == "same"]
    for n in reversed(same):  # a consumer's published input scale reaches back through these
        if n.out in qp and n.inputs[0] not in qp:
            qp[n.inputs[0]] = qp[n.out]
    producers = g.producers()
    derived = {v for v in p.int8 if v in producers and p.kinds.get(producers[v]) == "same"}
    wanted = [v for v in [n.inputs[0] for n in layers] + sorted(p.int8, key=lambda v: v.id)
              if v not in qp and v not in derived]
    wanted = list(dict.fromkeys(wanted))
    for v, (lo, hi) in calibrate(wanted).items():
        qp[v] = QParams.from_range(lo, hi)
    _share_cat_scales(g, p, qp, set(wanted))
    for n in same:
        if n.inputs[0] not in qp:
            raise QuantizeError(f"no quantization parameters for the input of {n.op}")
        qp[n.out] = qp[n.inputs[0]]
    return qp


def _share_cat_scales(g: Graph, p: Plan, qp: dict[Value, QParams], calibrated: set) -> None:
    """An input of a qcat calibrated here and read by the cat alone takes the cat's
    parameters (TFLite's converter restricts concatenation to one scale), so qcat copies
    it instead of requantizing; published or scale-keeping inputs keep theirs."""
    users = g.consumers()
    outputs = set(g.outputs)
    for n in reversed(g.nodes):  # an outer cat's parameters reach an inner cat's inputs
        if p.kinds.get(n) != "qcat" or n.out not in qp:
            continue
        for v in n.inputs:
            if v in calibrated and v not in outputs and all(u is n for u in users.get(v, [])):
                qp[v] = qp[n.out]


def quantize_graph(g: Graph, arrays: Mapping[str, np.ndarray], p: Plan, qp: Mapping[Value, QParams],
                   specs: Mapping[str, LayerSpec], weight_scales: Optional[Mapping[str, np.ndarray]] = None
                   ) -> tuple[Graph, dict[str, np.ndarray], dict[str, QuantLayer]]:
    """Build the int8 graph. Returns it, its parameter/buffer arrays (int8 weights, int32
    biases, untouched float ones) and the quantized layers by weight name. A layer without
    a spec quantizes its weight on the scales `weight_scales` names for it, if any, else on
    scales covering its range."""
    b = _Builder(g, arrays, qp, weight_scales or {})
    layers: dict[str, QuantLayer] = {}
    producers = g.producers()
    for n in g.nodes:
        kind = p.kinds.get(n)
        if kind is None:
            continue
        if kind == "qconv":
            w = layer_weight(n, producers)
            layer = b.qconv(n, p.act.get(n), layer_output(p, n), specs.get(w.name), w)
            layers[w.name] = layer
        elif kind == "qadd":
            a, c = (b.as_int(v) for v in n.inputs)
            qa, qc, qy = qp[n.inputs[0]], qp[n.inputs[1]], qp[n.out]
            b.ints[n.out] = b.e.emit("qadd", a, c, **qadd_attrs(qa.scale, qa.zero, qc.scale, qc.zero, qy.scale, qy.zero))
        elif kind == "qcat":
            xs = [b.as_int(v) for v in n.inputs]
            qs, qy = [qp[v] for v in n.inputs], qp[n.out]
            b.ints[n.out] = b.e.emit("qcat", *xs, **qcat_attrs(n.attrs["dim"], [q.scale for q in qs],
                                                                [q.zero for q in qs], qy.scale, qy.zero))
        elif kind == "same":
            b.ints[n.out] = b.same_scale(n)
        else:
            outs = b.e.emit_multi(n.op, *[b.as_float(v) for v in n.inputs], **dict(n.attrs))
            b.floats.update(zip(n.outputs, outs))
    outs = tuple(b.as_float(v) for v in g.outputs)
    used = {v for nd in b.e.nodes for v in nd.inputs} | set(outs)
    inputs = tuple(b.inputs[v.name] for v in g.inputs if v.name in b.inputs and b.inputs[v.name] in used)
    inputs += tuple(v for v in b.new_inputs if v in used)
    graph = Graph(inputs, tuple(b.e.nodes), outs, g.output_names, tuple(b.roles[v.name] for v in inputs))
    return graph, {v.name: b.arrays[v.name] for v in inputs if v.name in b.arrays}, layers


class _Builder:
    def __init__(self, g: Graph, arrays: Mapping[str, np.ndarray], qp: Mapping[Value, QParams],
                 weight_scales: Mapping[str, np.ndarray]):
        self.e = Emitter()
        self.weight_scales = weight_scales
        self.qp = qp
        self.src_arrays = arrays
        self.arrays: dict[str, np.ndarray] = {}
        self.inputs: dict[str, Value] = {}
        self.floats: dict[Value, Value] = {}
        self.ints: dict[Value, Value] = {}
        self.new_inputs: list[Value] = []
        #: input name -> role; a bias a layer lacked takes its weight's role (trained with it)
        self.roles = {v.name: r for v, r in zip(g.inputs, g.roles)}
        for v in g.inputs:
            nv = new_value(v.type, v.name)
            self.inputs[v.name] = nv
            self.floats[v] = nv
            if v.name in arrays:
                self.arrays[v.name] = arrays[v.name]

    def as_int(self, v: Value) -> Value:
        if v not in self.ints:
            q = self.qp[v]
            self.ints[v] = self.e.emit("quantize", self.as_float(v), scale=q.scale, zero=q.zero, qmin=INT8_MIN,
                                       qmax=INT8_MAX)
        return self.ints[v]

    def as_float(self, v: Value) -> Value:
        if v not in self.floats:
            q = self.qp[v]
            self.floats[v] = self.e.emit("dequantize", self.ints[v], scale=q.scale, zero=q.zero)
        return self.floats[v]

    def _param(self, name: str, array: np.ndarray) -> Value:
        """The int parameter input `name` (replacing the float one of that name)."""
        t = TensorType(tuple(array.shape), str(array.dtype))
        v = new_value(t, name)
        if name in self.inputs:
            self.inputs[name] = v
        else:
            self.new_inputs.append(v)
        self.arrays[name] = array
        return v

    def qconv(self, n: Node, act: Optional[Node], y: Value, spec: Optional[LayerSpec],
              w: Optional[Value] = None) -> QuantLayer:
        """The int8 layer of n; `w`: the parameter its weight operand is a view of, if it is one."""
        x, w = n.inputs[0], (w if w is not None else n.inputs[1])
        xq = self.qp[x]
        w_float = self.src_arrays[w.name]
        transposed = get_op(n.op).int8.op == QCONV_TRANSPOSE_OP
        rows = None
        if spec is not None:
            if spec.weight.shape != w_float.shape or transposed:
                raise QuantizeError(f"{w.name}: published weight {spec.weight.shape} does not match the model's "
                                    f"{w_float.shape}" + (" (or is a transposed convolution's)" if transposed else ""))
            w_int, w_scales, b_int = spec.weight.astype(np.int8), spec.w_scales.astype(np.float32), spec.bias
        else:
            if transposed:
                w_int, w_scales, rows = quantize_transposed_weight(w_float, int(n.attrs["groups"]),
                                                                   self.weight_scales.get(w.name))
            else:
                w_int, w_scales = quantize_weight(w_float, self.weight_scales.get(w.name))
            b_float = self.src_arrays[n.inputs[2].name] if len(n.inputs) > 2 else np.zeros(len(w_scales))
            b_int = quantize_bias(b_float, xq.scale, w_scales)
        b_name = n.inputs[2].name if len(n.inputs) > 2 else _bias_name(w.name)
        wv = self._param(w.name, w_int)
        bv = self._param(b_name, np.asarray(b_int, dtype=np.int32))
        self.roles.setdefault(b_name, self.roles[w.name])
        float_out = y not in self.qp
        attrs = dict(x_zero=xq.zero, x_scale=xq.scale, w_scales=tuple(float(s) for s in w_scales),
                     float_out=float_out)
        if float_out:
            attrs.update(y_zero=0, y_scale=1.0, mult=(0,) * len(w_scales), shift=(0,) * len(w_scales), qmin=INT8_MIN,
                         qmax=INT8_MAX)
        else:
            attrs.update(_requant_attrs(xq, w_scales, self.qp[y], act))
        xin = self.as_int(x)
        if wv.shape != n.inputs[1].shape:  # the layer's view of its weight, made from the int8 one
            wv = self.e.emit("reshape", wv, shape=n.inputs[1].shape)
        if transposed:
            out = self.e.emit(QCONV_TRANSPOSE_OP, xin, wv, bv, **{k: n.attrs[k] for k in TRANSPOSED_KEYS}, **attrs)
        elif get_op(n.op).params.kind == "conv":
            out = self.e.emit("qconv2d", xin, wv, bv, **{k: n.attrs[k] for k in ("stride", "padding", "dilation",
                                                                                  "groups")}, **attrs)
        else:
            out = self._qlinear(xin, wv, bv, attrs)
        if act is not None and float_out:
            raise QuantizeError("a fused activation on a float output")  # plan never fuses into a graph output
        (self.floats if float_out else self.ints)[y] = out
        return QuantLayer(w.name, b_name, xq, attrs["w_scales"],
                          None if rows is None else tuple(float(v) for v in rows))

    def _qlinear(self, xin: Value, wv: Value, bv: Value, attrs: dict) -> Value:
        """A linear layer as a 1x1 convolution: (..., K) -> (M, K, 1, 1) -> (..., O)."""
        lead, k = xin.shape[:-1], xin.shape[-1]
        o = wv.shape[0]
        m = int(np.prod(lead, dtype=np.int64))
        x4 = self.e.emit("reshape", xin, shape=(m, k, 1, 1))
        w4 = self.e.emit("reshape", wv, shape=(o, k, 1, 1))
        y4 = self.e.emit("qconv2d", x4, w4, bv, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, **attrs)
        return self.e.emit("reshape", y4, shape=tuple(lead) + (o,))

    def same_scale(self, n: Node) -> Value:
        """A scale-keeping op as its int8 op (`OpDef.int8.op`) on the int8 data."""
        x = self.as_int(n.inputs[0])
        q = self.qp[n.inputs[0]]
        op = get_op(n.op).int8.op
        if op == "qmean":
            return self.e.emit(op, x, dims=n.attrs.get("dims"), keepdim=n.attrs.get("keepdim", False), zero=q.zero)
        if op == "qclamp":
            lo, hi = _act_levels(q, n)
            return self.e.emit(op, x, qmin=lo, qmax=hi)
        if op in ("qavg_pool2d", "qleaky_relu"):  # (qleaky_relu: ops/qpointwise.py)
            return self.e.emit(op, x, zero=q.zero, **dict(n.attrs))
        return self.e.emit(op, x, **dict(n.attrs))


def quantize_transposed_weight(w: np.ndarray, groups: int, scales: Optional[np.ndarray] = None
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per output channel, float32 scale per weight row) of a
    transposed convolution's (C_in, C_out / groups, kH, kW) weight, symmetric on one scale per
    group: the output channels of a group share it (per tensor at groups 1, per channel when
    depthwise), so each stored row (an input channel) has one scale, which the per-row integer
    update (QAS factors), the export and the torch backend read as they read a convolution's
    per-output-channel scales. `scales`: given per output channel (equal within each group)."""
    w = np.asarray(w, dtype=np.float32)
    ci, og = w.shape[:2]
    cg = ci // groups
    if scales is None:
        per_group = np.abs(w.reshape(groups, -1)).max(axis=1) if w.size else np.zeros(groups, np.float32)
        group_scales = (np.maximum(per_group, MIN_WEIGHT_RANGE) / WEIGHT_QMAX).astype(np.float32)
    else:
        table = np.asarray(scales, dtype=np.float32).reshape(groups, og)
        if np.any(table != table[:, :1]):
            raise QuantizeError(f"a transposed convolution's weight scales must be equal within each of its {groups} "
                                f"group(s), got {table.tolist()}")
        group_scales = table[:, 0]
    rows = np.repeat(group_scales, cg)
    w_int, _ = quantize_weight(w, rows)
    return w_int, np.repeat(group_scales, og), rows


def _bias_name(weight: str) -> str:
    return (weight[: -len(".weight")] if weight.endswith(".weight") else weight) + ".bias"


def _act_levels(q: QParams, act: Optional[Node]) -> tuple[int, int]:
    """The int8 levels an activation (ReLU, clamp) keeps on scale `q`."""
    if act is None:
        return INT8_MIN, INT8_MAX
    lo, hi = (0.0, None) if act.op == "relu" else (act.attrs.get("min"), act.attrs.get("max"))
    qlo = q.quantize(lo) if lo is not None else INT8_MIN
    qhi = q.quantize(hi) if hi is not None else INT8_MAX
    return max(qlo, INT8_MIN), min(qhi, INT8_MAX)


def _requant_attrs(xq: QParams, w_scales: np.ndarray, yq: QParams, act: Optional[Node]) -> dict:
    mults, shifts = zip(*(quantize_multiplier(float(np.float64(xq.scale) * float(s) / np.float64(yq.scale)))
                          for s in w_scales))
    lo, hi = _act_levels(yq, act)
    return dict(y_zero=yq.zero, y_scale=yq.scale, mult=tuple(mults), shift=tuple(shifts), qmin=lo, qmax=hi)
