"""Op-table cases of the largest / smallest elements (merged into tests/ops/cases.py's CASES): amax
and amin over dims (ops/reduce.py), maximum and minimum of two tensors (ops/elementwise.py). Half
the cases fill the operands with small integers in the float dtype under test, so that ties occur
and the gradients' shares between equal elements are checked against torch's."""
from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tests.ops.cases import Arg, Case, _reduce, real


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


def _torch_reduce(fn):
    return lambda t, a: fn(t[0], a["dims"] if a["dims"] is not None else (), keepdim=a["keepdim"])


CASES = {
    "amax": Case(_extreme(), _torch_reduce(torch.amax)),
    "amin": Case(_extreme(), _torch_reduce(torch.amin)),
    "maximum": Case(_extreme2(), lambda t, a: torch.maximum(t[0], t[1])),
    "minimum": Case(_extreme2(), lambda t, a: torch.minimum(t[0], t[1])),
}
