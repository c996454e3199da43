"""C kernels of the integer-only backward (runtime/et_igrad.h; ops/igrad.py and
ops/icross_entropy.py are the spec): the classifier's int32 accumulators, the integer
softmax cross entropy, gradient rescales and sums, the int16 saturation mask, a
convolution's input gradient and the fused weight / bias gradient updates. Registered when
kernels/int8.py is imported. A weight stored split (trained on some channels: its selected
channels in RAM, the rest in flash) is read through its `et_w8` and updated in its RAM part.
"""
from __future__ import annotations

from ....ir import Node
from ....ops.igrad_fixed import EXP2_NEG_Q30, LOG2_1P_Q16
from ..layout import CBackendError
from .int8_params import block, c_int, c_ints, numel, weight_decl
from .registry import register


def _geometry(x_shape, w_shape, g_shape, a) -> str:
    """`static const et_iconv_p P` of a convolution with input x_shape, weight w_shape (its
    first two dims as the op sees them) and output g_shape."""
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    ho, wo = g_shape[2:]
    s, p, d = a["stride"], a["padding"], a["dilation"]
    vals = (n, c, h, w, o, cg, kh, kw, ho, wo, s[0], s[1], p[0], p[1], d[0], d[1], int(a["groups"]),
            int(a.get("x_zero", 0)))
    return "static const et_iconv_p P = {" + ", ".join(str(int(v)) for v in vals) + "};"


def _target(ctx, v, a, op: str) -> tuple[str, int]:
    """(the C pointer an update writes, 1 when it is a split weight's selected part): a split one
    is updated on the channels it stores in RAM, exactly."""
    st = ctx.state_of(v)
    if st is None:
        raise CBackendError(f"C kernel for {op}: {v} is not a state tensor")
    if st.kind != "split":
        return ctx.ptr(v), 0
    sel = ctx.weight(v).sel
    if a.get("index") is None or sel.dim != a["dim"] or tuple(sel.index) != tuple(a["index"]):
        raise CBackendError(f"C kernel for {op}: {v.name} is stored split on {sel} but updated on dim {a['dim']} "
                            f"index {a.get('index')}")
    return ctx.weight(v).sram, 1


def iacc_conv(node: Node, ctx) -> str:
    """qconv2d with acc_out: the int32 accumulators conv(x - x_zero, w) + bias."""
    x, w, b = node.inputs
    return block([_geometry(x.shape, w.shape, node.out.shape, node.attrs), *weight_decl(ctx, w, "W"),
                  f"et_iacc_conv(&P, {ctx.ptr(x)}, &W, {ctx.ptr(b)}, {ctx.ptr(node.out)});"])


@register("icross_entropy")
def icross_entropy(node: Node, ctx) -> str:
    z, label = node.inputs
    loss, grad = node.outputs
    a = node.attrs
    n, k = z.shape[:2]
    inner = numel(z.shape[2:])
    return block([c_ints("int32_t", "MULT", a["mult"]), c_ints("int32_t", "SHIFT", a["shift"]),
                  c_ints("int32_t", "EXP2", EXP2_NEG_Q30), c_ints("int32_t", "LOG2T", LOG2_1P_Q16),
                  f"et_icross_entropy({ctx.ptr(z)}, {1 if z.dtype == 'int8' else 4}, {ctx.ptr(label)}, {n}, {k}, "
                  f"{inner}, {c_int(a.get('zero', 0))}, MULT, SHIFT, "
                  f"{int(a['grad_shift'])}, {int(a['ignore_index'])}, EXP2, LOG2T, {ctx.ptr(loss)}, {ctx.ptr(grad)});"])


@register("igrad_scale")
def igrad_scale(node: Node, ctx) -> str:
    a = node.attrs
    if len(a["mult"]) != 1:
        raise CBackendError("C kernel for igrad_scale: one multiplier only")
    g = node.inputs[0]
    return block([f"et_igrad_scale({ctx.ptr(g)}, {ctx.ptr(node.out)}, {g.type.numel}, {c_int(a['mult'][0])}, "
                  f"{c_int(a['shift'][0])});"])


