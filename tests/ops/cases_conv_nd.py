"""Op-table cases of the conv_nd family (merged into tests/ops/cases.py's CASES): conv_transpose2d
(dense, grouped, depthwise; stride, padding, dilation, output padding) and conv3d (dense, grouped,
depthwise). Sizes stay tiny: a case runs in milliseconds."""
from __future__ import annotations

import hypothesis.strategies as st
import torch.nn.functional as F

from tests.ops.cases import Case, pairs, real

#: the layouts drawn: (input channels per group, output channels per group) where fixed
_KINDS = ("dense", "grouped", "depthwise", "depthwise x2")


def _channels(draw):
    """(groups, input channels per group, output channels per group) of a drawn layout."""
    kind = draw(st.sampled_from(_KINDS))
    groups = 1 if kind == "dense" else draw(st.integers(2, 3))
    cin = 1 if kind.startswith("depthwise") else draw(st.integers(1, 3))
    cout = {"depthwise": 1, "depthwise x2": 2}.get(kind) or draw(st.integers(1, 3))
    return groups, cin, cout


@st.composite
def _conv_transpose2d(draw):
    groups, cin, cout = _channels(draw)
    k, stride, dil = draw(pairs(1, 3)), draw(pairs(1, 3)), draw(pairs(1, 2))
    pad = tuple(draw(st.integers(0, (dil[i] * (k[i] - 1)) // 2)) for i in range(2))  # a non-empty output
    # torch: output padding below stride or dilation
    out_pad = tuple(draw(st.integers(0, max(stride[i], dil[i]) - 1)) for i in range(2))
    hw = draw(pairs(1, 4))
    args = [real(draw(st.integers(1, 2)), groups * cin, *hw), real(groups * cin, cout, *k)]
    if draw(st.booleans()):
        args.append(real(groups * cout))
    return args, {"stride": stride, "padding": pad, "output_padding": out_pad, "dilation": dil, "groups": groups}


def _torch_conv_transpose2d(t, a):
    bias = t[2] if len(t) > 2 else None
    return F.conv_transpose2d(t[0], t[1], bias, a["stride"], a["padding"], a["output_padding"], a["groups"],
                              a["dilation"])


def _triples(lo, hi):
    return st.tuples(*(st.integers(lo, hi) for _ in range(3)))


@st.composite
def _conv3d(draw):
    groups, cin, cout = _channels(draw)
    k, stride, pad, dil = draw(_triples(1, 3)), draw(_triples(1, 2)), draw(_triples(0, 1)), draw(_triples(1, 2))
    lo = [max(1, dil[i] * (k[i] - 1) + 1 - 2 * pad[i]) for i in range(3)]  # the smallest input side
    dhw = [draw(st.integers(lo[i], lo[i] + 2)) for i in range(3)]
    args = [real(draw(st.integers(1, 2)), groups * cin, *dhw), real(groups * cout, cin, *k)]
    if draw(st.booleans()):
        args.append(real(groups * cout))
    return args, {"stride": stride, "padding": pad, "dilation": dil, "groups": groups}


def _torch_conv3d(t, a):
    bias = t[2] if len(t) > 2 else None
    return F.conv3d(t[0], t[1], bias, a["stride"], a["padding"], a["dilation"], a["groups"])


CASES: dict = {
    "conv_transpose2d": Case(_conv_transpose2d(), _torch_conv_transpose2d),
    "conv3d": Case(_conv3d(), _torch_conv3d),
}
