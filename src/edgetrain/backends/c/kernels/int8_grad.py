"""C kernels of the int8 program's backward and updates (runtime/et_int8_grad.h): the float32
input, weight and bias gradients of qconv2d in the summation order the references fix
(ops/qconv.py), and the integer SGD updates with the counter hash of ops/qoptim.py, alone or
fused after the weight gradient one output channel at a time (qconv2d_grad_weight_update).
Split from kernels/int8.py (the integer forward); registered when that module is imported.
"""
from __future__ import annotations

from ....ir import Node, Value
from ....ops.qgradupdate import split_attrs as split_grad_update
from ....ops.qconv import out_scales
from ....ops.qoptim import row_scales
from ..layout import C_TYPES, CBackendError
from .int8_params import block, c_int, c_ints, conv_params, numel, weight_arg
from .int8_scales import forward_layers, fscale_decls, layer_bases
from .registry import register


# --- backward -------------------------------------------------------------------------------
#: the attributes that fix a convolution's geometry
GEOMETRY = ("stride", "padding", "dilation", "groups")


def _layer_params(ctx, name: str, x_shape, w_shape, y_shape, a, same) -> list[str]:
    """conv_params of a backward node (attributes `a`) with the attributes of its forward layer
    (the first of the graph with its geometry for which same(layer) holds), so that its
    et_qconv_p is the forward's own, kept once by the constant pool; the backward kernels read
    its geometry and x_zero only. Without such a layer, of `a`."""
    for layer in forward_layers(ctx.gl.graph):
        if all(_norm(layer.get(k)) == _norm(a.get(k)) for k in GEOMETRY) and same(layer):
            return conv_params(ctx, name, x_shape, w_shape, y_shape, layer)
    return conv_params(ctx, name, x_shape, w_shape, y_shape, a)


def _norm(v):
    return tuple(int(x) for x in v) if isinstance(v, (tuple, list)) else v


def _same_scales(a):
    """same() of an input gradient: the layer of these weight scales."""
    return lambda layer: tuple(layer["w_scales"]) == tuple(a["w_scales"])


@register("qconv2d_grad_input", split_aware=True)
def qconv2d_grad_input(node: Node, ctx) -> str:
    g, w = node.inputs
    a = node.attrs
    decls, form, warg = weight_arg(ctx, w, "W")
    lines = (_layer_params(ctx, "P", a["input_shape"], w.shape, g.shape, a, _same_scales(a)) + decls
             + fscale_decls(ctx, "WS", a["w_scales"], layer_bases(ctx.gl.graph))
             + [f"et_qconv_grad_input_fs{form}(&P, {ctx.ptr(g)}, {warg}, &WS, {ctx.ptr(node.outputs[0])});"])
    return block(lines)


@register("qconv2d_dw_grad_input", split_aware=True)
def qconv2d_dw_grad_input(node: Node, ctx) -> str:
    g, w = node.inputs
    gx, plane = node.outputs
    a = node.attrs
    decls, form, warg = weight_arg(ctx, w, "W")
    lines = (_layer_params(ctx, "P", a["input_shape"], w.shape, g.shape, a, _same_scales(a)) + decls
             + fscale_decls(ctx, "WS", a["w_scales"], layer_bases(ctx.gl.graph))
             + [f"et_qconv_dw_grad_input_fs{form}(&P, {ctx.ptr(g)}, {warg}, &WS, {ctx.ptr(gx)}, {ctx.ptr(plane)});"])
    return block(lines)


def _grad_weight_params(ctx, name, x, g, a) -> list[str]:
    """The layer's et_qconv_p `name` (its forward's: the same x_zero and gradient scales) and
    its gradient scales `name`_sc (an et_fscale)."""
    def same(layer):
        return (int(layer.get("x_zero", 0)) == int(a["x_zero"])
                and tuple(float(v) for v in out_scales(layer)) == tuple(a["scales"]))
    return (_layer_params(ctx, name, x.shape, a["weight_shape"], g.shape, a, same)
            + fscale_decls(ctx, name + "_sc", a["scales"], layer_bases(ctx.gl.graph)))


