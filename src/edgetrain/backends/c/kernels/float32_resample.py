"""Float kernels of ops/pool_nd.py and ops/resample.py (3-D and adaptive pooling, upsampling):
runtime/et_float_resample.h, float32 (_f) and float64 (_d) instances. A 3-D pool's geometry and
an upsample's source-index and weight tables (computed by ops/resample.py with torch's
arithmetic) are emitted as static constant tables of the kernel's block."""
from __future__ import annotations

from math import prod

import numpy as np

from ....ir import Node
from ....ops.pool_nd import fixed_avg3_divisor, geo3
from ....ops.resample import plane_maps
from ..layout import C_TYPES, CBackendError
from .float32_nn import float_dtype, instance_name
from .registry import register


def c_block(*lines) -> str:
    return "{\n" + "\n".join(lines) + "\n}"


def int_table(name: str, values) -> str:
    vals = ", ".join(str(int(v)) for v in values)
    return f"static const int {name}[{len(values)}] = {{{vals}}};"


def _float_table(name: str, values, dtype: str) -> str:
    """Exact hexadecimal literals of `values` (already rounded to `dtype`)."""
    suffix = "f" if dtype == "float32" else ""
    vals = ", ".join(float(v).hex() + suffix for v in np.asarray(values, dtype=dtype))
    return f"static const {C_TYPES[dtype]} {name}[{len(values)}] = {{{vals}}};"


def _rank(node: Node, v, rank: int):
    if len(v.shape) != rank:
        raise CBackendError(f"C kernel for {node.op}: expected a {rank}-D operand, got {v}")


# --- 3-D pooling -----------------------------------------------------------------------------------
def pool3d_geometry(x_shape, y_shape, a) -> str:
    """The ET_P3_* geometry table P of a 3-D pool (runtime/et_float_resample.h)."""
    k, s, p, d = geo3(a)
    return int_table("P", tuple(x_shape[2:]) + tuple(y_shape[2:]) + k + s + p + d)


@register("max_pool3d")
def _max_pool3d(node, ctx):
    dt = float_dtype(node)
    x, y = node.inputs[0], node.out
    _rank(node, x, 5)
    return c_block(pool3d_geometry(x.shape, y.shape, node.attrs),
                  f"{instance_name('et_max_pool3d', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, {x.shape[0] * x.shape[1]}, P);")


@register("max_pool3d_grad")
def _max_pool3d_grad(node, ctx):
    dt = float_dtype(node)
    g, x = node.inputs
    _rank(node, x, 5)
    return c_block(pool3d_geometry(x.shape, g.shape, node.attrs),
                  f"{instance_name('et_max_pool3d_grad', dt)}({ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.out)}, "
                  f"{x.shape[0] * x.shape[1]}, P);")


@register("avg_pool3d")
def _avg_pool3d(node, ctx):
    dt = float_dtype(node)
    x, y = node.inputs[0], node.out
    _rank(node, x, 5)
    return c_block(pool3d_geometry(x.shape, y.shape, node.attrs),
                  f"{instance_name('et_avg_pool3d', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, {x.shape[0] * x.shape[1]}, P, "
                  f"{ctx.c_double(fixed_avg3_divisor(node.attrs))}, 0);")


@register("avg_pool3d_grad")
def _avg_pool3d_grad(node, ctx):
    dt = float_dtype(node)
    g, gx = node.inputs[0], node.out
    _rank(node, gx, 5)
    return c_block(pool3d_geometry(gx.shape, g.shape, node.attrs),
                  f"{instance_name('et_avg_pool3d', dt)}({ctx.ptr(g)}, {ctx.ptr(gx)}, {gx.shape[0] * gx.shape[1]}, P, "
                  f"{ctx.c_double(fixed_avg3_divisor(node.attrs))}, 1);")


# --- adaptive pooling ------------------------------------------------------------------------------
def _plane_args(in_shape, a) -> str:
    oh, ow = (int(v) for v in a["output_size"])
    return f"{prod(in_shape[:-2])}, {in_shape[-2]}, {in_shape[-1]}, {oh}, {ow}"


@register("adaptive_avg_pool2d")
def _adaptive_avg(node, ctx):
    dt = float_dtype(node)
    x, y = node.inputs[0], node.out
    return (f"{{ {instance_name('et_adaptive_avg_pool2d', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, "
            f"{_plane_args(x.shape, node.attrs)}, 0); }}")


@register("adaptive_avg_pool2d_grad")
def _adaptive_avg_grad(node, ctx):
    dt = float_dtype(node)
    g, gx = node.inputs[0], node.out
    return (f"{{ {instance_name('et_adaptive_avg_pool2d', dt)}({ctx.ptr(g)}, {ctx.ptr(gx)}, "
            f"{_plane_args(gx.shape, node.attrs)}, 1); }}")


@register("adaptive_max_pool2d")
def _adaptive_max(node, ctx):
    dt = float_dtype(node)
    x, y = node.inputs[0], node.out
    return (f"{{ {instance_name('et_adaptive_max_pool2d', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, ({C_TYPES[dt]} *)0, "
            f"{_plane_args(x.shape, node.attrs)}); }}")


@register("adaptive_max_pool2d_grad")
def _adaptive_max_grad(node, ctx):
    dt = float_dtype(node)
    g, x = node.inputs
    return (f"{{ {instance_name('et_adaptive_max_pool2d', dt)}({ctx.ptr(x)}, {ctx.ptr(node.out)}, {ctx.ptr(g)}, "
            f"{_plane_args(x.shape, node.attrs)}); }}")


# --- upsampling ------------------------------------------------------------------------------------
def upsample_tables(in_shape, a, dtype: str) -> tuple[list[str], str]:
    """(the static tables RI0 .. CL1 of an upsample, its arguments NC, H, W, HO, WO, tables, nearest)."""
    k = len(a["size"])
    rows, cols = plane_maps(a, tuple(in_shape), dtype)
    lines = []
    for tag, m in (("R", rows), ("C", cols)):
        lines += [int_table(f"{tag}I0", m.i0), int_table(f"{tag}I1", m.i1),
                  _float_table(f"{tag}L0", m.l0, dtype), _float_table(f"{tag}L1", m.l1, dtype)]
    h, w = (1, in_shape[-1]) if k == 1 else tuple(in_shape[-2:])
    nc = prod(in_shape[:len(in_shape) - k])
    args = (f"{nc}, {h}, {w}, {len(rows.i0)}, {len(cols.i0)}, RI0, RI1, RL0, RL1, CI0, CI1, CL0, CL1, "
            f"{int(a['mode'] != 'linear')}")
    return lines, args


@register("upsample")
def _upsample(node, ctx):
    dt = float_dtype(node)
    x, y = node.inputs[0], node.out
    tables, args = upsample_tables(x.shape, node.attrs, dt)
    return c_block(*tables, f"{instance_name('et_upsample', dt)}({ctx.ptr(x)}, {ctx.ptr(y)}, {args});")


@register("upsample_grad")
def _upsample_grad(node, ctx):
    dt = float_dtype(node)
    g, gx = node.inputs[0], node.out
    tables, args = upsample_tables(gx.shape, node.attrs, dt)
    return c_block(*tables, f"{instance_name('et_upsample_grad', dt)}({ctx.ptr(g)}, {ctx.ptr(gx)}, {args});")
