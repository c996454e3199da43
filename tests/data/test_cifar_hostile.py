"""CIFAR-10 batches crafted to crash or exhaust the reader (issue 18, item 3's probe applied to
the other pickles edgetrain reads from a user's path): each is a DataError naming the file,
refused before anything of the size it declares is allocated (tracemalloc sees Python's and
numpy's allocations) and without crashing the process."""
from __future__ import annotations

import pickle
import struct
import tracemalloc

import numpy as np
import pytest

from edgetrain.data import DataError, load_cifar10

from .cifar_archive import make_batches_folder

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1
    from numpy.core.multiarray import _reconstruct

#: what refusing one batch may allocate at its peak (the batches ask for 600 MB to 2 GB)
PEAK_LIMIT_BYTES = 8 << 20


def _array_state(state) -> bytes:
    class Payload:
        def __reduce__(self):
            return (_reconstruct, (np.ndarray, (0,), b"b"), state)

    return pickle.dumps({b"data": Payload(), b"labels": []}, protocol=2)


BATCHES = {
    # an object array whose list is shorter than its shape: numpy 2.4 crashed (SIGSEGV)
    "object-array": _array_state((1, (10 ** 6,), np.dtype("O"), False, [1, 2])),
    # a memo index of 2**27 in 10 bytes: the C unpickler grew its memo to 2 GB
    "memo": b"\x80\x02Nr" + struct.pack("<I", 1 << 27) + b".",
    # an 8-byte length of 600 MB with 3 bytes behind it: allocated before it was found missing
    "bytes8": b"\x80\x04\x8e" + struct.pack("<Q", 600 << 20) + b"abc.",
}


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_crafted_batch_is_refused_without_allocating(tmp_path, name):
    folder = make_batches_folder(tmp_path, {"test_batch": BATCHES[name]})
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match="test_batch") as info:
            load_cifar10("test", path=folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "refused to load" in str(info.value) or "not a CIFAR-10 batch" in str(info.value)
    assert peak < PEAK_LIMIT_BYTES, f"{peak:,} bytes"
