"""Op-table cases of ops/qweights.py (merged into tests/ops/cases.py CASES): linear_qw,
matmul_qw and embedding_qw against F.linear / matmul / F.embedding on the dequantized weight,
8 and 4 bits, input widths below, at and across the int4 group (odd ones: a half-filled last
byte), with and without bias. The stored bytes are drawn in [0, 128) (make_inputs' index fill),
so the odd elements of int4 rows are never negative here: tests/quantize/test_frozen_weights.py
runs every byte value through both backends."""
from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import torch
import torch.nn.functional as F

from edgetrain.ops.qweights import dequantize, packed_cols, scale_shape
from tests.ops.cases import Case, index, positive, real

#: input widths: one element, odd, a group minus / plus one, two groups and a part
IN_FEATURES = (1, 2, 5, 31, 32, 33, 37, 70)


def _stored(draw, out: int):
    bits, n = draw(st.sampled_from([8, 4])), draw(st.sampled_from(IN_FEATURES))
    return [index((out, packed_cols(n, bits)), 128, "int8"), positive(*scale_shape(out, n, bits))], \
        {"bits": bits, "in_features": n}


def _lead(draw):
    return tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))


@st.composite
def _linear_qw(draw):
    out = draw(st.integers(1, 5))
    stored, attrs = _stored(draw, out)
    bias = [real(out)] if draw(st.booleans()) else []
    return [real(*_lead(draw), attrs["in_features"])] + stored + bias, attrs


@st.composite
def _matmul_qw(draw):
    out = draw(st.integers(1, 5))
    stored, attrs = _stored(draw, out)
    return [real(*_lead(draw), out)] + stored, attrs


@st.composite
def _embedding_qw(draw):
    num = draw(st.integers(1, 6))
    stored, attrs = _stored(draw, num)
    ids = index(_lead(draw) + (draw(st.integers(1, 4)),), num, draw(st.sampled_from(["int64", "int32"])))
    return [ids] + stored, attrs


def weight_of(t, a, dtype: torch.dtype) -> torch.Tensor:
    """The float weight the ops compute with, from the stored operands t[1], t[2]."""
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    return torch.from_numpy(dequantize(t[1].numpy(), t[2].detach().numpy(), a["bits"], a["in_features"],
                                       dtype=np_dtype))


CASES: dict = {
    "linear_qw": Case(_linear_qw(), lambda t, a: F.linear(t[0], weight_of(t, a, t[0].dtype), *t[3:]), diff=(0, 3)),
    "matmul_qw": Case(_matmul_qw(), lambda t, a: t[0] @ weight_of(t, a, t[0].dtype)),
    "embedding_qw": Case(_embedding_qw(), lambda t, a: F.embedding(t[0], weight_of(t, a, t[2].dtype)), diff=()),
}
