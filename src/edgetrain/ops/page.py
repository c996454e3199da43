"""Paging: tensors written to and read back from secondary storage (flash, SD card, eMMC).

The storage is a graph input `store`, a 1-D byte tensor (dtype `STORE_DTYPE`) that is not
RAM: the reference runtime binds it to a `numpy.memmap` of a file, the C backend to a file
(host) through its page API.

- ``page_out(store, x; offset) -> store'``: x's bytes written at byte `offset` of `store`,
  in place (`shares`/`mutates`: the store is threaded through the graph, so every later
  page op reads the newest version and a read never moves before the write it needs).
- ``page_in(store; offset, shape, dtype) -> x``: those bytes read back as a new tensor.

Cost: the bytes moved, no arithmetic. Neither is differentiable: a schedule inserts them
into a train graph after autodiff (remat/apply.py).
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, register

#: the dtype of a page store (the IR has no uint8; a byte is a byte)
STORE_DTYPE = "int8"


def _check_store(t: TensorType, op: str) -> None:
    if t.dtype != STORE_DTYPE or t.rank != 1:
        raise ValueError(f"{op}: the store must be a 1-D {STORE_DTYPE} tensor, got {t}")


def _check_span(store: TensorType, offset, nbytes: int, op: str) -> None:
    if not isinstance(offset, int) or offset < 0 or offset + nbytes > store.numel:
        raise ValueError(f"{op}: bytes [{offset}, {offset}+{nbytes}) do not lie in the store of {store.numel} bytes")


def _out_infer(ts, a):
    store, x = ts
    _check_store(store, "page_out")
    _check_span(store, a["offset"], x.nbytes, "page_out")
    return [store]


def _out_ref(xs, a):
    store, x = xs
    off = a["offset"]
    data = np.ascontiguousarray(x).reshape(-1).view(np.int8)
    store[off:off + data.size] = data  # in place: a memmap writes through to its file
    return [store]


def _in_infer(ts, a):
    (store,) = ts
    _check_store(store, "page_in")
    t = TensorType(tuple(int(d) for d in a["shape"]), a["dtype"])
    _check_span(store, a["offset"], t.nbytes, "page_in")
    return [t]


def _in_ref(xs, a):
    (store,) = xs
    t = TensorType(tuple(int(d) for d in a["shape"]), a["dtype"])
    off = a["offset"]
    raw = np.array(store[off:off + t.nbytes], dtype=np.int8, copy=True)  # a new buffer in RAM
    return [raw.view(np.dtype(t.dtype)).reshape(t.shape)]


register(OpDef("page_out", _out_infer, _out_ref, cost=lambda n: Cost(0, n.inputs[1].type.nbytes),
               shares=((0, 0),), mutates=True, num_inputs=(2, 2), io="out"))
register(OpDef("page_in", _in_infer, _in_ref, cost=lambda n: Cost(0, n.outputs[0].type.nbytes),
               num_inputs=(1, 1), io="in"))
