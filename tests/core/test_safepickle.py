"""edgetrain.safepickle: numpy arrays and plain values come back as pickled; a pickle naming
anything else, declaring sizes its bytes do not hold, or carrying a doctored dtype is refused
before it can allocate or corrupt anything (issue 18, item 3; the model-file tests in
tests/models/test_tiny_training_reader.py drive it through whole archives)."""
from __future__ import annotations

import pickle
import struct
import tracemalloc

import numpy as np
import pytest

from edgetrain.safepickle import Refused, loads

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1
    from numpy.core.multiarray import _reconstruct

#: what refusing one of the pickles below may allocate at its peak (they ask for 600 MB to 2 GB)
PEAK_LIMIT_BYTES = 4 << 20


def sample() -> dict:
    rng = np.random.default_rng(0)
    return {"int8": rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8),
            "int32": rng.integers(-1000, 1000, 7).astype(np.int32), "float32": rng.random(5).astype(np.float32),
            "big-endian": np.arange(3, dtype=">f8"), "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
            "scalar": np.float32(0.5), "zero-d": np.array(3, np.int64), "bool": np.array([True, False]),
            "text": "conv", "bytes": b"\x00\xff", "nested": [(1, 2.5, None), {"k": [True]}], "big": 2 ** 80}


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_round_trip(protocol):
    raw = pickle.dumps(sample(), protocol=protocol)
    want = pickle.loads(raw)  # (our own data: what numpy's unpickling gives)
    got = loads(raw)
    assert got.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            assert type(got[k]) is np.ndarray and got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        else:
            assert got[k] == v, k
    shared = [np.arange(3)] * 2  # one object referenced twice stays one object
    again = loads(pickle.dumps(shared, protocol=protocol))
    assert again[0] is again[1]


def test_python2_style_bytes():
    raw = pickle.dumps({b"data": np.zeros((2, 3), np.uint8), b"labels": [1, 2]}, protocol=2)
    got = loads(raw, encoding="bytes")
    assert got[b"labels"] == [1, 2] and got[b"data"].shape == (2, 3)


def _payload(func, args, state=None) -> bytes:
    class Payload:
        def __reduce__(self):
            return (func, args) if state is None else (func, args, state)

    return pickle.dumps({"x": Payload()}, protocol=2)


def _flagged_int32() -> np.dtype:
    """An int32 dtype whose flags say it holds object references (as one flipped bit made)."""
    d = np.dtype("<i4", copy=True)
    d.__setstate__((3, "<", None, None, None, -1, -1, 0x01))
    return d


HOSTILE = {
    "bytes8": b"\x80\x04\x8e" + struct.pack("<Q", 600 << 20) + b"abc.",
    "unicode8": b"\x80\x04\x8d" + struct.pack("<Q", 600 << 20) + b"abc.",
    "memo": b"\x80\x02Nr" + struct.pack("<I", 1 << 27) + b".",
    "ndarray-call": _payload(np.ndarray, ((600 << 20,), "u1")),
    "reconstruct": _payload(_reconstruct, (np.ndarray, (600 << 20,), b"b")),
    "state": _payload(_reconstruct, (np.ndarray, (0,), b"b"), (1, (10 ** 9,), np.dtype("f4"), False, b"abc")),
    "object-array": _payload(_reconstruct, (np.ndarray, (0,), b"b"),
                             (1, (10 ** 6,), np.dtype("O"), False, [1, 2])),
    "eval": _payload(eval, ("1",)),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_pickles_are_refused_before_allocating(name):
    tracemalloc.start()
    try:
        with pytest.raises((Refused, pickle.UnpicklingError, ValueError)):
            loads(HOSTILE[name])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT_BYTES, f"{peak:,} bytes"


def test_doctored_dtype_flags_do_not_reach_the_array():
    """A plain unpickle gives the array the flagged dtype, and numpy fails freeing it."""
    got = loads(_payload(_reconstruct, (np.ndarray, (0,), b"b"),
                         (1, (4,), _flagged_int32(), False, b"\x01\x00\x00\x00" * 4)))
    x = got["x"]
    assert x.dtype == np.int32 and not x.dtype.hasobject and x.tolist() == [1, 1, 1, 1]


def test_cycles_are_refused():
    loop = []
    loop.append(loop)
    with pytest.raises(Refused, match="cycle"):
        loads(pickle.dumps(loop, protocol=2))
