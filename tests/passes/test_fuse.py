"""Pointwise -> depthwise fusion: the fused op is bit-identical to the two int8 convolutions
it replaces; the pass fuses exactly the pairs whose intermediate nothing else reads, keeps
the graph valid around in-place updates, and on the paper's MobileNetV2 removes the
forward pass's 192 KB expansion tensor without changing one bit of a training step."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import edgetrain as et
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value, ram_inputs
from edgetrain.memory import plan_memory
from edgetrain.ops import Emitter, verify
from edgetrain.ops.conv import conv_out_hw
from edgetrain.ops.fixed_point import quantize_multiplier
from edgetrain.ops.qconv import qconv2d_ref
from edgetrain.ops.qfused import CHANNEL_BLOCK, PW_DW_OP, fuse_attrs, qconv2d_pw_dw_ref
from edgetrain.passes import apply_updates_early
from edgetrain.passes.fuse import fuse_pointwise_depthwise
from edgetrain.passes.reorder import reorder_for_memory
from edgetrain.passes.updates import STEP

from ..models.tiny_training_file import ASSETS  # the shared assets (EDGETRAIN_ASSETS, else beside the checkout)

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None)
MBV2 = ASSETS / "mbv2-w0.35.pkl"
#: the paper's mbv2-w0.35 scheme for its 99 KB budget (schemes.json)
MBV2_99KB = dict(bias_last=25, weights={27: 1, 30: 1, 33: 1, 36: 1, 39: 1, 42: 0.125, 45: 0.5, 48: 1})
KB = 1024


# --- helpers ---------------------------------------------------------------------------------
def qattrs(rng, c_out, stride=1, padding=0, dilation=1, groups=1, x_zero=0, y_zero=0, qmin=-128, qmax=127,
           float_out=False):
    """qconv2d attrs with random per-channel scales and their fixed-point multipliers."""
    x_scale, y_scale = float(rng.uniform(0.01, 0.1)), float(rng.uniform(0.02, 0.2))
    w_scales = tuple(float(s) for s in rng.uniform(0.002, 0.02, c_out).astype(np.float32))
    mult, shift = zip(*(quantize_multiplier(x_scale * s / y_scale) for s in w_scales))
    return dict(stride=(stride, stride), padding=(padding, padding), dilation=(dilation, dilation), groups=groups,
                x_zero=x_zero, x_scale=x_scale, w_scales=w_scales, float_out=float_out, y_zero=y_zero,
                y_scale=y_scale, mult=mult, shift=shift, qmin=qmin, qmax=qmax)


def int8(rng, shape, lo=-128):
    return rng.integers(lo, 128, shape).astype(np.int8)


def layer_arrays(rng, c_in, c_out, kernel, groups=1):
    return int8(rng, (c_out, c_in // groups, kernel, kernel), -127), rng.integers(-4000, 4000, c_out).astype(np.int32)


def in_sequence(x, w1, b1, w2, b2, pw, dw):
    return qconv2d_ref(qconv2d_ref(x, w1, b1, pw), w2, b2, dw)


def pair_graph(x_shape, w1, b1, w2, b2, pw, dw):
    """x -> qconv2d(pw) -> qconv2d(dw) -> output "y", weights as graph inputs."""
    ins = [new_value(TensorType(tuple(s), d), name) for s, d, name in
           [(x_shape, "int8", "x"), (w1.shape, "int8", "w1"), (b1.shape, "int32", "b1"),
            (w2.shape, "int8", "w2"), (b2.shape, "int32", "b2")]]
    e = Emitter()
    t = e.emit("qconv2d", *ins[:3], **pw)
    y = e.emit("qconv2d", t, *ins[3:], **dw)
    return Graph(tuple(ins), tuple(e.nodes), (y,), ("y",)), e


# --- the op ----------------------------------------------------------------------------------
@SETTINGS
@given(n=st.integers(1, 2), c_in=st.integers(1, 5), c=st.integers(1, 6),
       hw=st.tuples(st.integers(3, 9), st.integers(3, 9)),
       pw_geo=st.tuples(st.sampled_from([1, 3]), st.integers(1, 2), st.integers(0, 1)),
       dw_geo=st.tuples(st.sampled_from([1, 3, 5]), st.integers(1, 2), st.integers(0, 2), st.integers(1, 2)),
       zeros=st.tuples(st.integers(-128, 127), st.integers(-128, 127), st.integers(-128, 127)),
       relu6=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
def test_fused_op_is_the_two_convolutions_bit_for_bit(n, c_in, c, hw, pw_geo, dw_geo, zeros, relu6, seed):
    """Any dense first conv (kernel, stride, padding) and any depthwise second conv."""
    (k1, s1, p1), (k2, s2, p2, d2) = pw_geo, dw_geo
    try:
        mid = conv_out_hw(hw, (k1, k1), (s1, s1), (p1, p1), (1, 1))
        conv_out_hw(mid, (k2, k2), (s2, s2), (p2, p2), (d2, d2))
    except ValueError:
        assume(False)
    rng = np.random.default_rng(seed)
    zx, zt, zy = zeros
    pw = qattrs(rng, c, s1, p1, x_zero=zx, y_zero=zt, qmin=zt if relu6 else -128)
    dw = qattrs(rng, c, s2, p2, d2, groups=c, x_zero=zt, y_zero=zy)
    x = int8(rng, (n, c_in) + hw)
    (w1, b1), (w2, b2) = layer_arrays(rng, c_in, c, k1), layer_arrays(rng, c, c, k2, groups=c)
    a = fuse_attrs(pw, dw)
    y, scratch = qconv2d_pw_dw_ref(x, w1, b1, w2, b2, a)
    assert y.dtype == np.int8 and np.array_equal(y, in_sequence(x, w1, b1, w2, b2, pw, dw))
    assert scratch.shape == (n, min(CHANNEL_BLOCK, c)) + mid
    # through the IR: the node's shape rule agrees with the two qconv2d's
    xs = [x, w1, b1, w2, b2]
    ins = [new_value(TensorType(v.shape, str(v.dtype)), f"in{i}") for i, v in enumerate(xs)]
    e = Emitter()
    out, _ = e.emit_multi(PW_DW_OP, *ins, **a)
    g = verify(Graph(tuple(ins), tuple(e.nodes), (out,), ("y",)))
    assert np.array_equal(run_graph(g, {f"in{i}": v for i, v in enumerate(xs)})[0]["y"], y)


def test_fused_op_is_exact_when_wide_channels_need_float64():
    """A fan-in of 600 channels passes float32's exact integers for large weights only: the
    fused op's one-channel blocks switch accumulator precision channel by channel and stay
    bit-identical to the whole-layer conv."""
    rng = np.random.default_rng(0)
    c_in, c = 600, 4
    x = int8(rng, (1, c_in, 5, 5))
    w1, b1 = layer_arrays(rng, c_in, c, 1)
    w1[:2] //= 64  # small weights: these channels accumulate in float32
    w2, b2 = layer_arrays(rng, c, c, 3, groups=c)
    pw, dw = qattrs(rng, c, y_zero=-5), qattrs(rng, c, 2, 1, groups=c, x_zero=-5, y_zero=7)
    y, _ = qconv2d_pw_dw_ref(x, w1, b1, w2, b2, fuse_attrs(pw, dw))
    assert np.array_equal(y, in_sequence(x, w1, b1, w2, b2, pw, dw))


# --- the pass on small graphs ------------------------------------------------------------------
def small_pair(pw_kernel=1, pw_kw=None, dw_kw=None, c_in=3, c=4):
    """x (1x3x6x6) -> qconv2d (pw_kernel, 4 channels) -> qconv2d (3x3, depthwise unless dw_kw says)."""
    rng = np.random.default_rng(1)
    pw = qattrs(rng, c, **{"y_zero": 3, **(pw_kw or {})})
    dw = qattrs(rng, c, **{"padding": 1, "groups": c, "x_zero": 3, **(dw_kw or {})})
    w1, b1 = layer_arrays(rng, c_in, c, pw_kernel)
    w2, b2 = layer_arrays(rng, c, c, 3, groups=dw["groups"])
    arrays = dict(x=int8(rng, (1, c_in, 6, 6)), w1=w1, b1=b1, w2=w2, b2=b2)
    g, e = pair_graph((1, c_in, 6, 6), w1, b1, w2, b2, pw, dw)
    return g, e, arrays


def test_pass_fuses_a_pair_into_one_node_defining_the_same_value():
    g, _, arrays = small_pair()
    f = verify(fuse_pointwise_depthwise(g))
    assert [n.op for n in f.nodes] == [PW_DW_OP]
    (node,) = f.nodes
    assert node.outputs[0] is g.outputs[0] and node.inputs == g.nodes[0].inputs + g.nodes[1].inputs[1:]
    assert node.outputs[1].type == TensorType((1, CHANNEL_BLOCK, 6, 6), "int8")
    assert np.array_equal(run_graph(f, arrays)[0]["y"], run_graph(g, arrays)[0]["y"])
    # the scratch block is counted while the fused node runs, the expansion never
    x, t, y, scratch = (v.type.nbytes for v in (g.inputs[0], g.nodes[0].out, g.outputs[0], node.outputs[1]))
    assert plan_memory(g, {"x"}, ()).activation_bytes == max(x + t, t + y)
    assert plan_memory(f, {"x"}, ()).activation_bytes == x + y + scratch


@pytest.mark.parametrize("pw_kernel, pw_kw", [(1, {"stride": 2}), (3, {"padding": 1}), (3, {"stride": 2, "padding": 1})])
def test_pass_fuses_any_dense_first_conv(pw_kernel, pw_kw):
    """Streaming by output channel needs only the whole input: a strided or 3x3 dense
    conv (a network's first conv) fuses with its depthwise conv like a 1x1 one."""
    g, _, _ = small_pair(pw_kernel, pw_kw, {})
    f = verify(fuse_pointwise_depthwise(g))
    assert [n.op for n in f.nodes] == [PW_DW_OP]
    rng = np.random.default_rng(0)
    feeds = {v.name: (rng.integers(-128, 128, v.shape) if v.dtype == "int8" else rng.integers(-500, 500, v.shape))
             .astype(v.dtype) for v in g.inputs}
    (a, _), (b, _) = run_graph(g, feeds), run_graph(f, feeds)
    np.testing.assert_array_equal(a[g.output_names[0]], b[f.output_names[0]])


@pytest.mark.parametrize("pw_kernel, pw_kw, dw_kw", [
    (1, {}, {"groups": 1}),             # the second conv is dense, not depthwise
    (1, {}, {"float_out": True}),       # the second conv returns float logits
])
def test_pass_leaves_other_conv_pairs(pw_kernel, pw_kw, dw_kw):
    g, _, _ = small_pair(pw_kernel, pw_kw, dw_kw)
    assert fuse_pointwise_depthwise(g) is g


def test_pass_leaves_a_pair_whose_intermediate_is_read_elsewhere():
    g, _, _ = small_pair()
    t = g.nodes[0].out
    as_output = g.replace(outputs=g.outputs + (t,), output_names=g.output_names + ("t",))
    assert fuse_pointwise_depthwise(as_output) is as_output
    e = Emitter()
    extra = e.emit("qmask_pack", t, lo=-128, hi=127)
    two_readers = g.replace(nodes=g.nodes + tuple(e.nodes), outputs=g.outputs + (extra,),
                            output_names=g.output_names + ("m",))
    verify(two_readers)
    assert fuse_pointwise_depthwise(two_readers) is two_readers


def _with_update(g: Graph, param: str, after: int) -> Graph:
    """`g` with an in-place qsgd_update of `param` inserted after node `after`."""
    w = g.input(param)
    grad, step = new_value(TensorType(w.shape, "float32"), "grad"), new_value(TensorType((), "int32"), STEP)
    e = Emitter()
    upd = e.emit("qsgd_update", w, grad, step, lr=0.1, momentum=0.0, weight_decay=0.0, dim=0, index=None,
                 scale=(1.0,) * w.shape[0], seed=0, param_id=0, qmin=-(2 ** 24), qmax=2 ** 24)
    nodes = g.nodes[:after + 1] + tuple(e.nodes) + g.nodes[after + 1:]
    return verify(Graph(g.inputs + (grad, step), nodes, g.outputs + (upd,), g.output_names + (param,)))


def test_pass_keeps_in_place_updates_after_the_fused_node():
    g, _, arrays = small_pair()
    rng = np.random.default_rng(2)
    # b1 overwritten between the pair: the fused node (at the depthwise's place) would read
    # the new b1, so the pair stays
    between = _with_update(g, "b1", after=0)
    assert fuse_pointwise_depthwise(between) is between
    for param in ("b1", "b2"):  # updated after the pair: fused, and the update stays after it
        h = _with_update(g, param, after=1)
        feeds = {**arrays, "grad": rng.standard_normal(arrays[param].shape).astype(np.float32) * 1e3,
                 STEP: np.array(1, dtype=np.int32)}
        for f in (fuse_pointwise_depthwise(h), reorder_for_memory(fuse_pointwise_depthwise(h), {"x"})):
            verify(f)
            assert [n.op for n in f.nodes] == [PW_DW_OP, "qsgd_update"]
            fa, fb = ({k: v.copy() for k, v in feeds.items()} for _ in range(2))
            oa, ob = run_graph(h, fa)[0], run_graph(f, fb)[0]
            assert all(np.array_equal(oa[k], ob[k]) for k in oa)


# --- the paper's MobileNetV2 -----------------------------------------------------------------------
def _compile_mbv2(scheme):
    from edgetrain.models import from_tiny_training

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = from_tiny_training(str(MBV2), num_classes=10)
        return et.compile(m, (torch.zeros(1, 3, 128, 128),), update=scheme, quantize="int8",
                          optimizer=et.SGD(lr=0.01))


needs_assets = pytest.mark.skipif(not MBV2.exists(), reason="needs the paper's int8 models (shared/assets)")


@pytest.fixture(scope="module")
def mbv2():
    return _compile_mbv2(et.Sparse(**MBV2_99KB))


def ram_of(p):
    return ram_inputs(p.train_graph)


def one_step(p, g, seed=0):
    """Run one training step of `g` on copies of p's weights: (outputs, weights after)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 3, 128, 128)).astype(np.float32)
    feeds = {k: np.array(v, copy=True) for k, v in p.runner.feeds(g, x, np.array([3])).items()}
    out, _ = run_graph(g, feeds, ram_of(p))
    return out, feeds


def assert_same_step(p, g, f):
    (oa, wa), (ob, wb) = one_step(p, g), one_step(p, f)
    assert set(oa) == set(ob) and "loss" in oa
    assert oa["loss"] == ob["loss"]
    for k in oa:
        assert np.array_equal(oa[k], ob[k]), k
    for k in p.trainable:
        assert np.array_equal(wa[k], wb[k]), k


def forward_peak(g, report):
    first_grad = next(i for i, n in enumerate(g.nodes) if "grad" in n.op)
    return max(report.timeline[:first_grad])


@needs_assets
def test_mbv2_fused_step_is_bit_identical_and_needs_less_memory(mbv2):
    p = mbv2
    # compile() fuses: the first conv and block 1's expansion inside the row-streamed chain
    # from the image (tests/passes/test_stream.py), the other 7 pairs as qconv2d_pw_dw
    assert sum(n.op == PW_DW_OP for n in p.train_graph.nodes) == 7
    g = reorder_for_memory(apply_updates_early(p.stages["updates"]), ram_of(p))  # the order without fusion
    f = verify(fuse_pointwise_depthwise(g))
    fused = [n for n in f.nodes if n.op == PW_DW_OP]
    assert len(fused) == 9  # 8 expansions and the first conv with block 0's depthwise
    # block 1's 48x64x64 expansion (192 KB) is gone; the 4 KB channel block replaces it
    assert not any(n.op == "qconv2d" and n.out.shape == (1, 48, 64, 64) for n in f.nodes)
    assert any(n.inputs[1].name == "blocks.1.pointwise1.conv.weight" and n.outputs[1].type.nbytes == 64 * 64
               for n in fused)
    reordered = verify(reorder_for_memory(f, ram_of(p)))
    assert_same_step(p, g, f)
    assert_same_step(p, g, reordered)
    reports = [plan_memory(h, ram_of(p), list(p.trainable)) for h in (g, f, reordered)]
    before, after, after_reorder = reports
    assert forward_peak(g, before) > 192 * KB  # block 1's expansion and its input
    assert forward_peak(f, after) < 160 * KB
    assert after.activation_bytes < before.activation_bytes
    assert after.arena_bytes <= before.arena_bytes and after_reorder.arena_bytes < before.arena_bytes
    assert after_reorder.peak_bytes < before.peak_bytes


@needs_assets
def test_mbv2_fusion_before_reordering_with_a_trained_depthwise_bias():
    """bias_last=23 trains blocks.9's depthwise bias but not its expansion: the pair is
    fused and its fused node reads a bias that an in-place update overwrites later; the
    pipeline's ordering passes keep that update after it."""
    p = _compile_mbv2(et.Sparse(bias_last=23))
    b2 = "blocks.9.depthwise.conv.bias"
    assert b2 in p.trainable and "blocks.9.pointwise1.conv.bias" not in p.trainable
    g = reorder_for_memory(apply_updates_early(fuse_pointwise_depthwise(p.stages["updates"])), ram_of(p))
    verify(g)
    (fused,) = [i for i, n in enumerate(g.nodes) if n.op == PW_DW_OP and n.inputs[4].name == b2]
    (update,) = [i for i, n in enumerate(g.nodes) if n.op == "qsgd_update" and n.inputs[0].name == b2]
    assert fused < update
    assert_same_step(p, p.train_graph, g)