@register("igrad_add")
def igrad_add(node: Node, ctx) -> str:
    x, y = node.inputs
    a = node.attrs
    return block([f"et_igrad_add({ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.ptr(node.out)}, {x.type.numel}, "
                  f"{c_int(a['shift_a'])}, {c_int(a['shift_b'])});"])


@register("iconv_grad_input", split_aware=True)
def iconv_grad_input(node: Node, ctx) -> str:
    g, w = node.inputs
    a = node.attrs
    return block([_geometry(a["input_shape"], w.shape, g.shape, a), c_ints("int16_t", "MULT", a["mult"]),
                  *weight_decl(ctx, w, "W"),
                  f"et_iconv_grad_input(&P, {ctx.ptr(g)}, &W, MULT, {c_int(a['shift'])}, "
                  f"{ctx.ptr(node.out)});"])


def _update_lines(node: Node, ctx, a) -> list[str]:
    """The update's constants: per row a 15-bit multiplier (int16) and its shift (int8), the indices
    of a channel selection, SGD's settings, the rounding hash's key."""
    idx = a["index"] if a.get("index") is not None else (0,)
    if max(a["mult"], default=0) >= 2 ** 15:
        raise CBackendError(f"C kernel for {node.op}: a multiplier past int16 ({max(a['mult'])})")
    opt = (a.get("momentum_q16", 0), a.get("decay_mult", 0), a.get("decay_shift", 0), a["qmin"], a["qmax"])
    return [c_ints("int16_t", "MULT", a["mult"]), c_ints("int8_t", "SHIFT", a["shift"]),
            c_ints("uint16_t", "IDX", idx), "static const et_iopt_p O = {" + ", ".join(c_int(v) for v in opt) + "};",
            f"const uint32_t key = et_hash_key({int(a['seed']) & 0xFFFFFFFF}u, {int(a['param_id']) & 0xFFFFFFFF}u, "
            f"{ctx.step});"]


@register("iconv_grad_weight_update", split_aware=True)
def iconv_grad_weight_update(node: Node, ctx) -> str:
    x, g, w = node.inputs[:3]
    m = ctx.ptr(node.inputs[4]) if len(node.inputs) > 4 else "0"
    a = node.attrs
    wq, split = _target(ctx, w, a, node.op)
    ws = tuple(a["weight_shape"])  # w: (o, c, kh, kw), a linear layer's (o, c), a conv1d's (o, c, kw)
    dim = -1 if a.get("index") is None else int(a["dim"])
    depthwise = int(int(a["groups"]) > 1)
    upd = (ws[0], ws[1], w.shape[1], depthwise, dim, split)
    return block(_update_lines(node, ctx, a) + [
        _geometry(x.shape, ws, g.shape, a),
        "static const et_iupd_p U = {" + ", ".join(str(v) for v in upd) + "};",
        f"et_iconv_grad_weight_update(&P, &U, &O, {ctx.ptr(x)}, {ctx.ptr(g)}, (int8_t *){wq}, {m}, MULT, SHIFT, "
        f"IDX, key);"])


@register("iconv_bias_update", split_aware=True)
def iconv_bias_update(node: Node, ctx) -> str:
    b, g = node.inputs[:2]
    m = ctx.ptr(node.inputs[3]) if len(node.inputs) > 3 else "0"
    a = node.attrs
    bq, split = _target(ctx, b, a, node.op)
    idx = "IDX" if a.get("index") is not None else "0"
    return block(_update_lines(node, ctx, a) + [
        f"et_iconv_bias_update((int32_t *){bq}, {m}, {ctx.ptr(g)}, {g.shape[0]}, {g.shape[1]}, "
        f"{numel(g.shape[2:])}, &O, MULT, SHIFT, {idx}, {split}, key);"])
