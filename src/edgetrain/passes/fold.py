"""fold_batchnorm: merge every eval-mode batch norm that directly follows a convolution
into that convolution's weight and bias (what a microcontroller runs: no batch norm)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from ..ir import Graph, Node, TensorType, new_value


@dataclass(frozen=True)
class FoldedNorm:
    """Where a folded convolution's parameters came from, to map trained values back."""

    weight: str  # the conv weight (keeps its name; its values now include the norm's scale)
    bias: str  # the folded bias (the conv's own bias name, or a new name if it had none)
    conv_bias: Optional[str]  # the conv's original bias parameter, if any
    mean: str
    var: str
    norm_weight: Optional[str]
    norm_bias: Optional[str]
    eps: float


def _bias_name(weight: str, taken: set[str]) -> str:
    base = weight[: -len(".weight")] if weight.endswith(".weight") else weight
    name = f"{base}.bias"
    while name in taken:
        name += "_folded"
    return name


def _weight_param(n: Node, producers, users):
    """Conv n's weight parameter: its operand 1, or the parameter that operand is a reshape of
    (a conv1d runs as conv2d on a (O, C, 1, K) view of its weight) when nothing else reads it."""
    w = n.inputs[1]
    src = producers.get(w)
    if src is not None and src.op == "reshape" and users.get(src.inputs[0]) == [src] and users.get(w) == [n]:
        return src.inputs[0]
    return w


def _is_channel_view(n: Node) -> bool:
    """A reshape keeping dims 0 and 1 (a conv1d's output back to (N, C, L)): a batch norm
    after it normalises the same channels."""
    return n.op == "reshape" and n.out.shape[:2] == n.inputs[0].shape[:2]


def fold_batchnorm(g: Graph, arrays: Mapping[str, np.ndarray]) -> tuple[Graph, dict[str, np.ndarray], list[FoldedNorm]]:
    """Return the graph without conv-following batch norms, the arrays with folded weights
    and biases (batch-norm tensors dropped), and a record per fold. `arrays` binds the
    graph's parameter and buffer inputs by name."""
    users = g.consumers()
    is_const = {v: v.name in arrays for v in g.inputs}
    arrays = dict(arrays)
    taken = {v.name for v in g.inputs}
    folds: list[FoldedNorm] = []
    replaced: dict[Node, Optional[Node]] = {}  # node -> replacement (None: drop)
    new_inputs = {}  # a new folded bias -> its role (its weight's: trained if the weight is)
    producers = g.producers()
    for n in g.nodes:
        if n.op != "conv2d":
            continue
        w_param = _weight_param(n, producers, users)
        if not is_const.get(w_param):
            continue
        nxt = users.get(n.out, [])
        view = nxt[0] if len(nxt) == 1 and _is_channel_view(nxt[0]) else None  # a conv1d's (N, C, L) view
        if view is not None:
            nxt = users.get(view.out, [])
        if len(nxt) != 1 or nxt[0].op != "batch_norm" or not all(is_const.get(v) for v in nxt[0].inputs[1:]):
            continue
        bn = nxt[0]
        if len(n.inputs) > 2 and not is_const.get(n.inputs[2]):
            continue
        w_name = w_param.name
        mean, var = (arrays[v.name].astype(np.float64) for v in bn.inputs[1:3])
        gamma = arrays[bn.inputs[3].name].astype(np.float64) if len(bn.inputs) == 5 else np.ones_like(mean)
        beta = arrays[bn.inputs[4].name].astype(np.float64) if len(bn.inputs) == 5 else np.zeros_like(mean)
        conv_bias = n.inputs[2].name if len(n.inputs) > 2 else None
        b0 = arrays[conv_bias].astype(np.float64) if conv_bias else np.zeros_like(mean)
        s = gamma / np.sqrt(var + bn.attrs["eps"])
        w = arrays[w_name]
        arrays[w_name] = (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b_name = conv_bias or _bias_name(w_name, taken)
        taken.add(b_name)
        arrays[b_name] = ((b0 - mean) * s + beta).astype(w.dtype)
        if conv_bias is None:
            b_val = new_value(TensorType((w.shape[0],), w_param.dtype), b_name)
            new_inputs[b_val] = g.role(w_param)
        else:
            b_val = n.inputs[2]
        if view is None:
            replaced[n] = Node("conv2d", (n.inputs[0], n.inputs[1], b_val), bn.outputs, n.attrs)
        else:  # the view now carries the folded output
            replaced[n] = Node("conv2d", (n.inputs[0], n.inputs[1], b_val), n.outputs, n.attrs)
            replaced[view] = Node(view.op, view.inputs, bn.outputs, view.attrs)
        replaced[bn] = None
        folds.append(FoldedNorm(w_name, b_name, conv_bias, bn.inputs[1].name, bn.inputs[2].name,
                                bn.inputs[3].name if len(bn.inputs) == 5 else None,
                                bn.inputs[4].name if len(bn.inputs) == 5 else None, float(bn.attrs["eps"])))
    nodes = tuple(replaced.get(n, n) for n in g.nodes if replaced.get(n, n) is not None)
    used = {v for n in nodes for v in n.inputs} | set(g.outputs)
    role = {**g.roles_by_input(), **new_inputs}
    inputs = tuple(v for v in g.inputs + tuple(new_inputs) if v in used or v.name not in arrays)
    kept = {v.name for v in inputs}
    return (g.replace(inputs=inputs, roles=tuple(role[v] for v in inputs), nodes=nodes),
            {k: v for k, v in arrays.items() if k in kept}, folds)
