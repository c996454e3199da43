"""Layers found in a captured graph: the units that update schemes talk about.

A layer is a conv2d, linear or embedding whose weight is a parameter, or a norm whose
weight is one. A batch norm that directly follows a convolution belongs to it: its scale
and shift are that convolution's bias (the convention of the paper's sparse schemes,
where batch norm is folded into the convolution).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph

WEIGHT_OPS = {"conv2d": 1, "linear": 1, "embedding": 0}  # op -> operand index of its weight
NORM_OPS = {"batch_norm": (3, 4), "layer_norm": (1, 2)}  # op -> operand indices of (weight, bias)


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


def find_layers(g: Graph, params: set[str]) -> list[Layer]:
    """Layers in forward order. `params` names the graph inputs that are parameters."""
    is_param = {v: v.name in params for v in g.inputs}
    users = g.consumers()
    claimed: set[int] = set()
    layers = []
    for i, n in enumerate(g.nodes):
        if n.op in WEIGHT_OPS:
            w = n.inputs[WEIGHT_OPS[n.op]]
            if not is_param.get(w):
                continue
            bias = [v.name for v in n.inputs[2:3] if is_param.get(v)] if n.op != "embedding" else []
            if n.op == "conv2d":
                nxt = users.get(n.out, [])
                if len(nxt) == 1 and nxt[0].op == "batch_norm" and len(nxt[0].inputs) == 5:
                    bn = nxt[0]
                    bias += [v.name for v in bn.inputs[3:5] if is_param.get(v)]
                    claimed.add(id(bn))
            kind = {"conv2d": "conv", "linear": "linear", "embedding": "embedding"}[n.op]
            depthwise = n.op == "conv2d" and n.attrs["groups"] > 1 and w.shape[1] == 1
            layers.append(Layer(kind, i, w.name, tuple(bias), depthwise))
        elif n.op in NORM_OPS and id(n) not in claimed:
            wi, bi = NORM_OPS[n.op]
            w = n.inputs[wi] if len(n.inputs) > wi else None
            if w is not None and is_param.get(w):
                b = n.inputs[bi] if len(n.inputs) > bi else None
                layers.append(Layer("norm", i, w.name, (b.name,) if b is not None and is_param.get(b) else ()))
    return layers
