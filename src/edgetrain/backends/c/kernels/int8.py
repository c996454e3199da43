"""C kernels of the int8 ops (runtime/et_int8.h): the integer forward (qconv2d and its fused
and row-streamed forms, qadd, qmean, qclamp, max/average pooling, concatenation,
quantize/dequantize, saturation masks), the float32 backward in the summation order the
references fix (ops/qconv.py, ops/qpool.py), and the integer SGD updates with the counter
hash of ops/qoptim.py.

Every emitter returns one C block with the layer's constants (shapes, multipliers, scales)
as `static const` data, so the compiler specialises the inline kernels. Weights stored
split (trained on some channels only, layout.StateArray) are read from their two arrays
through a channel map (`et_w8`); their update writes the trained part only.
"""
from __future__ import annotations

import numpy as np

from ....ir import DTYPE_BYTES, Node, Value
from ....ops.pool import fixed_avg_divisor
from ....ops.qconv import out_scales
from ....ops.qfused import split_attrs as split_pw_dw
from ....ops.qgradupdate import split_attrs as split_grad_update
from ....ops.qoptim import row_scales
from ....ops.qstream import row_plan
from ....ops.reduce import reduced_dims
from ..layout import CBackendError
from .registry import register

#: C element type names used in casts
I8, I32, F32, U8 = "int8_t", "int32_t", "float", "uint8_t"


# --- literals -------------------------------------------------------------------------------
def _ints(ctype: str, name: str, values) -> str:
    vals = [int(v) for v in values]
    body = ", ".join("(-2147483647-1)" if v == -2 ** 31 else str(v) for v in vals) or "0"
    return f"static const {ctype} {name}[{max(len(vals), 1)}] = {{{body}}};"


def _floats(ctx, name: str, values) -> str:
    body = ", ".join(ctx.c_float(v) for v in values) or "0.0f"
    return f"static const float {name}[{max(len(list(values)), 1)}] = {{{body}}};"


def _i(v: int) -> str:
    return "(-2147483647-1)" if int(v) == -2 ** 31 else str(int(v))


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


# --- operands -------------------------------------------------------------------------------
def _weight(ctx, v: Value, name: str) -> list[str]:
    """Declarations of `et_w8 name` reading the int8 OIHW weight `v` (whole or split)."""
    st = ctx.state_of(v)
    if st is None or st.kind != "split":
        return [f"const et_w8 {name} = {{(const int8_t *){ctx.ptr(v)}, 0, 0, 0, 0, 0, 0}};"]
    ref = ctx.weight(v)
    sel = ref.sel
    size = v.shape[sel.dim]
    pos = {c: k for k, c in enumerate(sel.index)}
    rest = [c for c in range(size) if c not in pos]
    rpos = {c: k for k, c in enumerate(rest)}
    cmap = [pos[c] if c in pos else -rpos[c] - 1 for c in range(size)]
    return [_ints("int16_t", name + "_map", cmap),
            f"const et_w8 {name} = {{0, (const int8_t *){ref.sram}, (const int8_t *){ref.flash}, {name}_map, "
            f"{sel.dim}, {len(pos)}, {len(rest)}}};"]


def _whole(ptr: str, shape) -> str:
    n, c, h, w = shape
    return f"et_whole8({ptr}, {c}, {h}, {w})"


def _conv_params(ctx, name: str, x_shape, w_shape, y_shape, a, groups=None, out_channels=None) -> list[str]:
    """`static const et_qconv_p name` (+ its per-channel arrays) for a qconv2d-like layer."""
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    ho, wo = y_shape[2:]
    s, p, d = a["stride"], a["padding"], a["dilation"]
    g = int(a["groups"] if groups is None else groups)
    lines = []
    q = "0, 0, 0"
    if "mult" in a and not a.get("float_out"):
        lines += [_ints(I32, name + "_m", a["mult"]), _ints("int8_t", name + "_s", a["shift"])]
        q = f"{name}_m, {name}_s, 0"
    elif a.get("float_out"):
        lines.append(_floats(ctx, name + "_os", out_scales(a)))
        q = f"0, 0, {name}_os"
    quant = ", ".join(_i(a.get(k, 0)) for k in ("x_zero", "y_zero", "qmin", "qmax"))
    lines.append(f"static const et_qconv_p {name} = {{{n}, {c}, {h}, {w}, {o}, {cg}, {kh}, {kw}, {ho}, {wo}, "
                 f"{s[0]}, {s[1]}, {p[0]}, {p[1]}, {d[0]}, {d[1]}, {g}, {quant}, {q}}};")
    return lines


