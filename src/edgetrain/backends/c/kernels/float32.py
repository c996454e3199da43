"""float32 kernels: each emitter returns a C block calling runtime/et_float.h (convolutions and
dense layers: et_float_gemm.h, which picks the host's BLAS or the portable kernels at build time)
with constant shapes, or (elementwise, reductions, shape ops) nested loops with constant bounds."""
from __future__ import annotations

import numpy as np

from math import prod

from ....ir import Node
from ....ops.bnfused import operands as bn_operands
from ....ops.loss import IGNORE_INDEX, ce_layout
from ..layout import CBackendError
from .cloops import PARALLEL_MIN_ELEMENTS, broadcast_strides, c_block, contiguous_strides, loop_nest
from .context import EmitContext
from .registry import register


def f32_only(node: Node, what=None):
    """Refuse (CBackendError) a node whose values (all of them, or `what`) are not all float32."""
    vals = list(node.inputs) + list(node.outputs) if what is None else what
    for v in vals:
        if v.dtype != "float32":
            raise CBackendError(f"C kernel for {node.op}: {v} is {v.dtype}, only float32 is supported")


# --- elementwise --------------------------------------------------------------------------
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
#: integer operands of add / sub / mul (index arithmetic: a flat row i0 * size + i1, positions
#: times a padding mask), computed in the unsigned type of their width so that an overflow
#: wraps around as in numpy instead of being undefined behaviour in C
_WRAPPING = {"int32": ("int32_t", "uint32_t"), "int64": ("int64_t", "uint64_t")}


def _binary_types(node: Node) -> tuple[str, str]:
    """(C element type, C type the arithmetic is done in) of a binary node's operands."""
    dtypes = {v.dtype for v in list(node.inputs) + list(node.outputs)}
    if len(dtypes) == 1 and node.op != "div" and next(iter(dtypes)) in _WRAPPING:
        return _WRAPPING[next(iter(dtypes))]
    f32_only(node)
    return "float", "float"


def _binary(op):
    def emit(node, ctx: EmitContext):
        t, arith = _binary_types(node)
        a, b = node.inputs
        y = node.out
        pa, pb, py = ctx.ptr(a), ctx.ptr(b), ctx.ptr(y)
        sts = [broadcast_strides(a.shape, y.shape), broadcast_strides(b.shape, y.shape), contiguous_strides(y.shape)]
        sym = _BINARY[op]

        def body(o):
            if arith == t:
                return f"Y[{o[2]}] = A[{o[0]}] {sym} B[{o[1]}];"
            return f"Y[{o[2]}] = ({t})(({arith})A[{o[0]}] {sym} ({arith})B[{o[1]}]);"

        return c_block(f"const {t} *A = {pa}; const {t} *B = {pb}; {t} *Y = {py};",
                       loop_nest(y.shape, sts, body, parallel=True))
    return emit


for _op in _BINARY:
    register(_op)(_binary(_op))

#: maximum / minimum: a wins where it compares so with b or is a NaN (a NaN in b: b wins, and is NaN)
_EXTREME_WINS = {"maximum": ">", "minimum": "<"}


def _maximum_minimum(node, ctx: EmitContext):
    t, _ = _binary_types(node)
    a, b = node.inputs
    y = node.out
    sts = [broadcast_strides(a.shape, y.shape), broadcast_strides(b.shape, y.shape), contiguous_strides(y.shape)]
    cmp = _EXTREME_WINS[node.op]

    def body(o):
        return f"{{ {t} a = A[{o[0]}], b = B[{o[1]}]; Y[{o[2]}] = (a {cmp} b || a != a) ? a : b; }}"

    return c_block(f"const {t} *A = {ctx.ptr(a)}; const {t} *B = {ctx.ptr(b)}; {t} *Y = {ctx.ptr(y)};",
                   loop_nest(y.shape, sts, body, parallel=True))


for _op in _EXTREME_WINS:
    register(_op)(_maximum_minimum)


def _unary(expr_fn):
    def emit(node, ctx):
        f32_only(node)
        ins = [ctx.ptr(v) for v in node.inputs]
        n = node.out.type.numel
        decl = " ".join(f"const float *X{k} = {p};" for k, p in enumerate(ins))
        return c_block(decl + f" float *Y = {ctx.ptr(node.out)};",
                       f"ET_PARALLEL_FOR_SIMD({n})" if n >= PARALLEL_MIN_ELEMENTS else "ET_SIMD",
                       f"for (int i = 0; i < {n}; ++i) {{ {expr_fn(node, ctx)} }}")
    return emit


