"""Op-table cases of the losses (merged into tests/ops/cases.py's CASES): cross entropy over a
class dim of any rank with ignore_index, binary cross entropy with logits, l1 (ops/loss.py)."""
from __future__ import annotations

from math import prod

import hypothesis.strategies as st
import torch.nn.functional as F

from tests.ops.cases import Case, index, real, shapes

#: torch's default ignore_index
IGNORE_INDEX = -100
#: at least this many labelled positions: with labels drawn in [0, C] and C ignored, a case
#: whose every position is ignored (nan, torch's answer too) stays rare
MIN_POSITIONS = 4


@st.composite
def _cross_entropy(draw):
    """Logits (N, C, *S) with the classes in dim 1, or (N, *S, C) with them last; labels of the
    logits' shape without the class dim, int64 or int32. With ignore_index = C the labels are
    drawn in [0, C], so some positions are ignored; with -100 none is."""
    n, c = draw(st.integers(1, 4)), draw(st.integers(2, 5))
    rest = draw(shapes(min_dims=0, max_dims=2, max_side=3))
    if n * prod(rest) < MIN_POSITIONS:
        n = MIN_POSITIONS
    last = draw(st.booleans())
    logits = (n,) + tuple(rest) + (c,) if last else (n, c) + tuple(rest)
    ignore = draw(st.sampled_from([IGNORE_INDEX, c]))
    labels = index((n,) + tuple(rest), c + (ignore == c), draw(st.sampled_from(["int64", "int32"])))
    return [real(*logits), labels], {"class_dim": len(logits) - 1 if last else 1, "ignore_index": ignore}


def _torch_cross_entropy(t, a):
    x = t[0] if a["class_dim"] == 1 else t[0].movedim(-1, 1)
    return F.cross_entropy(x, t[1].long(), ignore_index=a["ignore_index"])


@st.composite
def _same_shape(draw):
    shape = draw(shapes())
    return [real(*shape), real(*shape)], {}


CASES = {
    "cross_entropy": Case(_cross_entropy(), _torch_cross_entropy),
    "bce_with_logits": Case(_same_shape(), lambda t, a: F.binary_cross_entropy_with_logits(t[0], t[1]), diff=(0,)),
    "l1": Case(_same_shape(), lambda t, a: F.l1_loss(t[0], t[1])),
}
