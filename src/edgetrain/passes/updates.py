"""Optimizer updates as in-place IR nodes, and their placement right after their gradient."""
from __future__ import annotations

from typing import Mapping, Optional

from ..autodiff import ChannelSelect, grad_name
from ..ir import Graph, TensorType, new_value
from ..ops import Emitter, get_op


def momentum_name(param: str) -> str:
    return f"momentum:{param}"


def insert_updates(g: Graph, trainable: Mapping[str, Optional[ChannelSelect]], lr: float,
                   momentum: float = 0.0, weight_decay: float = 0.0) -> Graph:
    """Replace each `grad:<p>` output by `sgd_update(p, grad[, momentum:<p>])`; the updated
    parameter becomes output `<p>` (and the momentum buffer `momentum:<p>`)."""
    e = Emitter()
    inputs = list(g.inputs)
    names, outs = [], []
    grads = g.named_outputs()
    for name, v in zip(g.output_names, g.outputs):
        if not name.startswith("grad:"):
            names.append(name)
            outs.append(v)
    for p, sel in trainable.items():
        w, gv = g.input(p), grads[grad_name(p)]
        args = [w, gv]
        if momentum:
            m = new_value(TensorType(gv.shape, gv.dtype), momentum_name(p))
            inputs.append(m)
            args.append(m)
        attrs = dict(lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay),
                     dim=sel.dim if sel else 0, index=sel.index if sel else None)
        res = e.emit_multi("sgd_update", *args, names=(p, momentum_name(p)), **attrs)
        names += [p] + ([momentum_name(p)] if momentum else [])
        outs += list(res)
    return Graph(tuple(inputs), g.nodes + tuple(e.nodes), tuple(outs), tuple(names))


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
    for i, n in moves:
        after = max([producer_idx.get(v, -1) for v in n.inputs] + [last_read.get(v, -1) for v in n.inputs])
        slots.setdefault(after, []).append(n)
    order = list(slots.get(-1, []))
    for i, n in rest:
        order.append(n)
        order += slots.get(i, [])
    return g.replace(nodes=tuple(order))