def _block(lines) -> str:
    return "{\n" + "\n".join("    " + ln for ln in lines) + "\n}"


# --- forward --------------------------------------------------------------------------------
@register("qconv2d", split_aware=True)
def qconv2d(node: Node, ctx) -> str:
    x, w, b = node.inputs
    y = node.outputs[0]
    a = node.attrs
    lines = _conv_params(ctx, "P", x.shape, w.shape, y.shape, a) + _weight(ctx, w, "W")
    o, ho, wo = y.shape[1:]
    if a.get("float_out"):
        ys, yf = f"et_rows8 Y = {{0, {o * ho * wo}, {ho * wo}, {ho}}};", f"{ctx.ptr(y)}"
    else:
        ys, yf = f"et_rows8 Y = {_whole(ctx.ptr(y), y.shape)};", "0"
    lines += [ys, f"et_qconv_rows(&P, {_whole(ctx.ptr(x), x.shape)}, 0, &W, {ctx.ptr(b)}, Y, {yf}, 0, 0, {ho}, "
                  f"0, {o});"]
    return _block(lines)


#: pw_dw's channel groups: at most this many expansion channels share one pass over x
PW_DW_GROUP = 8


def pw_dw_blocking(budget_rows: int, span: int, stride: int, rows_out: int) -> tuple[int, int]:
    """(g, r) for qconv2d_pw_dw: g expansion channels at a time, r depthwise output rows per
    depthwise call, with a ring of cap = min((r - 1) * stride + span, budget_rows) rows per
    channel (span: the rows one output row reads, at most budget_rows) and g * cap <=
    budget_rows (the one-plane scratch). More channels per pass share the packing of the
    pointwise input; more rows per call spread the depthwise call's set-up: the pair
    minimising 1/g + 1/r (g = 1 always fits)."""
    span = min(span, budget_rows)
    best = (1, 1)
    for g in (1, 2, 4, 8):
        cap = budget_rows // g
        if g > PW_DW_GROUP or cap < span:
            continue
        r = max(1, min((cap - span) // stride + 1, rows_out))
        if 1 / g + 1 / r < 1 / best[0] + 1 / best[1]:
            best = (g, r)
    return best


@register("qconv2d_pw_dw", split_aware=True)
def qconv2d_pw_dw(node: Node, ctx) -> str:
    """G expansion channels at a time (pw_dw_blocking): the pointwise rows of those channels
    into a ring of cap rows per channel held in the one-plane scratch, as many as the next R
    depthwise output rows need, then those depthwise rows; the ring keeps every row the
    depthwise window still reads. (The pointwise kernel then packs x once per G channels, not
    once per channel.)"""
    x, w1, b1, w2, b2 = node.inputs
    y, scratch = node.outputs
    pw, dw = split_pw_dw(node.attrs)
    c = w1.shape[0]
    n, _, ht, wt = scratch.shape
    ho = y.shape[2]
    t_shape = (n, c, ht, wt)
    kh, sh, ph, dh = w2.shape[2], dw["stride"][0], dw["padding"][0], dw["dilation"][0]
    span = (kh - 1) * dh + 1  # the input rows one output row reads
    g, r = pw_dw_blocking(ht, span, sh, ho)
    cap = min((r - 1) * sh + span, ht)
    lines = (_conv_params(ctx, "PW", x.shape, w1.shape, t_shape, pw) + _conv_params(ctx, "DW", t_shape, w2.shape,
                                                                                      y.shape, dw)
             + _weight(ctx, w1, "W1") + _weight(ctx, w2, "W2"))
    lines += [f"const et_rows8 T = {{(int8_t *){ctx.ptr(scratch)}, {g * cap * wt}, {cap * wt}, {cap}}};",
              f"for (int32_t c = 0; c < {c}; c += {g}) {{",
              f"    const int32_t c1 = c + {g} < {c} ? c + {g} : {c};",
              "    int32_t next = 0; /* the pointwise rows computed so far */",
              f"    for (int32_t r = 0; r < {ho}; r += {r}) {{",
              f"        const int32_t r1 = r + {r} < {ho} ? r + {r} : {ho};",
              f"        int32_t need = (r1 - 1) * {sh} - {ph} + {span};",
              f"        if (need > {ht}) need = {ht};",
              "        if (need > next) {",
              f"            et_qconv_rows(&PW, {_whole(ctx.ptr(x), x.shape)}, 0, &W1, {ctx.ptr(b1)}, T, 0, c, next, "
              "need, c, c1);",
              "            next = need;",
              "        }",
              f"        et_qconv_rows(&DW, T, c, &W2, {ctx.ptr(b2)}, {_whole(ctx.ptr(y), y.shape)}, 0, 0, r, r1, c, c1);",
              "    }",
              "}"]
    return _block(lines)


def _qadd_params(name: str, a) -> str:
    keys = ("a_zero", "b_zero", "y_zero", "a_mult", "a_shift", "b_mult", "b_shift", "y_mult", "y_shift", "qmin",
            "qmax")
    return f"static const et_qadd_p {name} = {{{', '.join(_i(a[k]) for k in keys)}}};"


@register("qadd")
def qadd(node: Node, ctx) -> str:
    x, y = node.inputs
    return _block([_qadd_params("P", node.attrs),
                   f"et_qadd(&P, {ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.ptr(node.outputs[0])}, {x.type.numel});"])


@register("qstream", split_aware=True)
def qstream(node: Node, ctx) -> str:
    """The body's rows in the order of `row_plan` (a const table of body node indices; a
    node's rows come in increasing order), intermediates in ring buffers laid end to end in
    the scratch output in body-node order, as ops/qstream.py lays them out."""
    body = node.attrs["body"]
    plan = row_plan(body)
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
            lines.append(f"const et_rows8 R{i} = {_whole(ctx.ptr(node.outputs[0]), n.out.shape)};")
        else:
            cap = plan.capacity[i]
            lines.append(f"const et_rows8 R{i} = {{(int8_t *){scratch} + {off}, {c * cap * w}, {cap * w}, {cap}}};")
            off += n.out.shape[0] * c * cap * w
            rows[n.out] = f"R{i}"

    def src(v: Value) -> str:
        if v in producer:
            return rows[v]
        return _whole(ctx.ptr(outer[v]), v.shape)

    cases = []
    for i, n in enumerate(nodes):
        if n.op == "qconv2d":
            xv, wv, bv = n.inputs
            lines += _conv_params(ctx, f"P{i}", xv.shape, wv.shape, n.out.shape, n.attrs)
            lines += _weight(ctx, outer[wv], f"W{i}")
            call = (f"et_qconv_rows(&P{i}, {src(xv)}, 0, &W{i}, {ctx.ptr(outer[bv])}, R{i}, 0, 0, r, r + 1, 0, "
                    f"{n.out.shape[1]});")
        elif n.op == "qadd":
            lines.append(_qadd_params(f"A{i}", n.attrs))
            nb, c, _, w = n.out.shape
            call = f"et_qadd_row(&A{i}, {src(n.inputs[0])}, {src(n.inputs[1])}, R{i}, {nb}, {c}, {w}, r);"
        else:
            raise CBackendError(f"qstream: no row kernel for body op {n.op}")
        cases.append(f"    case {i}: {call} break;")
    order = [i for i, _ in plan.steps]
    ctype = "uint8_t" if len(nodes) < 256 else "uint16_t"
    lines += [_ints(ctype, "plan", order), f"int32_t done[{len(nodes)}] = {{0}};",
              f"for (int32_t s = 0; s < {len(order)}; s++) {{",
              "    const int32_t i = plan[s], r = done[i]++;",
              "    switch (i) {", *cases, "    default: break;", "    }", "}"]
    return _block(lines)


@register("qmean")
def qmean(node: Node, ctx) -> str:
    x = node.inputs[0]
    dims = reduced_dims(x.type.rank, node.attrs)
    if dims != tuple(range(x.type.rank - len(dims), x.type.rank)):
        raise CBackendError(f"qmean: only trailing dims are supported, got {dims} of {x.shape}")
    inner = _numel([x.shape[d] for d in dims])
    outer = x.type.numel // max(inner, 1)
    return _block([f"et_qmean({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {outer}, {inner}, {_i(node.attrs['zero'])});"])


@register("qclamp")
def qclamp(node: Node, ctx) -> str:
    x = node.inputs[0]
    a = node.attrs
    return _block([f"et_qclamp({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {x.type.numel}, {_i(a['qmin'])}, "
                   f"{_i(a['qmax'])});"])


@register("quantize")
def quantize(node: Node, ctx) -> str:
    x = node.inputs[0]
    a = node.attrs
    if x.dtype != "float32":
        raise CBackendError(f"quantize: the C kernel takes float32 input, got {x.type}")
    return _block([f"et_quantize({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {x.type.numel}, {ctx.c_float(a['scale'])}, "
                   f"{_i(a['zero'])}, {_i(a['qmin'])}, {_i(a['qmax'])});"])


@register("dequantize")
def dequantize(node: Node, ctx) -> str:
    x = node.inputs[0]
    a = node.attrs
    return _block([f"et_dequantize({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {x.type.numel}, "
                   f"{ctx.c_float(a['scale'])}, {_i(a['zero'])});"])


@register("qmask_pack")
def qmask_pack(node: Node, ctx) -> str:
    y = node.inputs[0]
    a = node.attrs
    return _block([f"et_qmask_pack({ctx.ptr(y)}, (uint8_t *){ctx.ptr(node.outputs[0])}, {y.type.numel}, "
                   f"{_i(a['lo'])}, {_i(a['hi'])});"])


@register("qmask_grad")
def qmask_grad(node: Node, ctx) -> str:
    g, m = node.inputs
    return _block([f"et_qmask_grad({ctx.ptr(g)}, (const uint8_t *){ctx.ptr(m)}, {ctx.ptr(node.outputs[0])}, "
                   f"{g.type.numel});"])


@register("index_select")
def index_select(node: Node, ctx) -> str:
    x = node.inputs[0]
    dim = node.attrs["dim"] % x.type.rank
    idx = node.attrs["index"]
    outer, inner = _numel(x.shape[:dim]), _numel(x.shape[dim + 1:])
    return _block([_ints("uint16_t", "IDX", idx),
                   f"et_index_select({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {outer}, {x.shape[dim]}, {inner}, "
                   f"IDX, {len(idx)}, {DTYPE_BYTES[x.dtype]});"])


@register("index_select_grad")
def index_select_grad(node: Node, ctx) -> str:
    g = node.inputs[0]
    out = node.outputs[0]
    dim = node.attrs["dim"] % out.type.rank
    idx = node.attrs["index"]
    outer, inner = _numel(out.shape[:dim]), _numel(out.shape[dim + 1:])
    eb = DTYPE_BYTES[g.dtype]
    if len(set(idx)) == len(idx):  # each row written once: a copy
        return _block([_ints("uint16_t", "IDX", idx),
                       f"uint8_t *dst = (uint8_t *){ctx.ptr(out)}; const uint8_t *src = (const uint8_t *){ctx.ptr(g)};",
                       f"memset(dst, 0, {out.type.numel * eb});",
                       f"for (int32_t k = 0; k < {outer}; k++) for (int32_t t = 0; t < {len(idx)}; t++)",
                       f"    memcpy(dst + (k * {out.shape[dim]} + IDX[t]) * {inner * eb}, src + (k * {len(idx)} + t) * "
                       f"{inner * eb}, {inner * eb});"])
    # a repeated index sums its gradients, in index order (as the reference's np.add.at)
    t = ctx.ctype(g)
    return _block([_ints("uint16_t", "IDX", idx),
                   f"{t} *dst = {ctx.ptr(out)}; const {t} *src = {ctx.ptr(g)};",
                   f"memset(dst, 0, {out.type.numel * eb});",
                   f"for (int32_t k = 0; k < {outer}; k++) for (int32_t t = 0; t < {len(idx)}; t++) {{",
                   f"    {t} *d = dst + ((size_t)k * {out.shape[dim]} + IDX[t]) * {inner};",
                   f"    const {t} *s = src + ((size_t)k * {len(idx)} + t) * {inner};",
                   f"    for (int32_t i = 0; i < {inner}; i++) d[i] = ({t})(d[i] + s[i]);",
                   "}"])


# --- backward -------------------------------------------------------------------------------
@register("qconv2d_grad_input", split_aware=True)
def qconv2d_grad_input(node: Node, ctx) -> str:
    g, w = node.inputs
    a = node.attrs
    lines = (_conv_params(ctx, "P", a["input_shape"], w.shape, g.shape, a) + _weight(ctx, w, "W")
             + [_floats(ctx, "WS", a["w_scales"]),
                f"et_qconv_grad_input(&P, {ctx.ptr(g)}, &W, WS, {ctx.ptr(node.outputs[0])});"])
    return _block(lines)


@register("qconv2d_dw_grad_input", split_aware=True)
def qconv2d_dw_grad_input(node: Node, ctx) -> str:
    g, w = node.inputs
    gx, plane = node.outputs
    a = node.attrs
    lines = (_conv_params(ctx, "P", a["input_shape"], w.shape, g.shape, a) + _weight(ctx, w, "W")
             + [_floats(ctx, "WS", a["w_scales"]),
                f"et_qconv_dw_grad_input(&P, {ctx.ptr(g)}, &W, WS, {ctx.ptr(gx)}, {ctx.ptr(plane)});"])
    return _block(lines)


def _grad_weight_params(ctx, name, x, g, a) -> list[str]:
    return _conv_params(ctx, name, x.shape, a["weight_shape"], g.shape, a) + [_floats(ctx, name + "_sc", a["scales"])]


@register("qconv2d_grad_weight")
def qconv2d_grad_weight(node: Node, ctx) -> str:
    x, g = node.inputs
    a = node.attrs
    o = a["weight_shape"][0]
    row = _numel(a["weight_shape"][1:])
    lines = _grad_weight_params(ctx, "P", x, g, a) + [
        f"for (int32_t o = 0; o < {o}; o++)",
        f"    et_qconv_grad_weight_row(&P, {ctx.ptr(x)}, {ctx.ptr(g)}, o, P_sc[o], "
        f"{ctx.ptr(node.outputs[0])} + o * {row});"]
    return _block(lines)


@register("qconv2d_grad_bias")
def qconv2d_grad_bias(node: Node, ctx) -> str:
    g = node.inputs[0]
    n, o = g.shape[:2]
    return _block([_floats(ctx, "SC", node.attrs["scales"]),
                   f"et_qconv_grad_bias({ctx.ptr(g)}, {ctx.ptr(node.outputs[0])}, {n}, {o}, "
                   f"{_numel(g.shape[2:])}, SC);"])


# --- integer SGD ------------------------------------------------------------------------------
def _update(ctx, w: Value, a, grad_row: str, m: Value | None, rows: int, row_len: int, before_row=()) -> list[str]:
    """The C statements updating `w` row by row (`k` the row) from gradient rows at
    `grad_row` (a C expression of k), as qsgd_update with attributes `a`."""
    st = ctx.state_of(w)
    if st is None:
        raise CBackendError(f"qsgd_update: {w} is not a state tensor")
    index, dim = a.get("index"), a.get("dim", 0)
    split = st.kind == "split"
    if split:
        sel = ctx.weight(w).sel
        if index is None or sel.dim != dim or tuple(sel.index) != tuple(index):
            raise CBackendError(f"qsgd_update: {w.name} is stored split on {sel} but updated on dim {dim} "
                                f"index {index}")
        wq = ctx.weight(w).sram
    else:
        wq = ctx.ptr(w)
    inner = _numel(w.shape[2:]) if w.type.rank > 2 else 1
    lines = [_floats(ctx, "SC", row_scales(a)),
             f"static const et_qsgd_p Q = {{{ctx.c_float(a['lr'])}, {ctx.c_float(a.get('momentum', 0.0))}, "
             f"{ctx.c_float(a.get('weight_decay', 0.0))}, {_i(a['qmin'])}, {_i(a['qmax'])}, "
             f"{int(a['seed']) & 0xFFFFFFFF}u, {int(a['param_id']) & 0xFFFFFFFF}u}};",
             f"const uint32_t key = et_hash_key(Q.seed, Q.param_id, {ctx.step});"]
    idx = "0"
    if index is None:
        flat0 = f"(uint32_t)(k * {row_len})"
    elif dim == 0:
        lines.append(_ints("uint16_t", "IDX", index))
        flat0 = f"(uint32_t)IDX[k] * {row_len}u"
    elif dim == 1:
        lines.append(_ints("uint16_t", "IDX", index))
        flat0 = f"(uint32_t)(k * {w.shape[1] * inner})"
        idx = "IDX"
    else:
        raise CBackendError(f"qsgd_update: channel selection on dim {dim} is not supported")
    full = 0 if split or index is None else 1
    mptr = f"{ctx.ptr(m)} + k * {row_len}" if m is not None else "0"
    lines += [f"for (int32_t k = 0; k < {rows}; k++) {{", *("    " + s for s in before_row),
              f"    et_qsgd_row(&Q, key, (void *){wq}, {int(w.dtype == 'int8')}, {full}, k * {row_len}, {grad_row}, "
              f"{mptr}, SC[k], {row_len}, {flat0}, {idx}, {inner});", "}"]
    return lines


@register("qsgd_update", split_aware=True)
def qsgd_update(node: Node, ctx) -> str:
    w, g = node.inputs[:2]
    m = node.inputs[3] if len(node.inputs) > 3 else None
    rows = g.shape[0]
    row_len = g.type.numel // max(rows, 1)
    return _block(_update(ctx, w, node.attrs, f"{ctx.ptr(g)} + k * {row_len}", m, rows, row_len))


@register("qconv2d_grad_weight_update", split_aware=True)
def qconv2d_grad_weight_update(node: Node, ctx) -> str:
    """One output channel at a time: its gradient row into the scratch, then its update."""
    x, g, w = node.inputs[:3]
    m = node.inputs[4] if len(node.inputs) > 4 else None
    gw, up = split_grad_update(node.attrs)
    scratch = ctx.ptr(node.outputs[-1])
    rows = gw["weight_shape"][0]
    row_len = _numel(gw["weight_shape"][1:])
    lines = _grad_weight_params(ctx, "P", x, g, gw)
    lines += _update(ctx, w, up, scratch, m, rows, row_len,
                     before_row=[f"et_qconv_grad_weight_row(&P, {ctx.ptr(x)}, {ctx.ptr(g)}, k, P_sc[k], {scratch});"])
    return _block(lines)


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
    return _block([_pool_params("P", x.shape, y.shape, node.attrs),
                   f"et_qmax_pool2d(&P, {ctx.ptr(x)}, {ctx.ptr(y)});"])


@register("qmax_pool2d_grad")
def qmax_pool2d_grad(node: Node, ctx) -> str:
    g, x = node.inputs
    return _block([_pool_params("P", x.shape, g.shape, node.attrs),
                   f"et_qmax_pool2d_grad(&P, {ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.outputs[0])});"])


@register("qavg_pool2d")
def qavg_pool2d(node: Node, ctx) -> str:
    x, y = node.inputs[0], node.outputs[0]
    a = node.attrs
    return _block([_pool_params("P", x.shape, y.shape, a, fixed_avg_divisor(a)),
                   f"et_qavg_pool2d(&P, {ctx.ptr(x)}, {ctx.ptr(y)}, {_i(a['zero'])});"])


@register("qavg_pool2d_grad")
def qavg_pool2d_grad(node: Node, ctx) -> str:
    g, gx = node.inputs[0], node.outputs[0]
    a = node.attrs
    return _block([_pool_params("P", gx.shape, g.shape, a, fixed_avg_divisor(a)),
                   f"et_qavg_pool2d_grad(&P, {ctx.ptr(g)}, {ctx.ptr(gx)});"])


def _along(shape, dim: int) -> tuple[int, int]:
    """(outer, inner): elements before `dim` and from `dim` on, for a concatenation on dim."""
    return _numel(shape[:dim]), _numel(shape[dim:])


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
                     f"{_i(a['x_zero'][i])}, {_i(a['mult'][i])}, {_i(a['shift'][i])}, {_i(a['y_zero'])});")
        off += inner
    return _block(lines + ["}"])


@register("qcat_grad")
def qcat_grad(node: Node, ctx) -> str:
    g, gx = node.inputs[0], node.outputs[0]
    a = node.attrs
    dim = a["dim"] % g.type.rank
    outer, inner_g = _along(g.shape, dim)
    inner = _along(gx.shape, dim)[1]
    start = a["start"] * _numel(g.shape[dim + 1:])
    return _block([f"for (int32_t k = 0; k < {outer}; k++)",
                   f"    memcpy({ctx.ptr(gx)} + k * {inner}, {ctx.ptr(g)} + k * {inner_g} + {start}, "
                   f"{inner * DTYPE_BYTES[gx.dtype]});"])
