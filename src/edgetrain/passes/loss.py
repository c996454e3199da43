"""Attach the training loss to a captured forward graph.

The losses (`et.compile(loss=...)`, the CLI's --loss), as torch computes them with its defaults:
- "cross_entropy": F.cross_entropy(logits, labels): the classes in dim 1 of logits of any rank
  >= 2 ((N, C) against labels (N,), per-pixel (N, C, H, W) against (N, H, W), (N, C, L) against
  (N, L)); labels equal to -100 (torch's ignore_index) are ignored.
- "sequence_cross_entropy": the classes in the last dim, as a language model's (N, T, V)
  logits against (N, T) labels, what torch users write as
  F.cross_entropy(logits.view(-1, V), labels.view(-1)); ignore_index -100 likewise.
- "causal_lm": a causal language model's loss as Hugging Face computes it from `labels=`:
  (N, T, V) logits against (N, T) labels (usually the input ids, padding set to -100), each
  position predicting the next token: cross entropy of logits[:, :-1] against labels[:, 1:],
  the mean over the labels that are not -100.
- "bce_with_logits": F.binary_cross_entropy_with_logits(out, targets), float targets shaped
  like the output (multi-label, anomaly scores).
- "mse", "l1": F.mse_loss, F.l1_loss, targets shaped like the output (autoencoders).
The class losses ignore the labels equal to `ignore_index` (torch's default -100; e.g. 0 for a
padding token, 255 for a segmentation's void class): they count neither in the sum nor in the
mean's divisor. A batch whose every label is ignored has no mean: its loss is nan (torch's
answer) and training stops there with NonFiniteLossError.
"""
from __future__ import annotations

from ..ir import Graph, Role, TensorType, new_value
from ..ops import Emitter
from ..ops.loss import IGNORE_INDEX

#: the losses over integer class labels
CLASS_LOSSES = ("cross_entropy", "sequence_cross_entropy", "causal_lm")
#: the losses over float targets shaped like the output
TARGET_LOSSES = ("mse", "l1", "bce_with_logits")
LOSSES = CLASS_LOSSES + TARGET_LOSSES
LABEL = "label"


def class_dim(loss: str, out_rank: int) -> int:
    """The dim of a class loss's logits that holds the classes."""
    return out_rank - 1 if loss in ("sequence_cross_entropy", "causal_lm") else 1


def attach_loss(g: Graph, loss: str, output: str = "output", ignore_index: int = IGNORE_INDEX) -> Graph:
    """Add a `label` input (role LABEL) and a scalar `loss` output computed from the model's `output`.
    The class losses take int64 labels: the output's shape without its class dim, labels equal
    to `ignore_index` not counted; the others take float targets shaped like the output."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    out = g.output(output)
    e = Emitter()
    if loss in CLASS_LOSSES:
        if out.type.rank < 2:
            raise ValueError(f"{loss} needs model outputs of shape (batch, classes, ...) or (batch, ..., classes), "
                             f"got {out.type}")
        d = class_dim(loss, out.type.rank)
        label = new_value(TensorType(out.shape[:d] + out.shape[d + 1:], "int64"), LABEL)
        logits, target = out, label
        if loss == "causal_lm":
            logits, target = _shifted(e, out, label)
        lv = e.emit("cross_entropy", logits, target, class_dim=d, ignore_index=int(ignore_index), name="loss")
    else:
        label = new_value(out.type, LABEL)
        lv = e.emit(loss, out, label, name="loss")
    return g.with_inputs({label: Role.LABEL}).replace(nodes=g.nodes + tuple(e.nodes), outputs=(lv,),
                                                      output_names=("loss",))


def _shifted(e: Emitter, logits, label):
    """causal_lm: position t's logits against the label of t + 1 (the sequence dim is 1)."""
    if logits.type.rank != 3 or logits.shape[1] < 2:
        raise ValueError(f"causal_lm needs (batch, sequence >= 2, vocabulary) logits, got {logits.type}")
    t = logits.shape[1]
    return (e.emit("slice", logits, dim=1, start=0, end=t - 1, step=1),
            e.emit("slice", label, dim=1, start=1, end=t, step=1))
