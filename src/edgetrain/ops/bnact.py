"""Batch norm (on running statistics), an optional residual add and a ReLU / clamp as one
forward op, so the normalised tensor (and the sum) is never stored: one read of x (and r),
one write of z, instead of three passes over memory.

``batch_norm_act(x, mean, var[, w, b][, r]) -> z`` is, by definition, the composition

    y = batch_norm(x, mean, var[, w, b])
    s = add(y, r)                                 # when attrs["residual"]; s = y without
    z = relu(s) | clamp(s, min, max)              # attrs["act"]

and its reference *is* that composition (the unfused ops' references), so a fused program
equals the unfused one bit for bit on the reference runtime. ``affine`` says whether w and b
are present, ``eps`` is the batch norm's, ``min`` / ``max`` the clamp's (either may be absent).

The backward reads z where it read y or s: relu_grad reads relu's output already, and
clamp_grad's mask ``min < s < max`` equals ``min < z < max`` for z = clamp(s) (the open
interval is where clamp is the identity; NaN fails both), so the pass
(passes/fuse_bn_activation.py) points clamp_grad (and a fused batch-norm backward's saved
operand) at z. Forward only: no vjp (the fusion runs after autodiff). Its C kernel is
et_bn_act_fwd (runtime/et_float.h).
"""
from __future__ import annotations

from typing import Any, Mapping

from .base import Cost, OpDef, get_op, register

#: the op's name (passes/fuse_bn_activation.py builds it)
BN_ACT_OP = "batch_norm_act"
#: the activations the fused op ends with
ACTS = ("relu", "clamp")
#: the clamp attributes a fused node carries over
CLAMP_ATTRS = ("min", "max")


def act_attrs(a: Mapping[str, Any]) -> dict:
    """The attributes of the activation node a fused node stands for."""
    return {k: a[k] for k in CLAMP_ATTRS if k in a} if a["act"] == "clamp" else {}


def fused_attrs(eps: float, affine: bool, residual: bool, act: str, act_node_attrs: Mapping[str, Any]) -> dict:
    """A fused node's attributes (module docstring)."""
    a = {"eps": float(eps), "affine": bool(affine), "residual": bool(residual), "act": act}
    if act == "clamp":
        a.update({k: act_node_attrs[k] for k in CLAMP_ATTRS if k in act_node_attrs})
    return a


def _split(items, a: Mapping[str, Any]) -> tuple:
    """(x, mean, var, [w, b], r or None) from the operands in input order."""
    items = list(items)
    want = 3 + 2 * bool(a["affine"]) + bool(a["residual"])
    if len(items) != want:
        raise ValueError(f"{BN_ACT_OP}: {len(items)} operands, its attributes ask for {want} "
                         f"(x, mean, var[, w, b][, r])")
    if a["act"] not in ACTS:
        raise ValueError(f"{BN_ACT_OP}: act {a['act']!r} is not one of {ACTS}")
    r = items.pop() if a["residual"] else None
    return items, r


def _infer(ts, a):
    bn, r = _split(ts, a)
    (y,) = get_op("batch_norm").infer(bn, {"eps": a["eps"]})
    if r is not None and r != y:
        raise ValueError(f"{BN_ACT_OP}: the residual is {r}, expected the batch norm's output {y}")
    return [y]


def _ref(xs, a):
    bn, r = _split(xs, a)
    (s,) = get_op("batch_norm").ref(bn, {"eps": a["eps"]})
    if r is not None:
        (s,) = get_op("add").ref([s, r], {})
    return get_op(a["act"]).ref([s], act_attrs(a))


def _cost(node) -> Cost:
    """Per element: the normalisation's subtract, multiply and add, the residual's add, the
    activation; one read of each operand, one write of z."""
    z = node.outputs[0].type
    touched = sum(v.type.nbytes for v in node.inputs) + z.nbytes
    return Cost(macs=(4 + bool(node.attrs["residual"])) * z.numel, bytes=touched)


register(OpDef(BN_ACT_OP, _infer, _ref, cost=_cost, inplace=((0, 0),), num_inputs=(3, 6)))

__all__ = ["ACTS", "BN_ACT_OP", "act_attrs", "fused_attrs"]