def _clamp_bounds(node, ctx):
    lo, hi = node.attrs.get("min"), node.attrs.get("max")
    return lo, hi


def _clamp_expr(node, ctx):
    lo, hi = _clamp_bounds(node, ctx)
    e = "float v = X0[i];"
    if lo is not None:
        e += f" v = v < {ctx.c_float(lo)} ? {ctx.c_float(lo)} : v;"
    if hi is not None:
        e += f" v = v > {ctx.c_float(hi)} ? {ctx.c_float(hi)} : v;"
    return e + " Y[i] = v;"


def _clamp_grad_expr(node, ctx):
    lo, hi = _clamp_bounds(node, ctx)
    conds = ([f"X1[i] > {ctx.c_float(lo)}"] if lo is not None else []) + \
            ([f"X1[i] < {ctx.c_float(hi)}"] if hi is not None else [])
    return f"Y[i] = ({' && '.join(conds) or '1'}) ? X0[i] : 0.0f;"


register("relu")(_unary(lambda n, c: "float v = X0[i]; Y[i] = v > 0.0f ? v : 0.0f;"))
register("relu_grad")(_unary(lambda n, c: "Y[i] = X1[i] > 0.0f ? X0[i] : 0.0f;"))
register("clamp")(_unary(_clamp_expr))
register("clamp_grad")(_unary(_clamp_grad_expr))
register("neg")(_unary(lambda n, c: "Y[i] = -X0[i];"))


@register("const")
def _const(node, ctx):
    v = node.out
    if v.dtype == "float32":
        lit = ctx.c_float(node.attrs["value"])
    elif v.dtype == "float64":
        lit = ctx.c_double(node.attrs["value"])
    else:
        lit = ctx.c_int(node.attrs["value"])
    return f"{{ *{ctx.ptr(v)} = {lit}; }}"


@register("reshape")
@register("detach")
def _view(node, ctx):
    return ""  # a view: shares its input's storage


# --- broadcasts (the reductions: kernels/float32_reduce.py) ------------------------------------
@register("expand")
def _expand(node, ctx):
    x, y = node.inputs[0], node.out
    t = ctx.ctype(y)
    sts = [broadcast_strides(x.shape, y.shape), contiguous_strides(y.shape)]
    return c_block(f"const {t} *X = {ctx.ptr(x)}; {t} *Y = {ctx.ptr(y)};",
                   loop_nest(y.shape, sts, lambda o: f"Y[{o[1]}] = X[{o[0]}];", parallel=True))


@register("permute")
def _permute(node, ctx):
    x, y = node.inputs[0], node.out
    t = ctx.ctype(y)
    xs = contiguous_strides(x.shape)
    sts = [tuple(xs[p] for p in node.attrs["perm"]), contiguous_strides(y.shape)]
    return c_block(f"const {t} *X = {ctx.ptr(x)}; {t} *Y = {ctx.ptr(y)};",
                   loop_nest(y.shape, sts, lambda o: f"Y[{o[1]}] = X[{o[0]}];"))


def _outer_inner(shape, dim):
    return prod(shape[:dim]), shape[dim], prod(shape[dim + 1:])


def _index_array(name, idx):
    return f"static const uint16_t {name}[{len(idx)}] = {{{', '.join(map(str, idx))}}};"


# index_select / index_select_grad (any dtype): kernels/int8.py


# --- convolutions -------------------------------------------------------------------------
def _geo(a):
    s, p, d = tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"])
    return s, p, d, int(a["groups"])


def conv_shape_args(xs, ws, ys, attrs) -> str:
    """The shape and geometry arguments of et_float_gemm.h's convolutions (N, C, H, W, O, HO, WO,
    KH, KW, SH, SW, PH, PW, DH, DW, G) for input, weight and output shapes and the conv attributes."""
    s, p, d, g = _geo(attrs)
    n, c, h, w = xs
    o, _, kh, kw = ws
    return (f"{n}, {c}, {h}, {w}, {o}, {ys[2]}, {ys[3]}, {kh}, {kw}, {s[0]}, {s[1]}, {p[0]}, {p[1]}, "
            f"{d[0]}, {d[1]}, {g}")


def _conv_call(fn, a, b, c, shapes, attrs) -> str:
    """A call of et_float_gemm.h's `fn` (et_conv2d, et_conv2d_grad_input, et_conv2d_grad_weight):
    the host build's BLAS or the portable kernels, chosen there at build time."""
    return c_block(f"{fn}({a}, {b}, {c}, {conv_shape_args(*shapes, attrs)});")


