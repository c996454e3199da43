"""Op-table cases of ops/lmloss.py (merged into tests/ops/cases.py CASES): the chunked head +
cross entropy against F.cross_entropy(F.linear(h, w, bias), label, ignore_index=...) over the
flattened rows; with and without bias, int64 and int32 labels, some labels ignored (-100, or
ignore_index = V with labels drawn in [0, V]), a vocabulary a multiple of the chunk or not, one
chunk or several; the quantized-weight op on the dequantized weight (8 and 4 bits)."""
from __future__ import annotations

from math import prod

import hypothesis.strategies as st
import torch.nn.functional as F

from edgetrain.ops.loss import IGNORE_INDEX
from tests.ops.cases import Case, index, real
from tests.ops.cases_qweights import _stored, weight_of

#: rows at least, when some labels are ignored: a case whose every label is ignored (nan, torch's
#: answer too) stays rare
MIN_ROWS = 6


def _rows_and_labels(draw, vocab: int):
    """h's leading dims and the labels (some ignored when ignore_index = vocab), the attrs."""
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    ignore = draw(st.sampled_from([IGNORE_INDEX, vocab]))
    if ignore == vocab and prod(lead) < MIN_ROWS:
        lead = (MIN_ROWS,) + lead[1:]
    labels = index(lead, vocab + (ignore == vocab), draw(st.sampled_from(["int64", "int32"])))
    chunk = draw(st.sampled_from([1, 2, 3, 4, vocab, vocab + 5]))
    return lead, labels, {"chunk": chunk, "ignore_index": ignore}


@st.composite
def _linear_cross_entropy(draw):
    vocab, hid = draw(st.integers(2, 9)), draw(st.integers(1, 6))
    lead, labels, attrs = _rows_and_labels(draw, vocab)
    bias = [real(vocab)] if draw(st.booleans()) else []
    return [real(*lead, hid), labels, real(vocab, hid)] + bias, attrs


@st.composite
def _linear_qw_cross_entropy(draw):
    vocab = draw(st.integers(2, 9))
    stored, qattrs = _stored(draw, vocab)
    lead, labels, attrs = _rows_and_labels(draw, vocab)
    bias = [real(vocab)] if draw(st.booleans()) else []
    return [real(*lead, qattrs["in_features"]), labels] + stored + bias, {**attrs, **qattrs}


def _torch(h, label, w, bias, a):
    v = w.shape[0]
    return F.cross_entropy(F.linear(h, w, bias).reshape(-1, v), label.long().reshape(-1), ignore_index=a["ignore_index"])


CASES: dict = {
    "linear_cross_entropy": Case(_linear_cross_entropy(),
                                 lambda t, a: _torch(t[0], t[1], t[2], t[3] if len(t) > 3 else None, a)),
    "linear_qw_cross_entropy": Case(_linear_qw_cross_entropy(),
                                    lambda t, a: _torch(t[0], t[1], weight_of(t[1:], a, t[0].dtype),
                                                        t[4] if len(t) > 4 else None, a), diff=(0, 4)),
}
