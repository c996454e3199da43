"""Float kernels of the neural-network ops et_float.h lacks (runtime/et_float_nn.h): activations
and their gradients, exp/log/sqrt/rsqrt/pow, cast, slice/cat, softmax and log-softmax, layer
norm, 2-D pooling, embedding. Each works on float32 (C float) and float64 (C double) values;
index operands are int32 or int64. Elementwise ops and data movement are emitted as loops with
constant bounds; the rest call the _f / _d instances of et_float_nn.h."""
from __future__ import annotations

from math import prod

import numpy as np

from ....ir import Node
from ..layout import C_TYPES, CBackendError
from ....ops.pool import fixed_avg_divisor
from .context import EmitContext
from .registry import register

FLOATS = ("float32", "float64")
INDEX = ("int32", "int64")
#: the suffix of et_float_nn.h's instance for each float dtype
_SUFFIX = {"float32": "f", "float64": "d"}


def float_dtype(node: Node, vals=None) -> str:
    """The one float dtype of `vals` (default: every operand and result of the node)."""
    vals = list(node.inputs) + list(node.outputs) if vals is None else vals
    dts = sorted({v.dtype for v in vals})
    if len(dts) != 1 or dts[0] not in FLOATS:
        raise CBackendError(f"C kernel for {node.op}: operands {[str(v.type) for v in vals]} must all be one of "
                            f"{FLOATS}")
    return dts[0]


def _same_shapes(node: Node, vals):
    if len({tuple(v.shape) for v in vals}) != 1:
        raise CBackendError(f"C kernel for {node.op}: operands {[str(v.type) for v in vals]} must have one shape")


def _block(*lines) -> str:
    return "{\n" + "\n".join(lines) + "\n}"


def instance_name(name: str, dtype: str) -> str:
    return f"{name}_{_SUFFIX[dtype]}"


def _null(dtype: str) -> str:
    return f"(const {C_TYPES[dtype]} *)0"


# --- elementwise: y[i] = f(x[i]) in double, rounded to the value's type --------------------------
def elementwise_kernel(nargs: int, expr_fn):
    """An op of `nargs` same-shape float operands X0.. and one result Y; `expr_fn(node, ctx, t)`
    is the C expression of Y[i] from the doubles x0, x1, ... (t: the C element type). Y may be
    written over an input (the op's `inplace`): each element is read before it is written."""
    def emit(node, ctx: EmitContext):
        dt = float_dtype(node)
        _same_shapes(node, list(node.inputs) + list(node.outputs))
        if len(node.inputs) != nargs:
            raise CBackendError(f"C kernel for {node.op}: expected {nargs} operands, got {len(node.inputs)}")
        t = C_TYPES[dt]
        decl = " ".join(f"const {t} *X{k} = {ctx.ptr(v)};" for k, v in enumerate(node.inputs))
        reads = " ".join(f"const double x{k} = X{k}[i];" for k in range(nargs))
        expr = expr_fn(node, ctx, t)
        return _block(f"{decl} {t} *Y = {ctx.ptr(node.out)};",
                      f"for (long i = 0; i < {node.out.type.numel}; ++i) {{ {reads} Y[i] = ({t})({expr}); }}")
    return emit


def _gelu_mode(node) -> int:
    mode = node.attrs.get("approximate", "none")
    if mode not in ("none", "tanh"):
        raise CBackendError(f"C kernel for {node.op}: approximate={mode!r} (none or tanh)")
    return int(mode == "tanh")


def _sqrt_expr(node, ctx, t):
    return "ET_SQRTF((float)x0)" if t == "float" else "ET_SQRT(x0)"


def _rsqrt_expr(node, ctx, t):
    # as the reference: 1 / sqrt(x), both rounded to the value's type
    return "1.0f / ET_SQRTF((float)x0)" if t == "float" else "1.0 / ET_SQRT(x0)"


