"""The facts an OpDef declares for other passes (tags, layer operands, the int8 rule, stream
operands, the gradient operand of an update) agree with what those passes do, and the
gradient a VJP is asked for is an explicit `Wanted`, never a bool."""
import numpy as np
import pytest

from edgetrain.autodiff import WHOLE, ChannelSelect, Whole, build_backward
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import (ACTIVATION_TAG, GRAD_MASK_TAG, LAYER_TAG, NORM_TAG, OPS, SAME_SCALE_TAG, TAGS, UPDATE_TAG,
                           Emitter, Int8Rule, OpDef, get_op, ops_tagged, verify)
from edgetrain.quantize.convert import plan_quantization
from edgetrain.trainable import find_layers


def _value(shape, name="", dtype="float32"):
    return new_value(TensorType(tuple(shape), dtype), name)


def test_tags_are_the_declared_vocabulary():
    for name, d in OPS.items():
        assert d.tags <= set(TAGS), name
    with pytest.raises(ValueError, match="unknown tags"):
        OpDef("bogus", lambda ts, a: ts, lambda xs, a: xs, tags={"not-a-tag"})
    with pytest.raises(ValueError, match="int8 kind"):
        Int8Rule("bogus", "qclamp")


def test_layers_and_norms_declare_their_parameter_operands():
    for name, d in OPS.items():
        tagged = LAYER_TAG in d.tags or NORM_TAG in d.tags
        assert tagged == (d.params is not None), name
        if d.params is not None:
            assert (d.params.kind == "norm") == (NORM_TAG in d.tags), name
            assert d.num_inputs is None or d.params.weight < d.num_inputs[1], name
            assert d.params.bias is None or d.num_inputs is None or d.params.bias < d.num_inputs[1], name
    assert {get_op(n).params.kind for n in ops_tagged(LAYER_TAG)} == {"conv", "linear", "embedding"}


def test_int8_rules_agree_with_tags():
    same = {n for n, d in OPS.items() if d.int8 is not None and d.int8.kind == "same"}
    assert same == set(ops_tagged(SAME_SCALE_TAG))
    for n, d in OPS.items():
        if d.int8 is not None:
            assert d.int8.op in OPS, n  # lowers to a registered op
            assert d.int8.op == n or OPS[d.int8.op].int8 is None, n  # an int8 op is not lowered again
        if d.int8 is not None and d.int8.kind == "qconv":
            assert LAYER_TAG in d.tags and d.params.kind in ("conv", "linear"), n
    assert set(ops_tagged(ACTIVATION_TAG)) <= same
    assert {get_op(n).int8.op for n in ops_tagged(ACTIVATION_TAG)} == {"qclamp"}


def test_activation_backward_is_a_grad_mask():
    """Each activation's VJP emits one op tagged grad_mask (what the fused batch-norm
    backward, ops/bnfused.py, reads as the gradient's mask)."""
    for name in ops_tagged(ACTIVATION_TAG):
        x = _value((2, 3), "x")
        e = Emitter()
        y = e.emit(name, x, **({"min": 0.0, "max": 6.0} if name == "clamp" else {}))
        (gx,) = get_op(name).vjp(e, e.nodes[-1], [_value((2, 3), "g")], [WHOLE])
        assert GRAD_MASK_TAG in get_op(e.nodes[-1].op).tags and e.nodes[-1].out is gx and y is not gx


def test_updates_name_their_gradient_operand():
    for n, d in OPS.items():
        assert (UPDATE_TAG in d.tags) == (d.gradient_operand is not None), n
        if d.gradient_operand is not None:
            assert d.mutates and (0, 0) in d.shares, n  # overwrites the parameter, operand 0
            assert all(j != d.gradient_operand for _, j in d.shares), n  # and only reads the gradient


def test_schedule_and_c_fusion_tables_agree_with_the_op_table():
    """Tables other modules still keep must say what the OpDefs say."""
    from edgetrain.remat import apply
    table = getattr(apply, "GRADIENT_INPUT", None)
    if table is not None:
        assert table == {n: get_op(n).gradient_operand for n in ops_tagged(UPDATE_TAG)}
    from edgetrain.backends.c.kernels.float32 import BN_MASK_KIND
    from edgetrain.ops.bnfused import MASK_OPS
    assert set(MASK_OPS) == set(ops_tagged(GRAD_MASK_TAG))  # the masks the fused batch-norm backward applies
    assert set(BN_MASK_KIND) == {"", *MASK_OPS}  # and its C kernel


def test_stream_operands_are_int8_activations():
    streamed = {n: d.stream_operands for n, d in OPS.items() if d.stream_operands}
    assert streamed == {"qconv2d": (0,), "qadd": (0, 1), "qconv2d_pw_dw": (0,)}


