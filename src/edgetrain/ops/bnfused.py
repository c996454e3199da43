"""The backward of batch norm (on running statistics) as one op: the activation's gradient
mask, the input gradient, the weight gradient and the bias gradient, read from one gradient
tensor in one pass per channel.

``batch_norm_backward_fused(g, var[, w][, saved][, x, mean]) -> (gx[, gw][, gb])`` is, by
definition, the composition of the unfused ops that autodiff emits for ``act(batch_norm(x))``:

    m  = mask(g, saved)                          # relu_grad / clamp_grad; m = g without a mask
    gx = batch_norm_grad_input(m, var[, w])
    gw = batch_norm_grad_weight(m, x, mean, var)    # when attrs["grad_weight"]
    gb = sum(m, dims=(0, 2, 3, ...))               # when attrs["grad_bias"]

and its reference *is* that composition (the unfused ops' references), so a fused program
equals the unfused one bit for bit on the reference runtime. Which operands are present is
said by the attributes: ``mask`` ("" or the mask op's name, with its ``min`` / ``max`` for
clamp_grad), ``affine`` (w present), ``grad_weight`` (x, mean present, gw computed),
``grad_bias`` (gb computed); ``eps`` is the batch norm's.

Memory: the masked gradient m is never stored (the kernel masks each element as it reads
it), and gx may be written over g (``inplace``: the kernel reads g[i] before it writes
gx[i]), so the arena planner plans the fused node like any other. The pass that builds it
is passes/fuse_batchnorm_backward.py; its C kernel is et_bn_backward_fused (runtime/et_float.h).

Backward only: no vjp (the fusion runs after autodiff, on the nodes it emitted). Cost: one
read of g (and of saved, x), one write of each output; per element the mask, the weight
gradient's multiply-add, the bias gradient's add and the input gradient's multiply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..ir import Node, TensorType
from .base import Cost, OpDef, get_op, register

#: the op's name (passes/fuse_batchnorm_backward.py builds it)
BN_BACKWARD_OP = "batch_norm_backward_fused"
#: the gradient masks the fused op (and its C kernel) applies: the ops tagged grad_mask
#: (tests/ops/test_op_facts.py keeps the two in step)
MASK_OPS = ("clamp_grad", "relu_grad")
#: the mask attributes a fused node carries over from its mask node
MASK_ATTRS = ("min", "max")


@dataclass(frozen=True)
class Operands:
    """The operands of a fused node, by role (None: absent)."""

    g: Any
    var: Any
    w: Optional[Any] = None
    saved: Optional[Any] = None
    x: Optional[Any] = None
    mean: Optional[Any] = None


def operands(items, a: Mapping[str, Any]) -> Operands:
    """The fused node's operands (values, types or arrays, in input order) by role."""
    items = list(items)
    want = 2 + bool(a["affine"]) + bool(a["mask"]) + 2 * bool(a["grad_weight"])
    if len(items) != want:
        raise ValueError(f"{BN_BACKWARD_OP}: {len(items)} operands, its attributes ask for {want} "
                         f"(g, var[, w][, saved][, x, mean])")
    g, var, *rest = items
    w = rest.pop(0) if a["affine"] else None
    saved = rest.pop(0) if a["mask"] else None
    x, mean = rest if a["grad_weight"] else (None, None)
    return Operands(g, var, w, saved, x, mean)


def fused_attrs(mask: Optional[Node], eps: float, affine: bool, grad_weight: bool, grad_bias: bool) -> dict:
    """A fused node's attributes (module docstring)."""
    a = {"mask": mask.op if mask is not None else "", "eps": float(eps), "affine": bool(affine),
         "grad_weight": bool(grad_weight), "grad_bias": bool(grad_bias)}
    if mask is not None:
        a.update({k: mask.attrs[k] for k in MASK_ATTRS if k in mask.attrs})
    return a


def mask_attrs(a: Mapping[str, Any]) -> dict:
    """The attributes of the mask node a fused node stands for."""
    return {k: a[k] for k in MASK_ATTRS if k in a}


def _infer(ts, a):
    o = operands(ts, a)
    g = o.g
    if g.rank < 2 or g.dtype not in ("float32", "float64"):
        raise ValueError(f"{BN_BACKWARD_OP}: the gradient must be a float tensor of rank >= 2, got {g}")
    if a["mask"] and a["mask"] not in MASK_OPS:
        raise ValueError(f"{BN_BACKWARD_OP}: mask {a['mask']!r} is not one of {MASK_OPS}")
    channel = TensorType((g.shape[1],), g.dtype)
    for name in ("var", "w", "mean"):
        t = getattr(o, name)
        if t is not None and t != channel:
            raise ValueError(f"{BN_BACKWARD_OP}: {name} is {t}, expected {channel}")
    for name in ("saved", "x"):
        t = getattr(o, name)
        if t is not None and t != g:
            raise ValueError(f"{BN_BACKWARD_OP}: {name} is {t}, expected the gradient's type {g}")
    return [g] + [channel] * (bool(a["grad_weight"]) + bool(a["grad_bias"]))


def _ref(xs, a):
    o = operands(xs, a)
    m = o.g
    if a["mask"]:
        (m,) = get_op(a["mask"]).ref([o.g, o.saved], mask_attrs(a))
    eps = {"eps": a["eps"]}
    (gx,) = get_op("batch_norm_grad_input").ref([m, o.var] + ([o.w] if a["affine"] else []), eps)
    out = [gx]
    if a["grad_weight"]:
        out += get_op("batch_norm_grad_weight").ref([m, o.x, o.mean, o.var], eps)
    if a["grad_bias"]:
        out += get_op("sum").ref([m], {"dims": (0,) + tuple(range(2, m.ndim)), "keepdim": False})
    return out


def _cost(node) -> Cost:
    g = node.inputs[0].type
    per_element = 1 + bool(node.attrs["mask"]) + 2 * bool(node.attrs["grad_weight"]) + bool(node.attrs["grad_bias"])
    touched = sum(v.type.nbytes for v in node.inputs) + sum(v.type.nbytes for v in node.outputs)
    return Cost(macs=per_element * g.numel, bytes=touched)


register(OpDef(BN_BACKWARD_OP, _infer, _ref, cost=_cost, inplace=((0, 0),), num_inputs=(2, 6)))

__all__ = ["BN_BACKWARD_OP", "MASK_OPS", "Operands", "fused_attrs", "mask_attrs", "operands"]