@register("qconv2d_grad_weight")
def qconv2d_grad_weight(node: Node, ctx) -> str:
    x, g = node.inputs
    a = node.attrs
    o = a["weight_shape"][0]
    row = numel(a["weight_shape"][1:])
    lines = _grad_weight_params(ctx, "P", x, g, a) + [
        "ET_GW_ROWS_PREPARE(P.x_zero);",
        f"ET_PARALLEL_FOR({row * numel(g.shape)})  /* the host's threads: a row each */",
        f"for (int32_t o = 0; o < {o}; o++)",
        f"    et_qconv_grad_weight_row(&P, {ctx.ptr(x)}, {ctx.ptr(g)}, o, &P_sc, "
        f"{ctx.ptr(node.outputs[0])} + o * {row});"]
    return block(lines)


@register("qconv2d_grad_bias")
def qconv2d_grad_bias(node: Node, ctx) -> str:
    g = node.inputs[0]
    n, o = g.shape[:2]
    return block(fscale_decls(ctx, "SC", node.attrs["scales"], layer_bases(ctx.gl.graph))
                 + [f"et_qconv_grad_bias({ctx.ptr(g)}, {ctx.ptr(node.outputs[0])}, {n}, {o}, "
                    f"{numel(g.shape[2:])}, &SC);"])


#: the largest gradient row a thread copies onto its stack (runtime/et_common.h's ET_THREAD_ROW): a layer with longer
#: rows updates them one after another on the host too
THREAD_ROW_BYTES = 64 * 1024


# --- integer SGD ------------------------------------------------------------------------------
#: the C kernels of the common update rows (no momentum, no weight decay, no channel selection),
#: each for the integer bounds its loop has as constants (passes/updates.INT_RANGES)
PLAIN_ROWS = {"int8": ("et_qsgd_rows_i8", (-127, 127)), "int32": ("et_qsgd_rows_i32", (-(2 ** 24), 2 ** 24))}


def _update(ctx, w: Value, a, grad: str, m: Value | None, rows, row_len: int, before_row=(),
            parallel: str = "", first="0") -> list[str]:
    """The C statements updating `w` row by row (`k` the row, from `first` up to `rows`) from
    the gradient rows at `grad` (row `first` there), as qsgd_update with attributes `a`; with
    `before_row` (the statements computing row k's gradient into `grad`) one row at `grad`
    each, else all rows one after another. `parallel`: a line put before the row loop (with
    before_row: ET_PARALLEL_FOR, the rows on the host's threads)."""
    grad_row = grad if before_row else f"{grad} + (k - {first}) * {row_len}"
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
    inner = numel(w.shape[2:]) if w.type.rank > 2 else 1
    # the gradient factors of every row of w (ops/qoptim.row_scales), read at the row's channel
    lines = fscale_decls(ctx, "SC", row_scales({**a, "index": None}), layer_bases(ctx.gl.graph))
    lines += [f"static const et_qsgd_p Q = {{{ctx.c_float(a['lr'])}, {ctx.c_float(a.get('momentum', 0.0))}, "
              f"{ctx.c_float(a.get('weight_decay', 0.0))}, {c_int(a['qmin'])}, {c_int(a['qmax'])}, "
              f"{int(a['seed']) & 0xFFFFFFFF}u}};",
              f"const uint32_t key = et_hash_key(Q.seed, {int(a['param_id']) & 0xFFFFFFFF}u, {ctx.step});"]
    idx, channel = "0", "k"
    if index is None:
        flat0 = f"(uint32_t)(k * {row_len})"
    elif dim == 0:
        lines.append(c_ints("uint16_t", "IDX", index))
        flat0 = f"(uint32_t)IDX[k] * {row_len}u"
        channel = "IDX[k]"
    elif dim == 1:
        lines.append(c_ints("uint16_t", "IDX", index))
        flat0 = f"(uint32_t)(k * {w.shape[1] * inner})"
        idx = "IDX"
    else:
        raise CBackendError(f"qsgd_update: channel selection on dim {dim} is not supported")
    loop = [*([parallel] if parallel else []), f"for (int32_t k = {first}; k < {rows}; k++) {{",
            *("    " + s for s in before_row)]
    plain = PLAIN_ROWS.get(w.dtype)
    if (m is None and not a.get("weight_decay", 0.0) and plain is not None and (a["qmin"], a["qmax"]) == plain[1]
            and (index is None or dim == 0 and split)):  # row k stored at w + k * row_len
        def rows_at(g: str, k0, n: int) -> str:
            return (f"{plain[0]}(&Q, key, ({C_TYPES[w.dtype]} *){wq}, {g}, &SC, {'IDX' if split else '0'}, {k0}, "
                    f"{n}, {row_len});")
        if not before_row:  # every row in one call
            return lines + [rows_at(grad, first, rows if first == "0" else f"{rows} - {first}")]
        return lines + loop + ["    " + rows_at(grad_row, "k", 1), "}"]
    full = 0 if split or index is None else 1
    mptr = f"{ctx.ptr(m)} + k * {row_len}" if m is not None else "0"
    return lines + loop + [f"    et_qsgd_row(&Q, key, (void *){wq}, {int(w.dtype == 'int8')}, {full}, k * {row_len}, "
                           f"{grad_row}, {mptr}, &SC, {channel}, {row_len}, {flat0}, {idx}, {inner});", "}"]


