"""The converters of frontend/aten_data.py against torch, through capture and the reference
runtime: comparisons (scalar and tensor operands, torch's dtype promotion), argmax, and
aten.index.Tensor with positions computed at run time (leading and inner dims, negative and
int32 positions), and the refusals: what they cannot express is named at capture."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.interpreter import run_graph
from edgetrain.frontend import capture
from edgetrain.frontend.capture import UnsupportedOpError

CMPS = ["eq", "ne", "lt", "le", "gt", "ge"]


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def run(fn, *xs):
    """fn(*xs) by capture and the reference runtime, and by torch."""
    model = Fn(fn)
    cap = capture(model, xs)
    got, _ = run_graph(cap.graph, {**cap.buffers, **{f"input:{i}": x.numpy() for i, x in enumerate(xs)}})
    return got["output"], model(*xs).numpy()


def _ints(*shape, high=4):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(sum(shape)))


BOOL_FNS = {  # masks as models combine them (transformers' causal and padding masks)
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "logical and / or": lambda a, b: torch.logical_and(a, b) | torch.logical_or(~a, b),
    "not": lambda a, b: ~a & torch.logical_not(b),
    "any over a dim": lambda a, b: a.any(dim=-1, keepdim=True) & b,
    "all over a dim": lambda a, b: b.all(dim=0) | a[0],
    "any / all of everything": lambda a, b: torch.stack([a.any() & b.all(), b.any()]),
}


@pytest.mark.parametrize("fn", BOOL_FNS.values(), ids=list(BOOL_FNS))
def test_boolean_masks_match_torch(fn):
    a, b = _ints(3, 5) > 1, _ints(5, 3).T > 0
    b = b.contiguous()
    b[:, 0] = True  # a dim where all holds
    got, want = run(fn, a, b)
    assert got.dtype == want.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


def test_bitwise_ops_of_integers_are_refused():
    with pytest.raises(UnsupportedOpError, match="only boolean masks"):
        capture(Fn(lambda a, b: a & b), (_ints(3, 4), _ints(3, 4)))


OPERANDS = {  # (a, b): b a tensor or a Python scalar
    "float tensors, broadcast": (_ints(3, 4).double(), _ints(4).double()),
    "int64 and a scalar": (_ints(3, 4), 2),
    "int32 and int64": (_ints(3, 4).int(), _ints(3, 1)),
    "int and a float scalar": (_ints(3, 4), 1.5),
    "int64 and float64": (_ints(2, 4), _ints(2, 4).double() + 0.5),
    "bool and an int scalar": (_ints(3, 4) > 1, 1),
}


@pytest.mark.parametrize("operands", OPERANDS.values(), ids=list(OPERANDS))
def test_comparisons_match_torch(operands):
    """The six comparisons of one pair of operands, stacked into one output."""
    a, b = operands
    if isinstance(b, torch.Tensor):
        got, want = run(lambda x, y: torch.stack([getattr(torch, c)(x, y) for c in CMPS]), a, b)
    else:
        got, want = run(lambda x: torch.stack([getattr(torch, c)(x, b) for c in CMPS]), a)
    assert got.dtype == want.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dim,keepdim", [(-1, False), (0, True), (1, False), (None, False), (None, True)])
def test_argmax_matches_torch_ties_included(dim, keepdim):
    x = _ints(3, 5, high=3).double()  # repeated maxima: the first one wins on both sides
    got, want = run(lambda t: t.argmax(dim, keepdim), x)
    assert got.dtype == want.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def _last(ids):
    return (torch.arange(ids.shape[1]) * (ids != 0).long()).argmax(-1)


IDS = torch.tensor([[3, 1, 0, 0], [2, 0, 0, 0], [1, 1, 1, 1]])
X = torch.randn(3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

INDEXING = {
    "rows and last tokens": lambda x, ids: x[torch.arange(3), _last(ids)],
    "an inner dim": lambda x, ids: x[:, _last(ids)],
    "the last dim, broadcast": lambda x, ids: x[:, torch.arange(4)[:, None], _last(ids)],
    "negative positions": lambda x, ids: x[torch.arange(3), _last(ids) - 4],
    "int32 positions": lambda x, ids: x[torch.arange(3), _last(ids).int()],
    "one index tensor": lambda x, ids: x.transpose(0, 1)[_last(ids)],
}


@pytest.mark.parametrize("fn", INDEXING.values(), ids=list(INDEXING))
def test_indexing_at_run_time_matches_torch(fn):
    got, want = run(fn, X, IDS)
    np.testing.assert_array_equal(got, want)
    other = torch.tensor([[1, 1, 1, 0], [2, 2, 0, 0], [5, 0, 0, 0]])  # other positions, same graph
    cap = capture(Fn(fn), (X, IDS))
    again, _ = run_graph(cap.graph, {**cap.buffers, "input:0": X.numpy(), "input:1": other.numpy()})
    np.testing.assert_array_equal(again["output"], fn(X, other).numpy())


class Flagged(nn.Module):
    """x[arange(3), pos] with pos = `bad` in the rows whose x[:, 0, 0] is large, else 0: a
    position out of its dim (of 4) whose merged row is in range (x[0, 4] would be x[1, 0])."""

    def __init__(self, bad: int):
        super().__init__()
        self.bad = bad
        self.w = nn.Parameter(torch.ones(5))

    def forward(self, x):
        return x[torch.arange(3), (x[:, 0, 0] > 100).long() * self.bad] * self.w


def _flagged_input(row: int) -> torch.Tensor:
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    x[row, 0, 0] = 200.0
    return x


@pytest.mark.parametrize("bad,row", [(4, 0), (-5, 1)])
def test_a_position_out_of_its_dim_stops_the_reference_as_torch(bad, row):
    x = _flagged_input(row)
    with pytest.raises(IndexError):
        Flagged(bad)(x)
    prog = et.compile(Flagged(bad), (x,))
    with pytest.raises(IndexError, match="out of range"):
        prog.predict(x.numpy())


def test_a_position_out_of_its_dim_reads_zeros_in_c():
    """(the C embedding kernel's answer to an index out of range, reported through ET_ERROR_HOOK)"""
    x = _flagged_input(0)
    got = et.compile(Flagged(4), (x,), backend="c").predict(x.numpy())
    np.testing.assert_array_equal(got[0], 0.0)
    np.testing.assert_array_equal(got[1:], x[1:, 0].numpy())


REFUSED = {
    "non-adjacent": (lambda x, ids: x[_last(ids), :, _last(ids)], "non-adjacent"),
    "integer tensor": (lambda x, ids: ids[torch.arange(3), _last(ids)], "of a int64 tensor"),
}


@pytest.mark.parametrize("fn,message", REFUSED.values(), ids=list(REFUSED))
def test_run_time_indexing_it_cannot_express_is_named(fn, message):
    with pytest.raises(UnsupportedOpError, match=message) as err:
        capture(Fn(fn), (X, IDS))
    assert "aten.index.Tensor" in str(err.value) and "test_aten_data.py" in str(err.value)


@pytest.mark.parametrize("fn", [
    lambda ids: torch.arange(ids.shape[1]) * (ids != 0),  # int64 times a boolean mask: int64
    lambda ids: (ids != 0) + ids.to(torch.int32),  # bool plus int32: int32
    lambda ids: ids / 2,  # true division of integers: float32
    lambda ids: ids.to(torch.int32) * 3 - ids,  # int32 and int64: int64
], ids=["int-times-mask", "bool-plus-int", "int-div", "int32-int64"])
def test_integer_arithmetic_promotes_as_torch(fn):
    ids = torch.tensor([[1, 2, 0, 0], [3, 1, 2, 0]])
    got, want = run(fn, ids)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op, args, fn", [
    ("roll", ([2, -1], [1, 2]), lambda t: torch.roll(t, (2, -1), (1, 2))),
    ("roll", ([3], []), lambda t: torch.roll(t, 3)),
    ("clamp_min", (-0.5,), lambda t: t.clamp_min(-0.5)),
    ("clamp_max", (0.25,), lambda t: t.clamp_max(0.25)),
    ("_safe_softmax", (2,), lambda t: torch.softmax(t, 2)),
], ids=["roll-dims", "roll-flat", "clamp_min", "clamp_max", "safe_softmax"])
def test_converters_aot_autograd_leaves_whole_match_torch(op, args, fn):
    """Ops torch.export decomposes but AOTAutograd (torch.compile) leaves whole: one shared
    converter each, against torch on the reference runtime."""
    from edgetrain.frontend.converters import CONVERTERS
    from edgetrain.ir import Graph, TensorType, new_value
    from edgetrain.ops import Emitter

    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v = new_value(TensorType(tuple(x.shape), "float64"), "x")
    e = Emitter()
    y = CONVERTERS[getattr(torch.ops.aten, op).default](e, v, *args)
    got, _ = run_graph(Graph((v,), tuple(e.nodes), (y,), ("y",)), {"x": x.numpy()})
    np.testing.assert_allclose(got["y"], fn(x).numpy(), rtol=1e-14, atol=0)