@register("conv2d")
def _conv2d(node, ctx):
    f32_only(node)
    x, w = node.inputs[:2]
    b = ctx.ptr(node.inputs[2]) if len(node.inputs) > 2 else "(const float *)0"
    y = node.out
    return _conv_call("et_conv2d", ctx.ptr(x), ctx.ptr(w), f"{b}, {ctx.ptr(y)}", (x.shape, w.shape, y.shape),
                      node.attrs)


@register("conv2d_grad_input")
def _conv2d_grad_input(node, ctx):
    f32_only(node)
    gy, w = node.inputs
    gx = node.out
    return _conv_call("et_conv2d_grad_input", ctx.ptr(gy), ctx.ptr(w), ctx.ptr(gx), (gx.shape, w.shape, gy.shape),
                      node.attrs)


@register("conv2d_grad_weight")
def _conv2d_grad_weight(node, ctx):
    f32_only(node)
    x, gy = node.inputs
    gw = node.out
    return _conv_call("et_conv2d_grad_weight", ctx.ptr(x), ctx.ptr(gy), ctx.ptr(gw), (x.shape, gw.shape, gy.shape),
                      node.attrs)


# --- batch norm -----------------------------------------------------------------------------
def _nchw(shape):
    return shape[0], shape[1], prod(shape[2:])


@register("batch_norm")
def _batch_norm(node, ctx):
    f32_only(node)
    x, mean, var = node.inputs[:3]
    w = ctx.ptr(node.inputs[3]) if len(node.inputs) > 3 else "(const float *)0"
    b = ctx.ptr(node.inputs[4]) if len(node.inputs) > 4 else "(const float *)0"
    n, c, hw = _nchw(x.shape)
    return c_block(f"et_bn_fwd({ctx.ptr(x)}, {ctx.ptr(mean)}, {ctx.ptr(var)}, {w}, {b}, {ctx.ptr(node.out)}, "
                   f"{n}, {c}, {hw}, {ctx.c_float(node.attrs['eps'])});")


@register("batch_norm_act")
def _batch_norm_act(node, ctx):
    """One et_bn_act_fwd call: batch norm [+ residual] and ReLU / clamp in one pass (ops/bnact.py)."""
    f32_only(node)
    a, cnull = node.attrs, "(const float *)0"
    x, mean, var = node.inputs[:3]
    w, b = (ctx.ptr(v) for v in node.inputs[3:5]) if a["affine"] else (cnull, cnull)
    r = ctx.ptr(node.inputs[-1]) if a["residual"] else cnull
    kind, lo, hi = 0, "0.0f", "0.0f"
    if a["act"] == "clamp":
        kind = 1
        lo = ctx.c_float(a["min"] if a.get("min") is not None else float("-inf"))
        hi = ctx.c_float(a["max"] if a.get("max") is not None else float("inf"))
    n, c, hw = _nchw(x.shape)
    return c_block(f"et_bn_act_fwd({ctx.ptr(x)}, {ctx.ptr(mean)}, {ctx.ptr(var)}, {w}, {b}, {r}, "
                   f"{ctx.ptr(node.out)}, {n}, {c}, {hw}, {ctx.c_float(a['eps'])}, {kind}, {lo}, {hi});")


@register("batch_norm_grad_input")
def _batch_norm_grad_input(node, ctx):
    f32_only(node)
    g, var = node.inputs[:2]
    w = ctx.ptr(node.inputs[2]) if len(node.inputs) > 2 else "(const float *)0"
    n, c, hw = _nchw(g.shape)
    return c_block(f"et_bn_grad_input({ctx.ptr(g)}, {ctx.ptr(var)}, {w}, {ctx.ptr(node.out)}, {n}, {c}, {hw}, "
                   f"{ctx.c_float(node.attrs['eps'])});")


@register("batch_norm_grad_weight")
def _batch_norm_grad_weight(node, ctx):
    f32_only(node)
    g, x, mean, var = node.inputs
    n, c, hw = _nchw(g.shape)
    return c_block(f"et_bn_grad_weight({ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(mean)}, {ctx.ptr(var)}, "
                   f"{ctx.ptr(node.out)}, {n}, {c}, {hw}, {ctx.c_float(node.attrs['eps'])});")


# --- dense ----------------------------------------------------------------------------------
@register("linear")
def _linear(node, ctx):
    f32_only(node)
    x, w = node.inputs[:2]
    b = ctx.ptr(node.inputs[2]) if len(node.inputs) > 2 else "(const float *)0"
    o, k = w.shape
    n = x.type.numel // k
    return c_block(f"et_dense({ctx.ptr(x)}, {ctx.ptr(w)}, {b}, {ctx.ptr(node.out)}, {n}, {k}, {o});")