register("exp")(elementwise_kernel(1, lambda n, c, t: "et_exp(x0)"))
register("log")(elementwise_kernel(1, lambda n, c, t: "et_log(x0)"))
register("sqrt")(elementwise_kernel(1, _sqrt_expr))
register("rsqrt")(elementwise_kernel(1, _rsqrt_expr))
register("pow")(elementwise_kernel(1, lambda n, c, t: f"et_pow(x0, {c.c_double(n.attrs['exponent'])})"))
register("tanh")(elementwise_kernel(1, lambda n, c, t: "et_tanh(x0)"))
register("sigmoid")(elementwise_kernel(1, lambda n, c, t: "et_sigmoid(x0)"))
register("gelu")(elementwise_kernel(1, lambda n, c, t: f"et_gelu(x0, {_gelu_mode(n)})"))
# pointwise gradients g * f'(s), s the saved output (sigmoid, tanh) or input (gelu)
register("sigmoid_grad")(elementwise_kernel(2, lambda n, c, t: "x0 * (x1 * (1.0 - x1))"))
register("tanh_grad")(elementwise_kernel(2, lambda n, c, t: "x0 * (1.0 - x1 * x1)"))
register("gelu_grad")(elementwise_kernel(2, lambda n, c, t: f"x0 * et_gelu_grad(x1, {_gelu_mode(n)})"))


@register("cast")
def _cast(node, ctx):
    """Any dtype to any dtype of C_TYPES (C conversion; to bool: x != 0, as numpy)."""
    x, y = node.inputs[0], node.out
    for v in (x, y):
        if v.dtype not in C_TYPES:
            raise CBackendError(f"C kernel for cast: {v} has no C type")
    tx, ty = C_TYPES[x.dtype], C_TYPES[y.dtype]
    val = "(X[i] != 0)" if y.dtype == "bool" else f"({ty})X[i]"
    return _block(f"const {tx} *X = {ctx.ptr(x)}; {ty} *Y = {ctx.ptr(y)};",
                  f"for (long i = 0; i < {y.type.numel}; ++i) Y[i] = {val};")


# --- data movement: slice, its gradient, cat (any dtype) --------------------------------------
def _outer_inner(shape, dim):
    return prod(shape[:dim]), shape[dim], prod(shape[dim + 1:])


def _slice_range(shape, a) -> tuple[int, range]:
    dim = a["dim"] % len(shape)
    return dim, range(*slice(a["start"], a["end"], a["step"]).indices(shape[dim]))


def _bytes(v) -> int:
    return int(np.dtype(v.dtype).itemsize)


@register("slice")
def _slice(node, ctx):
    x, y = node.inputs[0], node.out
    dim, r = _slice_range(x.shape, node.attrs)
    outer, d, inner = _outer_inner(x.shape, dim)
    n, sz = len(r), _bytes(x)
    if n == 0 or outer == 0 or inner == 0:
        return ""
    return _block(f"const uint8_t *X = (const uint8_t *){ctx.ptr(x)}; uint8_t *Y = (uint8_t *){ctx.ptr(y)};",
                  f"for (long o = 0; o < {outer}; ++o)",
                  f"  for (long k = 0; k < {n}; ++k)",
                  f"    memcpy(Y + (o * {n} + k) * {inner * sz}, X + (o * {d} + {r.start} + k * {r.step}) * "
                  f"{inner * sz}, {inner * sz});")


@register("slice_grad")
def _slice_grad(node, ctx):
    """Zeros, then the gradient written into the sliced positions."""
    g, y = node.inputs[0], node.out
    dim, r = _slice_range(y.shape, node.attrs)
    outer, d, inner = _outer_inner(y.shape, dim)
    n, sz = len(r), _bytes(y)
    lines = [f"const uint8_t *G = (const uint8_t *){ctx.ptr(g)}; uint8_t *Y = (uint8_t *){ctx.ptr(y)};",
             f"memset(Y, 0, {y.type.nbytes});"]
    if n and outer and inner:
        lines += [f"for (long o = 0; o < {outer}; ++o)",
                  f"  for (long k = 0; k < {n}; ++k)",
                  f"    memcpy(Y + (o * {d} + {r.start} + k * {r.step}) * {inner * sz}, "
                  f"G + (o * {n} + k) * {inner * sz}, {inner * sz});"]
    return _block(*lines)