@register("qsgd_update", split_aware=True)
def qsgd_update(node: Node, ctx) -> str:
    w, g = node.inputs[:2]
    m = node.inputs[3] if len(node.inputs) > 3 else None
    rows = g.shape[0]
    row_len = g.type.numel // max(rows, 1)
    return block(_update(ctx, w, node.attrs, ctx.ptr(g), m, rows, row_len))


@register("qconv2d_grad_weight_update", split_aware=True)
def qconv2d_grad_weight_update(node: Node, ctx) -> str:
    """One output channel at a time: its gradient row into the scratch, then its update."""
    x, g, w = node.inputs[:3]
    m = node.inputs[4] if len(node.inputs) > 4 else None
    gw, up = split_grad_update(node.attrs)
    scratch = ctx.ptr(node.outputs[-1])
    rows = gw["weight_shape"][0]
    row_len = numel(gw["weight_shape"][1:])
    lines = _grad_weight_params(ctx, "P", x, g, gw)
    held = node.outputs[-1].shape[0]  # the gradient rows the scratch holds (passes/widen_scratch.py)
    if held > 1:  # a block of rows at a time (a dense layer's rows share their input's conversion)
        threads = held * row_len * 4 <= THREAD_ROW_BYTES  # each thread's block a copy on its stack
        lines += ["ET_GW_ROWS_PREPARE(P.x_zero);",
                  (f"ET_PARALLEL_FOR({row_len * numel(g.shape) * held})  /* the host's threads: a block each */"
                   if threads else "/* one block after another: a block is too long for a thread's stack */"),
                  f"for (int32_t k0 = 0; k0 < {rows}; k0 += {held}) {{",
                  f"    const int32_t k1 = k0 + {held} < {rows} ? k0 + {held} : {rows};",
                  (f"    ET_THREAD_ROW(float, block_k, {held * row_len}, {scratch})" if threads
                   else f"    float *block_k = {scratch};"),
                  f"    et_qconv_grad_weight_rows(&P, {ctx.ptr(x)}, {ctx.ptr(g)}, k0, k1 - k0, &P_sc, block_k);",
                  *("    " + line for line in _update(ctx, w, up, "block_k", m, "k1", row_len, first="k0")),
                  "}"]
        return block(lines)
    if row_len * 4 <= THREAD_ROW_BYTES:  # the rows on the host's threads, each into its own copy of the row
        lines += ["ET_GW_ROWS_PREPARE(P.x_zero);"]
        lines += _update(ctx, w, up, "row_k", m, rows, row_len,
                         before_row=[f"ET_THREAD_ROW(float, row_k, {row_len}, {scratch})",
                                     f"et_qconv_grad_weight_row(&P, {ctx.ptr(x)}, {ctx.ptr(g)}, k, &P_sc, row_k);"],
                         parallel=f"ET_PARALLEL_FOR({row_len * numel(g.shape)})  /* the host's threads: a row each */")
    else:
        lines += _update(ctx, w, up, scratch, m, rows, row_len,
                         before_row=[f"et_qconv_grad_weight_row(&P, {ctx.ptr(x)}, {ctx.ptr(g)}, k, &P_sc, "
                                     f"{scratch});"])
    return block(lines)