@register("linear_grad_weight")
def _linear_grad_weight(node, ctx):
    f32_only(node)
    x, gy = node.inputs
    k, o = x.shape[-1], gy.shape[-1]
    n = x.type.numel // k
    return c_block(f"et_dense_grad_weight({ctx.ptr(x)}, {ctx.ptr(gy)}, {ctx.ptr(node.out)}, {n}, {k}, {o});")


@register("matmul")
def _matmul(node, ctx):
    f32_only(node)
    a, b = node.inputs
    y = node.out
    m, k = a.shape[-2:]
    n = b.shape[-1]
    ba, bb, by = a.shape[:-2], b.shape[:-2], y.shape[:-2]
    nb = prod(by)
    if (ba == by or not ba) and (bb == by or not bb):  # each operand batched alike or shared
        sa, sb = (m * k if ba else 0), (k * n if bb else 0)
        return c_block(f"for (int i = 0; i < {nb}; ++i)",
                       f"  et_dense_matmul({ctx.ptr(a)} + i * {sa}, {ctx.ptr(b)} + i * {sb}, {ctx.ptr(y)} + i * {m * n}, "
                       f"{m}, {k}, {n});")
    # broadcast batch dims: each output matrix's operand offsets, from numpy's broadcasting rule
    offs = [np.broadcast_to(np.arange(prod(bx)).reshape((1,) * (len(by) - len(bx)) + tuple(bx)), by).ravel() * size
            for bx, size in ((ba, m * k), (bb, k * n))]
    tables = [f"static const int32_t {nm}[{nb}] = {{{', '.join(map(str, o))}}};" for nm, o in zip(("AO", "BO"), offs)]
    return c_block(*tables, f"for (int i = 0; i < {nb}; ++i)",
                   f"  et_dense_matmul({ctx.ptr(a)} + AO[i], {ctx.ptr(b)} + BO[i], {ctx.ptr(y)} + i * {m * n}, "
                   f"{m}, {k}, {n});")


# --- losses (runtime/et_float.h; ops/loss.py computes the same numbers) ----------------------
def _labels(node, v):
    if v.dtype != "int64":
        raise CBackendError(f"C kernel for {node.op}: labels must be int64, got {v.dtype}")


def _ce_args(node, logits, labels) -> str:
    """A, C, S (the logits seen as (A, C, S)) and the ignored label, for et_cross_entropy*."""
    _labels(node, labels)
    a, c, s = ce_layout(logits.shape, node.attrs.get("class_dim", 1))
    return f"{a}, {c}, {s}, (int64_t){int(node.attrs.get('ignore_index', IGNORE_INDEX))}"


@register("cross_entropy")
def _cross_entropy(node, ctx):
    logits, labels = node.inputs
    f32_only(node, [logits, node.out])
    return (f"{{ *{ctx.ptr(node.out)} = et_cross_entropy({ctx.ptr(logits)}, {ctx.ptr(labels)}, "
            f"{_ce_args(node, logits, labels)}); }}")


@register("cross_entropy_grad")
def _cross_entropy_grad(node, ctx):
    g, logits, labels = node.inputs
    f32_only(node, [g, logits, node.out])
    return (f"{{ et_cross_entropy_grad(*{ctx.ptr(g)}, {ctx.ptr(logits)}, {ctx.ptr(labels)}, {ctx.ptr(node.out)}, "
            f"{_ce_args(node, logits, labels)}); }}")


def _mean_loss(fn: str):
    """A loss over targets shaped like the output: `fn`(pred, target, n) of et_float.h."""
    def emit(node, ctx):
        f32_only(node)
        a, b = node.inputs
        return f"{{ *{ctx.ptr(node.out)} = {fn}({ctx.ptr(a)}, {ctx.ptr(b)}, {a.type.numel}); }}"
    return emit


def _mean_loss_grad(fn: str):
    """Its gradient: `fn`(g, pred, target, out, n) of et_float.h."""
    def emit(node, ctx):
        f32_only(node)
        g, a, b = node.inputs
        return (f"{{ {fn}(*{ctx.ptr(g)}, {ctx.ptr(a)}, {ctx.ptr(b)}, {ctx.ptr(node.out)}, "
                f"{a.type.numel}); }}")
    return emit


register("mse")(_mean_loss("et_mse"))
register("l1")(_mean_loss("et_l1"))
register("l1_grad")(_mean_loss_grad("et_l1_grad"))
register("bce_with_logits")(_mean_loss("et_bce_with_logits"))
register("bce_with_logits_grad")(_mean_loss_grad("et_bce_with_logits_grad"))