@register("cat")
def _cat(node, ctx):
    y = node.out
    dim = node.attrs["dim"] % max(len(y.shape), 1)
    outer, d, inner = _outer_inner(y.shape, dim)
    sz = _bytes(y)
    lines = [f"uint8_t *Y = (uint8_t *){ctx.ptr(y)};"]
    off = 0
    for v in node.inputs:
        if v.dtype != y.dtype:
            raise CBackendError(f"C kernel for cat: operand {v} is not {y.dtype}")
        dv = v.shape[dim]
        if dv and outer and inner:
            lines.append(f"for (long o = 0; o < {outer}; ++o) memcpy(Y + (o * {d} + {off}) * {inner * sz}, "
                         f"(const uint8_t *){ctx.ptr(v)} + o * {dv * inner * sz}, {dv * inner * sz});")
        off += dv
    return _block(*lines)


# --- softmax, log-softmax --------------------------------------------------------------------------
def _softmax_geometry(node, shape):
    rank = len(shape)
    dim = node.attrs["dim"] % max(rank, 1)
    return _outer_inner(shape, dim) if rank else (1, 1, 1)


def _softmax(logsm: int):
    def emit(node, ctx):
        dt = float_dtype(node)
        x, y = node.inputs[0], node.out
        outer, d, inner = _softmax_geometry(node, x.shape)
        return f"{{ {instance_name('et_softmax', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {d}, {inner}, {logsm}); }}"
    return emit


def _softmax_grad(logsm: int):
    def emit(node, ctx):
        dt = float_dtype(node)
        g, y = node.inputs
        _same_shapes(node, [g, y, node.out])
        outer, d, inner = _softmax_geometry(node, g.shape)
        return (f"{{ {instance_name('et_softmax_grad', dt)}({ctx.ptr(g)}, {ctx.ptr(y)}, {ctx.ptr(node.out)}, {outer}, {d}, "
                f"{inner}, {logsm}); }}")
    return emit


register("softmax")(_softmax(0))
register("log_softmax")(_softmax(1))
register("softmax_grad")(_softmax_grad(0))
register("log_softmax_grad")(_softmax_grad(1))


