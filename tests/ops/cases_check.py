"""Op-table case of ops/check.py (merged into tests/ops/cases.py's CASES): check(x, ok; message)
with a condition that holds, x itself (floats of the dtype under test or integers, int8 among
them); tests/ops/test_check.py makes the condition fail on the reference and the C backend."""
from __future__ import annotations

import hypothesis.strategies as st
import torch

from tests.ops.cases import Arg, Case, index, real, shapes

#: an index operand drawn below this is 0 (the check fails) with probability 2**-31 per case:
#: drawn from fixed seeds (derandomized), so never in these cases
_NONZERO_HIGH = 2**31 - 1


@st.composite
def _check(draw):
    shape = draw(shapes(max_dims=4))
    kind = draw(st.sampled_from(["normal", "normal", "int8", "int64"]))
    x = real(*shape) if kind == "normal" else index(shape, 100, kind)
    ok_dtype = draw(st.sampled_from(["bool", "int32", "int64"]))
    ok = Arg(draw(st.sampled_from([(), (1,)])), "index", _NONZERO_HIGH, ok_dtype)
    return [x, ok], {"message": "the model's condition"}


def _torch_check(t, a):
    torch._check(bool(t[1]), lambda: a["message"])
    return t[0]


CASES: dict = {"check": Case(_check(), _torch_check)}
