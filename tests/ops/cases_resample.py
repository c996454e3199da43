"""Op-table cases of the resample family (merged into tests/ops/cases.py's CASES): 3-D and
adaptive pooling, upsampling."""
from __future__ import annotations

import math

import hypothesis.strategies as st
import torch.nn.functional as F

from tests.ops.cases import Case, real

#: scale factors drawn for upsampling: integral, fractional up and down (torch maps them by 1 / scale)
SCALES = (0.5, 0.75, 1.5, 1.7, 2.0, 2.5, 3.0)
#: torch's interpolate mode of each of our modes, by resampled dims
TORCH_MODE = {("nearest", 1): "nearest", ("nearest", 2): "nearest", ("nearest_exact", 1): "nearest-exact",
              ("nearest_exact", 2): "nearest-exact", ("linear", 1): "linear", ("linear", 2): "bilinear"}


def _triple(lo, hi):
    return st.tuples(*(st.integers(lo, hi) for _ in range(3)))


@st.composite
def _pool3d(draw, avg: bool):
    k, stride = draw(_triple(1, 2)), draw(_triple(1, 2))
    pad = tuple(draw(st.integers(0, ki // 2)) for ki in k)
    dil = (1, 1, 1) if avg else draw(_triple(1, 2))
    dhw = [draw(st.integers(dil[i] * (k[i] - 1) + 1, 4)) for i in range(3)]  # torch: no window past the input
    attrs = {"kernel": k, "stride": stride, "padding": pad}
    if avg:
        attrs.update(count_include_pad=draw(st.booleans()), divisor_override=draw(st.sampled_from([0, 0, 3])))
    else:
        attrs["dilation"] = dil
    return [real(draw(st.integers(1, 2)), draw(st.integers(1, 2)), *dhw)], attrs


def _torch_avg_pool3d(t, a):
    return F.avg_pool3d(t[0], a["kernel"], a["stride"], a["padding"], count_include_pad=a["count_include_pad"],
                        divisor_override=a["divisor_override"] or None)


def _torch_max_pool3d(t, a):
    return F.max_pool3d(t[0], a["kernel"], a["stride"], a["padding"], a["dilation"])


@st.composite
def _adaptive(draw):
    lead = (draw(st.integers(1, 2)),) * draw(st.integers(1, 2))
    h, w = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    out = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    return [real(*lead, h, w)], {"output_size": out}


@st.composite
def upsample_case(draw, modes=("nearest", "nearest_exact", "linear"), largest: int = 5):
    """[input], attrs of an upsample of one of `modes` (spatial sizes up to `largest`)."""
    k = draw(st.integers(1, 2))
    mode = draw(st.sampled_from(modes))
    spatial = tuple(draw(st.integers(1, largest)) for _ in range(k))
    align = mode == "linear" and draw(st.booleans())
    if draw(st.booleans()):  # scale factors given (torch maps output to input by 1 / scale)
        scales = tuple(draw(st.sampled_from(SCALES)) for _ in range(k))
        size = tuple(math.floor(spatial[i] * scales[i]) for i in range(k))
        if min(size) < 1:
            scales = tuple(max(s, 1.0) for s in scales)
            size = tuple(math.floor(spatial[i] * scales[i]) for i in range(k))
    else:
        scales, size = (0.0,) * k, tuple(draw(st.integers(1, 9)) for _ in range(k))
    attrs = {"mode": mode, "size": size, "scales": scales, "align_corners": align}
    return [real(draw(st.integers(1, 2)), draw(st.integers(1, 2)), *spatial)], attrs


def torch_upsample(t, a):
    k = len(a["size"])
    mode = TORCH_MODE[(a["mode"], k)]
    align = a["align_corners"] if a["mode"] == "linear" else None
    if any(a["scales"]):
        return F.interpolate(t[0], scale_factor=tuple(a["scales"]), mode=mode, align_corners=align)
    return F.interpolate(t[0], size=tuple(a["size"]), mode=mode, align_corners=align)


CASES: dict = {
    "avg_pool3d": Case(_pool3d(avg=True), _torch_avg_pool3d),
    "max_pool3d": Case(_pool3d(avg=False), _torch_max_pool3d),
    "adaptive_avg_pool2d": Case(_adaptive(), lambda t, a: F.adaptive_avg_pool2d(t[0], a["output_size"])),
    "adaptive_max_pool2d": Case(_adaptive(), lambda t, a: F.adaptive_max_pool2d(t[0], a["output_size"])),
    "upsample": Case(upsample_case(), torch_upsample),
}