# --- layer norm ----------------------------------------------------------------------------------
def _rows(node, x):
    n = prod(node.attrs["normalized_shape"])
    return (x.type.numel // n if n else 0), n


@register("layer_norm")
def _layer_norm(node, ctx):
    dt = float_dtype(node)
    x = node.inputs[0]
    w = ctx.ptr(node.inputs[1]) if len(node.inputs) > 1 else _null(dt)
    b = ctx.ptr(node.inputs[2]) if len(node.inputs) > 2 else _null(dt)
    rows, n = _rows(node, x)
    return (f"{{ {instance_name('et_layer_norm', dt)}({ctx.ptr(x)}, {w}, {b}, {ctx.ptr(node.out)}, {rows}, {n}, "
            f"{ctx.c_double(node.attrs['eps'])}); }}")


@register("layer_norm_grad_input")
def _layer_norm_grad_input(node, ctx):
    dt = float_dtype(node)
    g, x = node.inputs[:2]
    w = ctx.ptr(node.inputs[2]) if len(node.inputs) > 2 else _null(dt)
    rows, n = _rows(node, x)
    return (f"{{ {instance_name('et_layer_norm_grad_input', dt)}({ctx.ptr(g)}, {ctx.ptr(x)}, {w}, {ctx.ptr(node.out)}, "
            f"{rows}, {n}, {ctx.c_double(node.attrs['eps'])}); }}")


@register("layer_norm_grad_weight")
def _layer_norm_grad_weight(node, ctx):
    dt = float_dtype(node)
    g, x = node.inputs
    rows, n = _rows(node, x)
    return (f"{{ {instance_name('et_layer_norm_grad_weight', dt)}({ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.out)}, "
            f"{rows}, {n}, {ctx.c_double(node.attrs['eps'])}); }}")


# --- 2-D pooling -------------------------------------------------------------------------------------
def _pool_args(x_shape, y_shape, a) -> str:
    n, c, h, w = x_shape
    k, s, p = tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"])
    d = tuple(a.get("dilation", (1, 1)))
    return (f"{n * c}, {h}, {w}, {y_shape[2]}, {y_shape[3]}, {k[0]}, {k[1]}, {s[0]}, {s[1]}, {p[0]}, {p[1]}, "
            f"{d[0]}, {d[1]}")


def _rank4(node, v):
    if len(v.shape) != 4:
        raise CBackendError(f"C kernel for {node.op}: expected a 4-D operand, got {v}")


@register("max_pool2d")
def _max_pool2d(node, ctx):
    dt = float_dtype(node)
    x, y = node.inputs[0], node.out
    _rank4(node, x)
    return f"{{ {instance_name('et_max_pool2d', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, {_pool_args(x.shape, y.shape, node.attrs)}); }}"


@register("max_pool2d_grad")
def _max_pool2d_grad(node, ctx):
    dt = float_dtype(node)
    g, x = node.inputs
    _rank4(node, x)
    return (f"{{ {instance_name('et_max_pool2d_grad', dt)}({ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.out)}, "
            f"{_pool_args(x.shape, g.shape, node.attrs)}); }}")


@register("avg_pool2d")
def _avg_pool2d(node, ctx):
    dt = float_dtype(node)
    x, y = node.inputs[0], node.out
    _rank4(node, x)
    return (f"{{ {instance_name('et_avg_pool2d', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, {_pool_args(x.shape, y.shape, node.attrs)}, "
            f"{ctx.c_double(fixed_avg_divisor(node.attrs))}); }}")


@register("avg_pool2d_grad")
def _avg_pool2d_grad(node, ctx):
    dt = float_dtype(node)
    g, gx = node.inputs[0], node.out
    _rank4(node, gx)
    return (f"{{ {instance_name('et_avg_pool2d_grad', dt)}({ctx.ptr(g)}, {ctx.ptr(gx)}, "
            f"{_pool_args(gx.shape, g.shape, node.attrs)}, {ctx.c_double(fixed_avg_divisor(node.attrs))}); }}")


# --- embedding -------------------------------------------------------------------------------------
def index_type(node, idx):
    """The C kernels' index-type flag: 1 for int64 indices, 0 for int32 (others refused)."""
    if idx.dtype not in INDEX:
        raise CBackendError(f"C kernel for {node.op}: indices {idx} must be one of {INDEX}")
    return int(idx.dtype == "int64")


@register("embedding")
def _embedding(node, ctx):
    w, idx = node.inputs
    dt = float_dtype(node, [w, node.out])
    num, width = w.shape
    return (f"{{ {instance_name('et_embedding', dt)}({ctx.ptr(w)}, {ctx.ptr(idx)}, {index_type(node, idx)}, {ctx.ptr(node.out)}, "
            f"{idx.type.numel}, {num}, {width}); }}")


@register("embedding_grad")
def _embedding_grad(node, ctx):
    g, idx = node.inputs
    dt = float_dtype(node, [g, node.out])
    num, width = node.out.shape
    return (f"{{ {instance_name('et_embedding_grad', dt)}({ctx.ptr(g)}, {ctx.ptr(idx)}, {index_type(node, idx)}, "
            f"{ctx.ptr(node.out)}, {idx.type.numel}, {num}, {width}, {int(node.attrs.get('padding_idx', -1))}); }}")
