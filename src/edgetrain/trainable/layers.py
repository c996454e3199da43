"""Layers found in a captured graph: the units that update schemes talk about.

A layer is a conv2d, linear or embedding whose weight is a parameter, or a norm whose
weight is one. A batch norm that directly follows a convolution belongs to it: its scale
and shift are that convolution's bias (the convention of the paper's sparse schemes,
where batch norm is folded into the convolution).

Which ops are layers, and where their weight and bias sit, is the ops' own declaration
(`OpDef.params`, tags "layer" and "norm").
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph, Node
from ..ops import LAYER_TAG, NORM_TAG, get_op

#: the norm that, right after a convolution, is that convolution's bias (the op
#: passes/fold.py folds into it)
FOLDED_NORM = "batch_norm"


@dataclass(frozen=True)
class Layer:
    kind: str  # "conv", "linear", "embedding", "norm"
    node_index: int
    weight: str
    bias: tuple[str, ...]  # the parameters that act as this layer's bias
    depthwise: bool = False

    @property
    def params(self) -> tuple[str, ...]:
        return (self.weight,) + self.bias


def _operand(n: Node, index) -> tuple:
    """Operand `index` of n as a 0- or 1-tuple (absent index or operand: empty)."""
    return (n.inputs[index],) if index is not None and index < len(n.inputs) else ()


def _affine(n: Node) -> tuple:
    """A norm node's weight and bias operands, those it has."""
    slots = get_op(n.op).params
    return _operand(n, slots.weight) + _operand(n, slots.bias)


def _viewed_param(w, producers, users, is_param):
    """w, or the parameter w is a reshape of when only that reshape reads it (a conv1d runs as
    conv2d on a (O, C, 1, K) view of its weight)."""
    src = producers.get(w)
    if src is not None and src.op == "reshape" and is_param.get(src.inputs[0]) and users.get(src.inputs[0]) == [src]:
        return src.inputs[0]
    return w


def find_layers(g: Graph, params: set[str]) -> list[Layer]:
    """Layers in forward order. `params` names the graph inputs that are parameters."""
    is_param = {v: v.name in params for v in g.inputs}
    users = g.consumers()
    producers = g.producers()
    claimed: set[int] = set()
    layers = []
    for i, n in enumerate(g.nodes):
        opdef = get_op(n.op)
        slots = opdef.params
        if LAYER_TAG in opdef.tags:
            w = _viewed_param(n.inputs[slots.weight], producers, users, is_param)
            if not is_param.get(w):
                continue
            bias = [v.name for v in _operand(n, slots.bias) if is_param.get(v)]
            if slots.kind == "conv":
                nxt = users.get(n.out, [])
                if len(nxt) == 1 and nxt[0].op == "reshape" and nxt[0].out.shape[:2] == n.out.shape[:2]:
                    nxt = users.get(nxt[0].out, [])  # a conv1d's output back to (N, C, L)
                if len(nxt) == 1 and nxt[0].op == FOLDED_NORM and len(nxt[0].inputs) == 5:
                    bn = nxt[0]
                    bias += [v.name for v in _affine(bn) if is_param.get(v)]
                    claimed.add(bn)
            depthwise = slots.kind == "conv" and n.attrs["groups"] > 1 and w.shape[1] == 1
            layers.append(Layer(slots.kind, i, w.name, tuple(bias), depthwise))
        elif NORM_TAG in opdef.tags and n not in claimed:
            wi, bi = slots.weight, slots.bias
            w = n.inputs[wi] if len(n.inputs) > wi else None
            if w is not None and is_param.get(w):
                b = n.inputs[bi] if len(n.inputs) > bi else None
                layers.append(Layer("norm", i, w.name, (b.name,) if b is not None and is_param.get(b) else ()))
    return layers
