"""Op-table cases of the norm family (merged into tests/ops/cases.py's CASES): group_norm
(instance norm is its one-channel-per-group case) with no affine, a weight, or both."""
from __future__ import annotations

import hypothesis.strategies as st
import torch.nn.functional as F

from tests.ops.cases import Case, real


@st.composite
def _group_norm(draw):
    groups, per = draw(st.integers(1, 3)), draw(st.integers(1, 3))  # per: channels per group
    c = groups * per
    spatial = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    n = draw(st.integers(1 if spatial and max(spatial) > 1 else 2, 3))  # F.group_norm refuses N x spatial == 1
    x = (n, c, *spatial)
    affine = [real(c) for _ in range(draw(st.integers(0, 2)))]  # none, weight, weight and bias
    return [real(*x)] + affine, {"groups": groups, "eps": draw(st.sampled_from([1e-5, 1e-3]))}


def _torch_group_norm(t, a):
    w, b = (t[1:] + [None, None])[:2]
    return F.group_norm(t[0], a["groups"], w, b, eps=a["eps"])


CASES: dict = {
    "group_norm": Case(_group_norm(), _torch_group_norm),
}
