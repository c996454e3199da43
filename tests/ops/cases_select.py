"""Op-table cases of the selection family (merged into tests/ops/cases.py's CASES): where,
cumsum, index_put and index_get (ops/select.py)."""
from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tests.ops.cases import Arg, Case, dim_of, index, real, shapes

#: kinds of operands: floats of the dtype under test, or integers (positions, masks as 0 / 1)
_KINDS = ["normal", "normal", "int32", "int64"]


def _operand(shape, kind: str, high: int = 50) -> Arg:
    return real(*shape) if kind == "normal" else index(shape, high, kind)


@st.composite
def _where(draw):
    s = draw(mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=4)).input_shapes
    kind = draw(st.sampled_from(_KINDS))
    return [index(s[0], 2, "bool"), _operand(s[1], kind), _operand(s[2], kind)], {}


@st.composite
def _cumsum(draw):
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    kind = draw(st.sampled_from(_KINDS))
    return [_operand(shape, kind)], {"dim": draw(dim_of(shape)), "reverse": draw(st.booleans())}


def _torch_cumsum(t, a):
    x, d = t[0], a["dim"]
    if a["reverse"]:
        return torch.cumsum(x.flip(d), d, dtype=x.dtype).flip(d)
    return torch.cumsum(x, d, dtype=x.dtype)


@st.composite
def _indexing(draw, put: bool):
    """x of rank 1 to 3, k index tensors (int32 / int64, broadcast together) on the adjacent dims
    first, ..., first + k - 1; for index_put values broadcasting to the indexed shape."""
    xs = draw(shapes(min_dims=1, max_dims=3, max_side=4))
    first = draw(st.integers(0, len(xs) - 1))
    k = draw(st.integers(1, len(xs) - first))
    bs = draw(mutually_broadcastable_shapes(num_shapes=k, max_dims=2, max_side=3))
    idx = [index(s, xs[first + j], draw(st.sampled_from(["int32", "int64"]))) for j, s in enumerate(bs.input_shapes)]
    kind = draw(st.sampled_from(_KINDS))
    if not put:
        return [_operand(xs, kind)] + idx, {"first": first}
    target = xs[:first] + tuple(bs.result_shape) + xs[first + k:]
    cut = draw(st.integers(0, len(target)))  # the values' shape: a suffix of it, some dims 1
    vs = tuple(1 if draw(st.booleans()) else d for d in target[cut:])
    return [_operand(xs, kind), _operand(vs, kind)] + idx, {"first": first, "accumulate": draw(st.booleans())}


def _key(t, a, k: int):
    return (slice(None),) * a["first"] + tuple(i.long() for i in t[k:])


def _torch_index_put(t, a):
    """aten's index_put, whose index list takes None for each whole leading dim (torch's x[:, i] = v)."""
    indices = [None] * a["first"] + [i.long() for i in t[2:]]
    return torch.ops.aten.index_put.default(t[0], indices, t[1], a["accumulate"])


CASES: dict = {
    "where": Case(_where(), lambda t, a: torch.where(t[0], t[1], t[2])),
    "cumsum": Case(_cumsum(), _torch_cumsum),
    "index_put": Case(_indexing(put=True), _torch_index_put),
    "index_get": Case(_indexing(put=False), lambda t, a: t[0][_key(t, a, 1)]),
}
