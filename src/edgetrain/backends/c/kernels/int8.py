"""C kernels of the int8 ops (runtime/et_int8.h): the integer forward (qconv2d and its fused
and row-streamed forms, qadd, qmean, qclamp, max/average pooling, concatenation,
quantize/dequantize, saturation masks) and the float32 backward of pooling and concatenation
in the summation order the references fix (ops/qpool.py). The convolutions' backward and the
integer SGD updates are in kernels/int8_grad.py (imported here, so importing this module
registers every int8 kernel); the shared declarations in kernels/int8_params.py.

Every emitter returns one C block with the layer's constants (shapes, multipliers, scales)
as `static const` data, so the compiler specialises the inline kernels. Weights stored
split (trained on some channels only, layout.StateArray) are read from their two arrays
through a channel map (`et_w8`); their update writes the trained part only.
"""
from __future__ import annotations

from ....ir import DTYPE_BYTES, Node, Value
from ....ops.pool import fixed_avg_divisor
from ....ops.qfused import split_attrs as split_pw_dw
from ....ops.qstream import row_plan, rows_of
from ....ops.reduce import reduced_dims
from ..layout import CBackendError
from . import int8_grad  # noqa: F401  (registers the backward and the updates)
from .int8_igrad import iacc_conv  # (and registers the integer-only backward)
from .int8_params import block, c_int, c_ints, conv_params, numel, weight_arg, weight_decl, whole_rows
from .registry import register


# --- forward --------------------------------------------------------------------------------
@register("qconv2d", split_aware=True)
def qconv2d(node: Node, ctx) -> str:
    x, w, b = node.inputs
    y = node.outputs[0]
    a = node.attrs
    if a.get("acc_out"):  # the integer backward's classifier: int32 accumulators
        return iacc_conv(node, ctx)
    decls, form, warg = weight_arg(ctx, w, "W")
    lines = conv_params(ctx, "P", x.shape, w.shape, y.shape, a) + decls
    yp, yf = ("0", ctx.ptr(y)) if a.get("float_out") else (ctx.ptr(y), "0")
    # et_qconv_whole (or et_qconv_whole_w): et_qconv_rows over every row and channel of the whole
    # tensors (runtime/et_int8.h)
    lines.append(f"et_qconv_whole{form}(&P, {ctx.ptr(x)}, {warg}, {ctx.ptr(b)}, {yp}, {yf});")
    return block(lines)


