"""The losses of a training step compiled whole (torch.compile of a function that calls the model
and the loss): F.cross_entropy (a log_softmax over the classes, then nll_loss / nll_loss2d),
F.mse_loss and F.binary_cross_entropy_with_logits become edgetrain's loss ops. They register
into translate.py's marker-aware table; graphs.py imports this module."""
from __future__ import annotations

import torch

from .translate import Unused, marker_aware, unsupported

aten = torch.ops.aten


@marker_aware(aten._log_softmax.default)
def _log_softmax(t, x, dim, half_to_float=False):
    x = t.value(x)
    y = t.e.emit("log_softmax", x, dim=dim % len(x.shape))
    if len(x.shape) >= 2 and dim % len(x.shape) == 1:  # over the classes of F.cross_entropy
        t.log_softmax_of[y] = x
    return y


def _check_nll(t, lp, labels, weight, reduction, ignore_index, ranks=(2,)):
    if weight is not None or reduction != 1:
        unsupported("aten.nll_loss with class weights or without mean reduction; edgetrain's loss is "
                    "F.cross_entropy(logits, labels) with reduction='mean'")
    if len(lp.shape) not in ranks:
        unsupported(f"aten.nll_loss on a {len(lp.shape)}-d input; edgetrain's cross entropy takes (N, C), "
                    f"(N, C, L) or (N, C, H, W) logits (flatten a sequence's (N, T, V) to (N*T, V), as "
                    f"F.cross_entropy(logits.view(-1, V), labels.view(-1)))")
    # labels are checked to lie in [0, C) or equal ignore_index at each run (check_class_labels)
    t.labels[labels] = (lp.shape[1], int(ignore_index))


def check_class_labels(labels, feeds) -> None:
    """Raise ValueError unless every class label fed (`labels`: label value -> (classes,
    ignore_index), as the translation recorded them) lies in [0, classes) or is its ignore_index."""
    for v, (classes, ignore) in labels.items():
        counted = feeds[v.name][feeds[v.name] != ignore]
        if counted.size and (counted.min() < 0 or counted.max() >= classes):
            raise ValueError(f"class labels must lie in [0, {classes}) or equal the ignore_index {ignore}, "
                             f"got {counted.min()}..{counted.max()}")


def _cross_entropy_of(t, lp, labels, ignore_index):
    """Cross entropy of the logits whose log_softmax over dim 1 is `lp`, or of those logits viewed
    as `lp` is (a view keeping the batch and class dims commutes with that log_softmax)."""
    if lp in t.log_softmax_views:
        base = t.log_softmax_views[lp]
        logits = t.e.emit("reshape", t.log_softmax_of[base], shape=tuple(lp.shape))
    elif lp in t.log_softmax_of:
        logits = t.log_softmax_of[lp]
    else:
        unsupported("aten.nll_loss of values that are not a log_softmax over dim 1 (use F.cross_entropy)")
    return t.e.emit("cross_entropy", logits, labels, class_dim=1, ignore_index=int(ignore_index))


@marker_aware(aten.nll_loss_forward.default)
def _nll_loss(t, lp, labels, weight, reduction, ignore_index):
    lp, labels = t.value((lp, labels))
    _check_nll(t, lp, labels, weight, reduction, ignore_index)
    return _cross_entropy_of(t, lp, labels, ignore_index), Unused("nll_loss's total weight")


@marker_aware(aten.nll_loss2d_forward.default)
def _nll_loss2d(t, lp, labels, weight, reduction, ignore_index):
    """F.cross_entropy on per-pixel (N, C, H, W) logits against (N, H, W) labels."""
    lp, labels = t.value((lp, labels))
    _check_nll(t, lp, labels, weight, reduction, ignore_index, ranks=(4,))
    return _cross_entropy_of(t, lp, labels, ignore_index), Unused("nll_loss2d's total weight")


@marker_aware(aten.mse_loss.default)
def _mse(t, x, target, reduction=1):
    if reduction != 1:
        unsupported("aten.mse_loss without mean reduction")
    return t.e.emit("mse", *t.value((x, target)))


@marker_aware(aten.binary_cross_entropy_with_logits.default)
def _bce_with_logits(t, x, target, weight=None, pos_weight=None, reduction=1):
    """F.binary_cross_entropy_with_logits(x, target) with the mean (F.l1_loss needs no
    converter: torch decomposes it into sub, abs and mean)."""
    if weight is not None or pos_weight is not None or reduction != 1:
        unsupported("aten.binary_cross_entropy_with_logits with weight / pos_weight or without mean reduction")
    return t.e.emit("bce_with_logits", *t.value((x, target)))
