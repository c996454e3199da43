"""Optimizer updates as in-place IR nodes, and their placement right after their gradient."""
from __future__ import annotations

from typing import Mapping, Optional

from ..autodiff import ChannelSelect, grad_name
from ..ir import Graph, Role, TensorType, new_value
from ..ops import Emitter, get_op


#: the graph input counting training steps (keys the stochastic rounding of int updates)
STEP = "step"
#: integer parameters stay in their type's range; int32 biases within float32's exact integers
INT_RANGES = {"int8": (-127, 127), "int32": (-(2 ** 24), 2 ** 24)}


def momentum_name(param: str) -> str:
    return f"momentum:{param}"


def insert_updates(g: Graph, trainable: Mapping[str, Optional[ChannelSelect]], lr: float,
                   momentum: float = 0.0, weight_decay: float = 0.0,
                   grad_scales: Optional[Mapping[str, tuple[float, ...]]] = None, seed: int = 0) -> Graph:
    """Replace each `grad:<p>` output by `sgd_update(p, grad[, momentum:<p>])`; the updated
    parameter becomes output `<p>` (and the momentum buffer `momentum:<p>`). An integer
    parameter gets `qsgd_update(p, grad, step[, momentum:<p>])` instead, with its
    per-output-channel gradient factor from `grad_scales` (QAS; all ones when absent),
    stochastic rounding keyed by (`seed`, parameter number, step) and a graph input `step`.
    The momentum buffers are inputs of role OPTIMIZER_STATE owned by their parameter; `step`
    has role STEP."""
    e = Emitter()
    added: dict = {}  # new input -> its role
    owners = []
    names, outs = [], []
    step = None
    grads = g.named_outputs()
    consumed = {grad_name(p) for p in trainable}
    for name, v in zip(g.output_names, g.outputs):
        if name not in consumed:
            names.append(name)
            outs.append(v)
    for p, sel in trainable.items():
        w, gv = g.input(p), grads[grad_name(p)]
        args = [w, gv]
        if momentum:
            m = new_value(TensorType(gv.shape, "float32" if w.dtype in INT_RANGES else gv.dtype), momentum_name(p))
            added[m] = Role.OPTIMIZER_STATE
            owners.append((m, w))
            args.append(m)
        attrs = dict(lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay),
                     dim=sel.dim if sel else 0, index=sel.index if sel else None)
        if w.dtype in INT_RANGES:
            if step is None:
                step = new_value(TensorType((), "int32"), STEP)
                added[step] = Role.STEP
            scale = (grad_scales or {}).get(p) or (1.0,) * w.shape[0]
            attrs.update(scale=tuple(float(s) for s in scale), seed=int(seed), param_id=list(trainable).index(p),
                         qmin=INT_RANGES[w.dtype][0], qmax=INT_RANGES[w.dtype][1])
            args.insert(2, step)
            res = e.emit_multi("qsgd_update", *args, names=(p, momentum_name(p)), **attrs)
        else:
            res = e.emit_multi("sgd_update", *args, names=(p, momentum_name(p)), **attrs)
        names += [p] + ([momentum_name(p)] if momentum else [])
        outs += list(res)
    return g.with_inputs(added, owners).replace(nodes=g.nodes + tuple(e.nodes), outputs=tuple(outs),
                                                output_names=tuple(names))


def apply_updates_early(g: Graph) -> Graph:
    """Move every in-place update to just after the last node that needs what it reads or
    overwrites, so each gradient buffer is freed as soon as it is produced and applied."""
    producer_idx = {o: i for i, n in enumerate(g.nodes) for o in n.outputs}
    rest, moves = [], []
    for i, n in enumerate(g.nodes):
        (moves if get_op(n.op).mutates else rest).append((i, n))
    last_read = {}
    for i, n in rest:
        for v in n.inputs:
            last_read[v] = i
    slots: dict[int, list] = {}
    for _, n in moves:
        after = max([producer_idx.get(v, -1) for v in n.inputs] + [last_read.get(v, -1) for v in n.inputs])
        slots.setdefault(after, []).append(n)
    order = list(slots.get(-1, []))
    for i, n in rest:
        order.append(n)
        order += slots.get(i, [])
    return g.replace(nodes=tuple(order))
