"""Batch norm in training mode (et.compile(..., batchnorm="train")): the captured graph's
batch norms (running statistics, as on-device fine-tuning at batch 1 uses them) become
train-mode ones (batch statistics, the gradient through them), and the training step writes
the running statistics in place as torch's train-mode BatchNorm does (ops/norm.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from ..ir import Graph, Node, Role, Value
from ..ops import Emitter

#: the buffer beside running_mean / running_var that counts the batches (torch's _BatchNorm)
TRACKED = "num_batches_tracked"


@dataclass(frozen=True)
class BatchStats:
    """One train-mode batch norm: its input and the state tensors its step writes."""

    x: Value
    running_mean: str
    running_var: str
    tracked: Optional[str]  # num_batches_tracked, where the model keeps it
    momentum: Optional[float]  # None: a cumulative average (torch's momentum=None)


def _module_path(buffer: str) -> str:
    return buffer.rsplit(".", 1)[0] if "." in buffer else ""


def use_batch_statistics(g: Graph, momenta: Mapping[str, Optional[float]]) -> tuple[Graph, tuple[BatchStats, ...]]:
    """`g` with each batch_norm on running statistics (graph inputs) made batch_norm_train,
    and what each one's running-statistics update needs. `momenta`: module path -> momentum.
    The statistics (and the batch count) become inputs of role RUNNING_STAT: the step writes them."""
    inputs = set(g.inputs)
    names = {v.name for v in g.inputs}
    nodes, stats = [], []
    for n in g.nodes:
        if n.op != "batch_norm":
            nodes.append(n)
            continue
        x, mean, var = n.inputs[:3]
        if mean not in inputs or var not in inputs:
            raise ValueError(f"batchnorm='train': a batch norm reads running statistics {mean.name}, {var.name} "
                             f"that are not buffers of the model")
        path = _module_path(mean.name)
        if path not in momenta:
            raise ValueError(f"batchnorm='train': no BatchNorm module owns the buffer {mean.name} (its momentum "
                             f"is unknown)")
        tracked = f"{path}.{TRACKED}" if path else TRACKED
        nodes.append(Node("batch_norm_train", (x,) + tuple(n.inputs[3:]), n.outputs, {"eps": n.attrs["eps"]}))
        stats.append(BatchStats(x, mean.name, var.name, tracked if tracked in names else None, momenta[path]))
    written = {n for s in stats for n in (s.running_mean, s.running_var, s.tracked) if n is not None}
    roles = tuple(Role.RUNNING_STAT if v.name in written else r for v, r in zip(g.inputs, g.roles))
    return g.replace(nodes=tuple(nodes), roles=roles), tuple(stats)


def insert_stat_updates(g: Graph, stats: tuple[BatchStats, ...]) -> Graph:
    """Append each batch norm's in-place running-statistics update (batch_norm_update_stats);
    the updated buffers become outputs under their own names, as updated weights do."""
    e = Emitter()
    outs, names = list(g.outputs), list(g.output_names)
    for s in stats:
        state = [g.input(s.running_mean), g.input(s.running_var)]
        if s.tracked is not None:
            state.append(g.input(s.tracked))
        written = [s.running_mean, s.running_var] + ([s.tracked] if s.tracked is not None else [])
        res = e.emit_multi("batch_norm_update_stats", state[0], state[1], s.x, *state[2:], names=written,
                           momentum=s.momentum)
        outs += list(res)
        names += written
    return g.replace(nodes=g.nodes + tuple(e.nodes), outputs=tuple(outs), output_names=tuple(names))


def batchnorm_momenta(model) -> dict[str, Optional[float]]:
    """Module path -> momentum of every batch norm module of `model` (torch's _BatchNorm)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return {path: m.momentum for path, m in model.named_modules() if isinstance(m, _BatchNorm)}
