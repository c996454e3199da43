"""The losses of a training step compiled whole (torch.compile of a function that calls the model
and the loss): F.cross_entropy (a log_softmax over the classes, then nll_loss / nll_loss2d),
F.mse_loss and F.binary_cross_entropy_with_logits become edgetrain's loss ops. They register
into translate.py's marker-aware table; graphs.py imports this module."""
from __future__ import annotations

import torch

from ..ops.loss import IGNORE_INDEX
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
    if ignore_index != IGNORE_INDEX:
        unsupported(f"aten.nll_loss with ignore_index={ignore_index}: edgetrain's cross entropy ignores torch's "
                    f"default {IGNORE_INDEX}")
    if len(lp.shape) not in ranks:
        unsupported(f"aten.nll_loss on a {len(lp.shape)}-d input; edgetrain's cross entropy takes (N, C) or "
                    f"(N, C, H, W) logits (flatten a sequence's (N, T, V) to (N*T, V), as F.cross_entropy(logits"
                    f".view(-1, V), labels.view(-1)))")
    t.labels[labels] = lp.shape[1]  # labels are checked to lie in [0, C) or be ignore_index at each run


def _cross_entropy_of(t, lp, labels, ignore_index):
    if lp not in t.log_softmax_of:
        unsupported("aten.nll_loss of values that are not a log_softmax over dim 1 (use F.cross_entropy)")
    return t.e.emit("cross_entropy", t.log_softmax_of[lp], labels, class_dim=1, ignore_index=IGNORE_INDEX)


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