def pw_dw_blocking(rows: int, held: int, span: int, stride: int, rows_out: int, channels: int) -> tuple[int, int]:
    """(g, r) for qconv2d_pw_dw: g of the `channels` expansion channels at a time, r
    depthwise output rows per depthwise call, with a ring of cap = min((r - 1) * stride +
    span, rows) rows per channel (rows: the plane's; span: the rows one output row reads) and
    g * cap <= held * rows (the scratch holds `held` planes). More channels per pass share the
    packing of the pointwise input; more rows per call spread the depthwise call's set-up: the
    pair minimising 1/g + 1/r (g = 1 always fits)."""
    budget, span = held * rows, min(span, rows)
    best = (1, 1)
    for g in range(1, channels + 1):
        cap = min(budget // g, rows)
        if cap < span:
            break
        r = rows_out if cap == rows else max(1, min((cap - span) // stride + 1, rows_out))
        if 1 / g + 1 / r < 1 / best[0] + 1 / best[1]:
            best = (g, r)
    return best


@register("qconv2d_pw_dw", split_aware=True)
def qconv2d_pw_dw(node: Node, ctx) -> str:
    """G expansion channels at a time (pw_dw_blocking): the pointwise rows of those channels
    into a ring of cap rows per channel held in the scratch (its `block` channels' planes:
    passes/widen_scratch.py widens it where the peak has room), as many as the next R
    depthwise output rows need, then those depthwise rows; the ring keeps every row the
    depthwise window still reads. (The pointwise kernel then packs x once per G channels, not
    once per channel.)"""
    x, w1, b1, w2, b2 = node.inputs
    y, scratch = node.outputs
    pw, dw = split_pw_dw(node.attrs)
    c = w1.shape[0]
    n, held, ht, wt = scratch.shape  # held: the expansion channels the scratch holds
    ho = y.shape[2]
    t_shape = (n, c, ht, wt)
    kh, sh, dh = w2.shape[2], dw["stride"][0], dw["dilation"][0]
    span = (kh - 1) * dh + 1  # the input rows one output row reads
    g, r = pw_dw_blocking(ht, held, span, sh, ho, c)
    lines = (conv_params(ctx, "PW", x.shape, w1.shape, t_shape, pw) + conv_params(ctx, "DW", t_shape, w2.shape,
                                                                                      y.shape, dw)
             + weight_decl(ctx, w1, "W1") + weight_decl(ctx, w2, "W2"))
    # the loops over channels and rows in runtime/et_int8.h (the ring's cap rows from DW's geometry and r)
    lines.append(f"et_qconv_pw_dw(&PW, &DW, {ctx.ptr(x)}, &W1, {ctx.ptr(b1)}, &W2, {ctx.ptr(b2)}, {ctx.ptr(y)}, "
                 f"(int8_t *){ctx.ptr(scratch)}, {g}, {r});")
    return block(lines)


def _qadd_params(name: str, a) -> str:
    keys = ("a_zero", "b_zero", "y_zero", "a_mult", "a_shift", "b_mult", "b_shift", "y_mult", "y_shift", "qmin",
            "qmax")
    return f"static const et_qadd_p {name} = {{{', '.join(c_int(a[k]) for k in keys)}}};"


@register("qadd")
def qadd(node: Node, ctx) -> str:
    x, y = node.inputs
    return block([_qadd_params("P", node.attrs),
                   f"et_qadd(&P, {ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.ptr(node.outputs[0])}, {x.type.numel});"])


@register("qstream", split_aware=True)
def qstream(node: Node, ctx) -> str:
    """The body's bands of rows in the order of `row_plan` (a const table of body node
    indices; a node's bands come in increasing order, each the next `rows` rows), intermediates in ring buffers laid end to end in
    the scratch output in body-node order, as ops/qstream.py lays them out."""
    body = node.attrs["body"]
    band = rows_of(node.attrs)
    plan = row_plan(body, band)
    nodes = body.nodes
    outer = dict(zip(body.inputs, node.inputs))
    y_node = len(nodes) - 1
    producer = {n.out: i for i, n in enumerate(nodes)}
    scratch = ctx.ptr(node.outputs[1])
    lines, rows, off = [], {}, 0
    for i, n in enumerate(nodes):  # where each body node's rows go
        _, c, h, w = n.out.shape
        if i == y_node:
            rows[n.out] = f"R{i}"
            lines.append(f"const et_rows8 R{i} = {whole_rows(ctx.ptr(node.outputs[0]), n.out.shape)};")
        else:
            cap = plan.capacity[i]
            lines.append(f"const et_rows8 R{i} = {{(int8_t *){scratch} + {off}, {c * cap * w}, {cap * w}, {cap}}};")
            off += n.out.shape[0] * c * cap * w
            rows[n.out] = f"R{i}"

    def src(v: Value) -> str:
        if v in producer:
            return rows[v]
        return whole_rows(ctx.ptr(outer[v]), v.shape)

    cases = []
    for i, n in enumerate(nodes):
        if n.op == "qconv2d":
            xv, wv, bv = n.inputs
            lines += conv_params(ctx, f"P{i}", xv.shape, wv.shape, n.out.shape, n.attrs)
            lines += weight_decl(ctx, outer[wv], f"W{i}")
            call = (f"et_qconv_rows(&P{i}, {src(xv)}, 0, &W{i}, {ctx.ptr(outer[bv])}, R{i}, 0, 0, r, r1, 0, "
                    f"{n.out.shape[1]});")
        elif n.op == "qadd":
            lines.append(_qadd_params(f"A{i}", n.attrs))
            nb, c, _, w = n.out.shape
            call = (f"for (int32_t q = r; q < r1; q++) et_qadd_row(&A{i}, {src(n.inputs[0])}, {src(n.inputs[1])}, "
                    f"R{i}, {nb}, {c}, {w}, q);")
        else:
            raise CBackendError(f"qstream: no row kernel for body op {n.op}")
        cases.append(f"    case {i}: {call} break;")
    order = [i for i, _, _ in plan.steps]
    ctype = "uint8_t" if len(nodes) < 256 else "uint16_t"
    if band == 1:
        step = ["    const int32_t i = plan[s], r = done[i]++, r1 = r + 1;"]
    else:  # a band: the next `band` rows of node i, the last one cut at its height
        lines.append(c_ints("int32_t", "height", [n.out.shape[2] for n in nodes]))
        step = [f"    const int32_t i = plan[s], r = done[i], r1 = r + {band} < height[i] ? r + {band} : height[i];",
                "    done[i] = r1;"]
    lines += [c_ints(ctype, "plan", order), f"int32_t done[{len(nodes)}] = {{0}};",
              f"for (int32_t s = 0; s < {len(order)}; s++) {{", *step,
              "    switch (i) {", *cases, "    default: break;", "    }", "}"]
    return block(lines)


@register("qmean")
def qmean(node: Node, ctx) -> str:
    x = node.inputs[0]
    dims = reduced_dims(x.type.rank, node.attrs)
    if dims != tuple(range(x.type.rank - len(dims), x.type.rank)):
        raise CBackendError(f"qmean: only trailing dims are supported, got {dims} of {x.shape}")
    inner = numel([x.shape[d] for d in dims])
    outer = x.type.numel // max(inner, 1)
    zero = c_int(node.attrs["zero"])
    return block([f"et_qmean({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {outer}, {inner}, {zero});"])


@register("qclamp")
def qclamp(node: Node, ctx) -> str:
    x = node.inputs[0]
    a = node.attrs
    return block([f"et_qclamp({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {x.type.numel}, {c_int(a['qmin'])}, "
                   f"{c_int(a['qmax'])});"])


@register("quantize")
def quantize(node: Node, ctx) -> str:
    x = node.inputs[0]
    a = node.attrs
    if x.dtype != "float32":
        raise CBackendError(f"quantize: the C kernel takes float32 input, got {x.type}")
    return block([f"et_quantize({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {x.type.numel}, {ctx.c_float(a['scale'])}, "
                   f"{c_int(a['zero'])}, {c_int(a['qmin'])}, {c_int(a['qmax'])});"])


@register("dequantize")
def dequantize(node: Node, ctx) -> str:
    x = node.inputs[0]
    a = node.attrs
    return block([f"et_dequantize({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {x.type.numel}, "
                   f"{ctx.c_float(a['scale'])}, {c_int(a['zero'])});"])


@register("qmask_pack")
def qmask_pack(node: Node, ctx) -> str:
    y = node.inputs[0]
    a = node.attrs
    return block([f"et_qmask_pack({ctx.ptr(y)}, (uint8_t *){ctx.ptr(node.outputs[0])}, {y.type.numel}, "
                   f"{c_int(a['lo'])}, {c_int(a['hi'])});"])


@register("qmask_grad")
def qmask_grad(node: Node, ctx) -> str:
    g, m = node.inputs
    if g.dtype == "int16":  # the integer-only backward's gradient
        return block([f"et_qmask_grad_i16({ctx.ptr(g)}, (const uint8_t *){ctx.ptr(m)}, {ctx.ptr(node.outputs[0])}, "
                      f"{g.type.numel});"])
    return block([f"et_qmask_grad({ctx.ptr(g)}, (const uint8_t *){ctx.ptr(m)}, {ctx.ptr(node.outputs[0])}, "
                   f"{g.type.numel});"])


@register("index_select")
def index_select(node: Node, ctx) -> str:
    x = node.inputs[0]
    dim = node.attrs["dim"] % x.type.rank
    idx = node.attrs["index"]
    outer, inner = numel(x.shape[:dim]), numel(x.shape[dim + 1:])
    return block([c_ints("uint16_t", "IDX", idx),
                   f"et_index_select({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {outer}, {x.shape[dim]}, {inner}, "
                   f"IDX, {len(idx)}, {DTYPE_BYTES[x.dtype]});"])


@register("index_select_grad")
def index_select_grad(node: Node, ctx) -> str:
    g = node.inputs[0]
    out = node.outputs[0]
    dim = node.attrs["dim"] % out.type.rank
    idx = node.attrs["index"]
    outer, inner = numel(out.shape[:dim]), numel(out.shape[dim + 1:])
    eb = DTYPE_BYTES[g.dtype]
    if len(set(idx)) == len(idx):  # each row written once: a copy
        return block([c_ints("uint16_t", "IDX", idx),
                       f"uint8_t *dst = (uint8_t *){ctx.ptr(out)}; const uint8_t *src = (const uint8_t *){ctx.ptr(g)};",
                       f"memset(dst, 0, {out.type.numel * eb});",
                       f"for (int32_t k = 0; k < {outer}; k++) for (int32_t t = 0; t < {len(idx)}; t++)",
                       f"    memcpy(dst + (k * {out.shape[dim]} + IDX[t]) * {inner * eb}, src + (k * {len(idx)} + t) * "
                       f"{inner * eb}, {inner * eb});"])
    # a repeated index sums its gradients, in index order (as the reference's np.add.at)
    t = ctx.ctype(g)
    return block([c_ints("uint16_t", "IDX", idx),
                   f"{t} *dst = {ctx.ptr(out)}; const {t} *src = {ctx.ptr(g)};",
                   f"memset(dst, 0, {out.type.numel * eb});",
                   f"for (int32_t k = 0; k < {outer}; k++) for (int32_t t = 0; t < {len(idx)}; t++) {{",
                   f"    {t} *d = dst + ((size_t)k * {out.shape[dim]} + IDX[t]) * {inner};",
                   f"    const {t} *s = src + ((size_t)k * {len(idx)} + t) * {inner};",
                   f"    for (int32_t i = 0; i < {inner}; i++) d[i] = ({t})(d[i] + s[i]);",
                   "}"])


# --- pooling and concatenation (ops/qpool.py) --------------------------------------------------
def _pool_params(name: str, x_shape, y_shape, a, div: int = 0) -> str:
    n, c, h, w = x_shape
    ho, wo = y_shape[2:]
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    dh, dw = a.get("dilation", (1, 1))
    return (f"static const et_pool_p {name} = {{{n * c}, {h}, {w}, {ho}, {wo}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, "
            f"{dh}, {dw}, {int(div)}}};")


@register("qmax_pool2d")
def qmax_pool2d(node: Node, ctx) -> str:
    x, y = node.inputs[0], node.outputs[0]
    return block([_pool_params("P", x.shape, y.shape, node.attrs),
                   f"et_qmax_pool2d(&P, {ctx.ptr(x)}, {ctx.ptr(y)});"])


@register("qmax_pool2d_grad")
def qmax_pool2d_grad(node: Node, ctx) -> str:
    g, x = node.inputs
    return block([_pool_params("P", x.shape, g.shape, node.attrs),
                   f"et_qmax_pool2d_grad(&P, {ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.outputs[0])});"])


@register("qavg_pool2d")
def qavg_pool2d(node: Node, ctx) -> str:
    x, y = node.inputs[0], node.outputs[0]
    a = node.attrs
    return block([_pool_params("P", x.shape, y.shape, a, fixed_avg_divisor(a)),
                   f"et_qavg_pool2d(&P, {ctx.ptr(x)}, {ctx.ptr(y)}, {c_int(a['zero'])});"])


@register("qavg_pool2d_grad")
def qavg_pool2d_grad(node: Node, ctx) -> str:
    g, gx = node.inputs[0], node.outputs[0]
    a = node.attrs
    return block([_pool_params("P", gx.shape, g.shape, a, fixed_avg_divisor(a)),
                   f"et_qavg_pool2d_grad(&P, {ctx.ptr(g)}, {ctx.ptr(gx)});"])


def _along(shape, dim: int) -> tuple[int, int]:
    """(outer, inner): elements before `dim` and from `dim` on, for a concatenation on dim."""
    return numel(shape[:dim]), numel(shape[dim:])


@register("qcat")
def qcat(node: Node, ctx) -> str:
    """Per leading index k, each input's block of elements after the previous ones' (TFLite
    concatenation), requantized or copied by et_qrequant."""
    y = node.outputs[0]
    a = node.attrs
    dim = a["dim"] % y.type.rank
    outer, inner_y = _along(y.shape, dim)
    lines, off = [f"for (int32_t k = 0; k < {outer}; k++) {{"], 0
    for i, x in enumerate(node.inputs):
        inner = _along(x.shape, dim)[1]
        lines.append(f"    et_qrequant({ctx.ptr(x)} + k * {inner}, {ctx.ptr(y)} + k * {inner_y} + {off}, {inner}, "
                     f"{c_int(a['x_zero'][i])}, {c_int(a['mult'][i])}, {c_int(a['shift'][i])}, {c_int(a['y_zero'])});")
        off += inner
    return block(lines + ["}"])


@register("qcat_grad")
def qcat_grad(node: Node, ctx) -> str:
    g, gx = node.inputs[0], node.outputs[0]
    a = node.attrs
    dim = a["dim"] % g.type.rank
    outer, inner_g = _along(g.shape, dim)
    inner = _along(gx.shape, dim)[1]
    start = a["start"] * numel(g.shape[dim + 1:])
    return block([f"for (int32_t k = 0; k < {outer}; k++)",
                   f"    memcpy({ctx.ptr(gx)} + k * {inner}, {ctx.ptr(g)} + k * {inner_g} + {start}, "
                   f"{inner * DTYPE_BYTES[gx.dtype]});"])