@register("mse_grad")
def _mse_grad(node, ctx):
    f32_only(node)
    g, a, b = node.inputs
    n = a.type.numel
    return c_block(f"const float *A = {ctx.ptr(a)}, *B = {ctx.ptr(b)}; float *Y = {ctx.ptr(node.out)};",
                   f"const float k = 2.0f * *{ctx.ptr(g)} / {n}.0f;",
                   f"for (int i = 0; i < {n}; ++i) Y[i] = (A[i] - B[i]) * k;")


# --- optimizer ------------------------------------------------------------------------------
@register("sgd_update", split_aware=True)
def _sgd_update(node, ctx):
    f32_only(node)
    w, g = node.inputs[:2]
    mom = node.inputs[2] if len(node.inputs) > 2 else None
    a = node.attrs
    lr, wd, mu = ctx.c_float(a["lr"]), a.get("weight_decay") or 0.0, a.get("momentum") or 0.0
    st = ctx.state_of(w)
    n = g.type.numel
    body = ["float d = G[i];"]
    if wd:
        body.append(f"d = d + {ctx.c_float(wd)} * W[j];")
    if mom is not None:
        body.append(f"d = {ctx.c_float(mu)} * M[i] + d; M[i] = d;")
    body.append(f"W[j] = W[j] - {lr} * d;")
    decl = f"const float *G = {ctx.ptr(g)};" + (f" float *M = {ctx.ptr(mom)};" if mom is not None else "")
    if a.get("index") is None or (st is not None and st.kind == "split"):
        wp = st.sram if st is not None else ctx.ptr(w)
        par = [f"ET_PARALLEL_FOR({n})"] if n >= PARALLEL_MIN_ELEMENTS else []  # each element once: any thread
        return c_block(decl + f" float *W = (float *){wp};", *par,
                       f"for (int i = 0; i < {n}; ++i) {{ const int j = i; {' '.join(body)} }}")
    # a channel subset of a weight kept whole (not split): indexed update
    outer, d, inner = _outer_inner(w.shape, a["dim"])
    idx = tuple(a["index"])
    return c_block(_index_array("IDX", idx), decl + f" float *W = {ctx.ptr(w)};",
                   f"for (int o = 0; o < {outer}; ++o) for (int k = 0; k < {len(idx)}; ++k)"
                   f" for (int t = 0; t < {inner}; ++t) {{",
                   f"  const int i = (o * {len(idx)} + k) * {inner} + t, j = (o * {d} + IDX[k]) * {inner} + t;",
                   "  " + " ".join(body) + " }")


# --- fused batch-norm backward (ops/bnfused.py, passes/fuse_batchnorm_backward.py) ------------
#: et_bn_backward_fused's mask argument: 0 none, 1 lo < saved < hi (clamp_grad), 2 saved > 0 (relu_grad)
BN_MASK_KIND = {"": 0, "clamp_grad": 1, "relu_grad": 2}


@register("batch_norm_backward_fused")
def _batch_norm_backward_fused(node, ctx):
    """One et_bn_backward_fused call: mask, weight, bias and input gradients in one pass per channel."""
    f32_only(node)
    a = node.attrs
    o = bn_operands(node.inputs, a)
    null, cnull = "(float *)0", "(const float *)0"
    kind, lo, hi = BN_MASK_KIND[a["mask"]], "0.0f", "0.0f"
    if a["mask"] == "clamp_grad":
        lo = ctx.c_float(a["min"] if a.get("min") is not None else float("-inf"))
        hi = ctx.c_float(a["max"] if a.get("max") is not None else float("inf"))
    xc = ctx.ptr(o.saved) if o.saved is not None else cnull
    x, mean = (ctx.ptr(o.x), ctx.ptr(o.mean)) if o.x is not None else (cnull, cnull)
    w = ctx.ptr(o.w) if o.w is not None else cnull
    outs = list(node.outputs[1:])
    gw = ctx.ptr(outs.pop(0)) if a["grad_weight"] else null
    gb = ctx.ptr(outs.pop(0)) if a["grad_bias"] else null
    n, c, hw = _nchw(o.g.shape)
    return c_block(f"et_bn_backward_fused({ctx.ptr(o.g)}, {xc}, {kind}, {lo}, {hi}, {x}, {mean}, "
                   f"{ctx.ptr(o.var)}, {w}, {gw}, {gb}, {ctx.ptr(node.outputs[0])}, {n}, {c}, {hw}, "
                   f"{ctx.c_float(a['eps'])});")
