"""Op-table cases of the largest / smallest elements (merged into tests/ops/cases.py's CASES): amax
and amin over dims (ops/reduce.py), maximum and minimum of two tensors (ops/elementwise.py), the
positions of the k largest or smallest (topk_indices, ops/compare.py). Half
the cases fill the operands with small integers in the float dtype under test, so that ties occur
and the gradients' shares between equal elements are checked against torch's."""
from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tests.ops.cases import Arg, Case, _reduce, dim_of, index, real, shapes


def _tied(shape, tie: bool) -> Arg:
    return Arg(tuple(shape), "integral", 3) if tie else real(*shape)


@st.composite
def _extreme(draw):
    (x,), attrs = draw(_reduce())
    return [_tied(x.shape, draw(st.booleans()))], attrs


@st.composite
def _extreme2(draw):
    s = draw(mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4)).input_shapes
    tie = draw(st.booleans())
    return [_tied(sh, tie) for sh in s], {}


@st.composite
def _topk_indices(draw):
    """floats, small integers in the float dtype (ties: in the order of their positions), or int64"""
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=5))
    dim = draw(dim_of(shape))
    kind = draw(st.sampled_from(["normal", "integral", "int64"]))
    x = real(*shape) if kind == "normal" else _tied(shape, True) if kind == "integral" else index(shape, 4, "int64")
    return [x], {"k": draw(st.integers(1, shape[dim])), "dim": dim, "largest": draw(st.booleans())}


def _torch_topk_indices(t, a):  # torch's stable sort, cut to k: the order topk_indices promises
    order = torch.sort(t[0], dim=a["dim"], descending=a["largest"], stable=True).indices
    return order.narrow(a["dim"], 0, a["k"])


def _torch_reduce(fn):
    return lambda t, a: fn(t[0], a["dims"] if a["dims"] is not None else (), keepdim=a["keepdim"])


CASES = {
    "amax": Case(_extreme(), _torch_reduce(torch.amax)),
    "amin": Case(_extreme(), _torch_reduce(torch.amin)),
    "maximum": Case(_extreme2(), lambda t, a: torch.maximum(t[0], t[1])),
    "minimum": Case(_extreme2(), lambda t, a: torch.minimum(t[0], t[1])),
    "topk_indices": Case(_topk_indices(), _torch_topk_indices, diff=()),
}
