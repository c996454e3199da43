"""C kernels of ops/qresample.py (int8 upsampling, adaptive and 3-D max pooling, and their float32
gradients): runtime/et_int8_resample.h, bit-exact with the references. Linear / bilinear
upsampling reads the fixed-point weight tables of ops/qresample_linear.py. The gradient of int8
upsampling runs et_float_resample.h's float32 upsample_grad on the float tables."""
from __future__ import annotations

from math import prod

from ....ir import Node
from ....ops.qresample_linear import WEIGHT_BITS, fixed_plane_maps
from ....ops.resample import plane_maps
from ..layout import CBackendError
from .float32_resample import c_block, int_table, pool3d_geometry, upsample_tables
from .registry import register


def _check(node: Node, v, dtype: str):
    if v.dtype != dtype:
        raise CBackendError(f"C kernel for {node.op}: expected a {dtype} operand, got {v}")


@register("qupsample")
def _qupsample(node, ctx):
    x, y = node.inputs[0], node.out
    _check(node, x, "int8")
    k = len(node.attrs["size"])
    h, w = (1, x.shape[-1]) if k == 1 else tuple(x.shape[-2:])
    lead = prod(x.shape[:len(x.shape) - k])
    if node.attrs["mode"] == "linear":
        rows, cols = fixed_plane_maps(node.attrs, tuple(x.shape))
        tables = [int_table(f"{tag}{f}", getattr(m, f.lower()))
                  for tag, m in (("R", rows), ("C", cols)) for f in ("I0", "I1", "L0", "L1")]
        return c_block(*tables, f"et_qupsample_linear({ctx.ptr(x)}, {ctx.ptr(y)}, {lead}, {h}, {w}, "
                                f"{len(rows.i0)}, {len(cols.i0)}, RI0, RI1, RL0, RL1, CI0, CI1, CL0, CL1, "
                                f"{WEIGHT_BITS});")
    rows, cols = plane_maps(node.attrs, tuple(x.shape), "float32")
    return c_block(int_table("RI", rows.i0), int_table("CI", cols.i0),
                  f"et_qupsample({ctx.ptr(x)}, {ctx.ptr(y)}, {lead}, {h}, {w}, "
                  f"{len(rows.i0)}, {len(cols.i0)}, RI, CI);")


@register("qupsample_grad")
def _qupsample_grad(node, ctx):
    g, gx = node.inputs[0], node.out
    _check(node, g, "float32")
    tables, args = upsample_tables(gx.shape, node.attrs, "float32")
    return c_block(*tables, f"et_upsample_grad_f({ctx.ptr(g)}, {ctx.ptr(gx)}, {args});")


def _plane_args(x_shape, a) -> str:
    oh, ow = (int(v) for v in a["output_size"])
    return f"{prod(x_shape[:-2])}, {x_shape[-2]}, {x_shape[-1]}, {oh}, {ow}"


@register("qadaptive_max_pool2d")
def _qadaptive_max(node, ctx):
    x, y = node.inputs[0], node.out
    _check(node, x, "int8")
    return f"{{ et_qadaptive_max_pool2d({ctx.ptr(x)}, {ctx.ptr(y)}, {_plane_args(x.shape, node.attrs)}); }}"


@register("qadaptive_max_pool2d_grad")
def _qadaptive_max_grad(node, ctx):
    g, x = node.inputs
    _check(node, x, "int8")
    _check(node, g, "float32")
    return (f"{{ et_qadaptive_max_pool2d_grad({ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.out)}, "
            f"{_plane_args(x.shape, node.attrs)}); }}")


@register("qmax_pool3d")
def _qmax_pool3d(node, ctx):
    x, y = node.inputs[0], node.out
    _check(node, x, "int8")
    return c_block(pool3d_geometry(x.shape, y.shape, node.attrs),
                  f"et_qmax_pool3d({ctx.ptr(x)}, {ctx.ptr(y)}, (const float *)0, (float *)0, "
                  f"{x.shape[0] * x.shape[1]}, P);")


@register("qmax_pool3d_grad")
def _qmax_pool3d_grad(node, ctx):
    g, x = node.inputs
    _check(node, x, "int8")
    _check(node, g, "float32")
    return c_block(pool3d_geometry(x.shape, g.shape, node.attrs),
                  f"et_qmax_pool3d({ctx.ptr(x)}, (int8_t *)0, {ctx.ptr(g)}, {ctx.ptr(node.out)}, "
                  f"{x.shape[0] * x.shape[1]}, P);")