def _quant_plan(op, x_shape, **attrs):
    """plan_quantization of conv -> relu -> op: the kind `op` gets after an int8 layer."""
    x = _value(x_shape, "x")
    w, b = _value((x_shape[1], x_shape[1], 1, 1), "w"), _value((x_shape[1],), "b")
    e = Emitter()
    h = e.emit("conv2d", x, w, b, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    h = e.emit("relu", h)
    y = e.emit(op, h, **attrs)
    z = e.emit("add", y, e.const(1.0, "float32"))
    g = verify(Graph((x, w, b), tuple(e.nodes), (z,), ("out",)))
    plan = plan_quantization(g, {"w", "b"})
    return [plan.kinds.get(n) for n in g.nodes]


@pytest.mark.parametrize("op,attrs,x_shape", [
    ("relu", {}, (1, 4, 4, 4)),
    ("clamp", {"min": 0.0, "max": 6.0}, (1, 4, 4, 4)),
    ("max_pool2d", {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0)}, (1, 4, 4, 4)),
    ("avg_pool2d", {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0)}, (1, 4, 4, 4)),
    ("mean", {"dims": (2, 3), "keepdim": True}, (1, 4, 4, 4)),
    ("reshape", {"shape": (1, 64)}, (1, 4, 4, 4)),
    ("detach", {}, (1, 4, 4, 4)),
    ("permute", {"perm": (0, 2, 3, 1)}, (1, 4, 4, 4)),
    ("upsample", {"size": (8, 8), "mode": "nearest"}, (1, 4, 4, 4)),
    ("adaptive_max_pool2d", {"output_size": (3, 2)}, (1, 4, 5, 4)),
])
def test_quantize_treats_every_same_scale_op_as_same_scale(op, attrs, x_shape):
    assert SAME_SCALE_TAG in get_op(op).tags
    kinds = _quant_plan(op, x_shape, **attrs)
    assert kinds[:3] == ["qconv", None, "same"]  # the layer's ReLU is absorbed as its output clamp


def test_same_scale_ops_are_all_covered():
    covered = {"relu", "clamp", "max_pool2d", "avg_pool2d", "mean", "reshape", "detach", "permute"}
    covered |= {"leaky_relu"}  # not absorbed by a layer: qleaky_relu, tests/backends/c/test_int8_leaky.py
    covered |= {"upsample", "adaptive_max_pool2d"}
    covered |= {"max_pool3d"}  # 5-d, after no conv2d: qmax_pool3d, tests/backends/c/test_int8_resample.py
    assert set(ops_tagged(SAME_SCALE_TAG)) == covered


def test_a_non_global_mean_stays_float():
    kinds = _quant_plan("mean", (1, 4, 4, 4), dims=(1,), keepdim=True)
    assert kinds[2] == "float"


def test_find_layers_reads_the_parameter_operands():
    """A graph with one op of each layer and norm kind: find_layers reports each, with the
    weight and bias its OpDef names."""
    ids, table = _value((2, 5), "ids", "int64"), _value((10, 8), "emb.weight")
    x, w, b = _value((1, 3, 6, 6), "x"), _value((4, 3, 3, 3), "conv.weight"), _value((4,), "conv.bias")
    bn = [_value((4,), f"bn.{k}") for k in ("mean", "var", "weight", "bias")]
    lw, lb = _value((8, 8), "fc.weight"), _value((8,), "fc.bias")
    nw, nb = _value((8,), "ln.weight"), _value((8,), "ln.bias")
    e = Emitter()
    t = e.emit("embedding", table, ids)
    t = e.emit("layer_norm", t, nw, nb, normalized_shape=(8,), eps=1e-5)
    t = e.emit("linear", t, lw, lb)
    h = e.emit("conv2d", x, w, b, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    h = e.emit("batch_norm", h, *bn, eps=1e-5)
    inputs = (ids, table, nw, nb, lw, lb, x, w, b, *bn)
    g = verify(Graph(inputs, tuple(e.nodes), (t, h), ("a", "b")))
    params = {v.name for v in inputs} - {"ids", "x", "bn.mean", "bn.var"}
    layers = {(layer.kind, layer.weight, layer.bias) for layer in find_layers(g, params)}
    assert layers == {("embedding", "emb.weight", ()), ("norm", "ln.weight", ("ln.bias",)),
                      ("linear", "fc.weight", ("fc.bias",)),
                      ("conv", "conv.weight", ("conv.bias", "bn.weight", "bn.bias"))}


# --- Wanted: which part of a gradient a VJP is asked for ------------------------------------
def test_channel_select_is_not_a_bool_in_disguise():
    assert "__bool__" not in vars(ChannelSelect) and isinstance(WHOLE, Whole)


def _conv_graph():
    x, w = _value((1, 4, 5, 5), "x"), _value((6, 4, 3, 3), "w")
    e = Emitter()
    y = e.emit("conv2d", x, w, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    loss = e.emit("sum", e.emit("mul", y, y), dims=None)
    return verify(Graph((x, w), tuple(e.nodes), (loss,), ("loss",)))


def test_vjps_are_asked_with_wanted_values():
    """needs[i] is None, WHOLE or a ChannelSelect: never True / False."""
    seen = []
    conv = get_op("conv2d")
    real = conv.vjp

    def spy(e, node, grads, needs):
        seen.append(tuple(needs))
        return real(e, node, grads, needs)

    object.__setattr__(conv, "vjp", spy)  # OpDef is frozen; restored below
    try:
        sel = ChannelSelect(1, (0, 2))
        build_backward(_conv_graph(), "loss", {"w": sel})
        build_backward(_conv_graph(), "loss", {"x": None})
    finally:
        object.__setattr__(conv, "vjp", real)
    assert seen == [(None, sel), (WHOLE, None)]


def test_whole_and_none_ask_for_the_same_gradient():
    g = _conv_graph()
    a = build_backward(g, "loss", {"w": None})
    b = build_backward(g, "loss", {"w": WHOLE})
    assert [n.op for n in a.nodes] == [n.op for n in b.nodes]
    assert a.output("grad:w").shape == b.output("grad:w").shape == (6, 4, 3, 3)
    c = build_backward(g, "loss", {"w": ChannelSelect(1, (1, 3))})
    assert c.output("grad:w").shape == (6, 2, 3, 3)
    assert ChannelSelect(1, (1, 3)).scatter(np.ones((6, 2, 3, 3)), (6, 4, 3, 3))[:, [0, 2]].sum() == 0
