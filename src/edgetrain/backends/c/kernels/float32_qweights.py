"""Float kernels of ops/qweights.py: runtime/et_float_qweights.h. linear_qw, matmul_qw and
embedding_qw on float32 (C float, the _f instances; through the host BLAS a block of dequantized
rows or columns at a time where the library links one) and float64 (C double, _d) values; the
stored weight is int8 and its scales float32 whatever the float type."""
from __future__ import annotations

from ....ir import Node, Value
from ....ops.qweights import GROUP
from ..layout import CBackendError
from .context import EmitContext
from .float32_nn import float_dtype, index_type, instance_name
from .registry import register


def _stored(node: Node, ctx: EmitContext, wq: Value, scale: Value) -> str:
    """The weight's C arguments: 'wq, scale' (after checking their dtypes)."""
    if wq.dtype != "int8" or scale.dtype != "float32":
        raise CBackendError(f"C kernel for {node.op}: the stored weight {wq} must be int8 and its scales {scale} "
                            "float32")
    return f"{ctx.ptr(wq)}, {ctx.ptr(scale)}"


def _geometry(node: Node, rows_of: Value) -> str:
    """'N, K, O, bits, group': N rows of `rows_of` (its leading dims), K inputs, O outputs."""
    k, o = node.attrs["in_features"], node.inputs[1].shape[0]
    n = rows_of.type.numel // max(rows_of.shape[-1], 1) if rows_of.type.rank else 1
    return f"{n}, {k}, {o}, {int(node.attrs['bits'])}, {GROUP}"


@register("linear_qw")
def _linear_qw(node, ctx):
    x, wq, scale = node.inputs[:3]
    b = node.inputs[3] if len(node.inputs) > 3 else None
    dt = float_dtype(node, [x, node.out] + ([b] if b is not None else []))
    bias = ctx.ptr(b) if b is not None else f"(const {'float' if dt == 'float32' else 'double'} *)0"
    return (f"{{ {instance_name('et_linear_qw', dt)}({ctx.ptr(x)}, {_stored(node, ctx, wq, scale)}, {bias}, "
            f"{ctx.ptr(node.out)}, {_geometry(node, x)}); }}")


@register("matmul_qw")
def _matmul_qw(node, ctx):
    g, wq, scale = node.inputs
    dt = float_dtype(node, [g, node.out])
    return (f"{{ {instance_name('et_matmul_qw', dt)}({ctx.ptr(g)}, {_stored(node, ctx, wq, scale)}, "
            f"{ctx.ptr(node.out)}, {_geometry(node, g)}); }}")


@register("embedding_qw")
def _embedding_qw(node, ctx):
    ids, wq, scale = node.inputs
    dt = float_dtype(node, [node.out])
    return (f"{{ {instance_name('et_embedding_qw', dt)}({ctx.ptr(ids)}, {index_type(node, ids)}, "
            f"{_stored(node, ctx, wq, scale)}, {ctx.ptr(node.out)}, {ids.type.numel}, {wq.shape[0]}, "
            f"{node.attrs['in_features']}, {int(node.attrs['bits'])}, {GROUP}); }}")
