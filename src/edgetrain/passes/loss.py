"""Attach the training loss to a captured forward graph."""
from __future__ import annotations

from ..ir import Graph, Role, TensorType, new_value
from ..ops import Emitter

LOSSES = ("cross_entropy", "mse")
LABEL = "label"


def attach_loss(g: Graph, loss: str, output: str = "output") -> Graph:
    """Add a `label` input (role LABEL) and a scalar `loss` output computed from the model's `output`.
    cross_entropy takes integer class labels (N,); mse takes targets shaped like the output."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    out = g.output(output)
    if loss == "cross_entropy":
        if out.type.rank != 2:
            raise ValueError(f"cross_entropy needs model outputs of shape (batch, classes), got {out.type}")
        label = new_value(TensorType((out.shape[0],), "int64"), LABEL)
    else:
        label = new_value(out.type, LABEL)
    e = Emitter()
    lv = e.emit(loss, out, label, name="loss")
    return g.with_inputs({label: Role.LABEL}).replace(nodes=g.nodes + tuple(e.nodes), outputs=(lv,),
                                                      output_names=("loss",))
