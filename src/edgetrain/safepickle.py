"""Unpickling data files that come from anywhere (model files, data sets): numpy arrays and
plain values, and nothing of any size a few bytes of pickle can ask for.

A pickle can call anything it names, and the C unpickler trusts the sizes it reads, so
`loads` adds checks that hold before anything is allocated:

- the opcodes are walked once with pickletools, which reads each argument from the data and
  never allocates a declared length up front, where the C unpickler allocates it first (an
  8-byte length of 600 MB in a 20-byte pickle cost 600 MB): a length that runs past the data
  is refused first, and so is a memo index beyond the entries stored so far (the C unpickler
  grows its memo to twice the index: LONG_BINPUT 2**27 in a 10-byte pickle cost 2 GB);
- only numpy's array reconstruction, plain numeric dtypes and scalars, and the latin-1 codec
  (protocol 2's bytes) may be named, each through a checked stand-in: arrays are rebuilt
  through a subclass whose `__setstate__` checks the state before numpy sees it (numpy 2.4
  crashes on an object array whose list is shorter than its shape) and gives the array
  numpy's own dtype of that type code (a pickle's BUILD sets any flags on the dtype object
  it made: one flipped bit marked an int32 dtype as holding object references, and numpy
  failed with internal errors freeing the array, then the process died); the subclass cannot
  be called to allocate; the result holds plain ndarrays.

A policy refusal raises Refused; a malformed pickle raises whatever the unpickler raises
(callers turn both into their own error naming the file)."""
from __future__ import annotations

import codecs
import importlib
import io
import math
import pickle
import pickletools
import warnings

import numpy as np

#: the most values numpy's `_reconstruct` may be asked for (numpy pickles every array as an
#: empty one, then fills it from the data that follows)
RECONSTRUCT_LIMIT = 1 << 20
#: dtype kinds an array or scalar may have: bool, signed, unsigned, float
_NUMERIC_KINDS = "biuf"
_RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
_SCALAR = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
_MEMO_PUTS = ("PUT", "BINPUT", "LONG_BINPUT")
_IN_PROGRESS = object()


class Refused(pickle.UnpicklingError):
    """The pickle asked for something plain data never holds."""


def loads(data: bytes, encoding: str = "ASCII"):
    """The object pickled in `data` (dicts, lists, tuples, numbers, strings, bytes, numpy
    arrays and scalars). `encoding` as pickle.Unpickler's ("bytes" for Python 2 pickles)."""
    with warnings.catch_warnings():  # a corrupt pickle's odd strings and dtype codes are errors, not news
        warnings.simplefilter("ignore", DeprecationWarning)
        _check_opcodes(data)
        return _plain(_Unpickler(io.BytesIO(data), encoding=encoding).load(), {})


class _CheckedArray(np.ndarray):
    """What the pickle's arrays are rebuilt as: `__setstate__` checks the state first; the
    class cannot be called (np.ndarray(shape) would allocate any size it is given)."""

    def __new__(cls, *args, **kwargs):
        raise Refused("numpy.ndarray may only be rebuilt from its pickled data, not called")

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) != 5:
            raise Refused("an array's pickled state is not numpy's (version, shape, dtype, fortran, data)")
        version, shape, dtype, fortran, data = state
        dtype = _canonical(dtype)
        if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise Refused(f"an array's shape {shape!r} is not a tuple of sizes")
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            raise Refused(f"an array of shape {shape} and dtype {dtype} comes with "
                          f"{len(data) if isinstance(data, bytes) else type(data).__name__} bytes of data")
        super().__setstate__((version, shape, dtype, bool(fortran), data))


def _canonical(dtype) -> np.dtype:
    """numpy's own dtype of `dtype`'s type code, when that is a plain number type: the pickled
    dtype object went through BUILD, which may have set any flags or sizes on it."""
    try:
        canonical = np.dtype(dtype.str) if isinstance(dtype, np.dtype) else None
    except (TypeError, ValueError):
        canonical = None
    if canonical is None or canonical.kind not in _NUMERIC_KINDS or canonical.names is not None \
            or canonical.subdtype is not None or canonical.hasobject:
        raise Refused(f"dtype {dtype!r} is not a plain numeric dtype")
    return canonical


def _dtype(obj, align=False, copy=False):
    """`numpy.dtype(obj, align, copy)` as a pickle calls it, always as a fresh copy (the BUILD
    that follows changes the dtype object it is given: never numpy's own)."""
    if not isinstance(obj, (str, bytes)):
        raise Refused(f"numpy.dtype({obj!r}) is not how numpy pickles a dtype")
    try:
        dtype = np.dtype(obj)
    except (TypeError, ValueError) as err:
        raise Refused(f"numpy.dtype({obj!r}): {err}") from None
    return np.dtype(_canonical(dtype), copy=True)


def _reconstruct(subtype, shape, typecode):
    """numpy's `_reconstruct(ndarray, (0,), b'b')`: an empty array that BUILD then fills (a
    shape of more than RECONSTRUCT_LIMIT values is not how numpy pickles one)."""
    if subtype is not _CheckedArray or not isinstance(shape, tuple) or any(
            not isinstance(n, int) or n < 0 for n in shape) or math.prod(shape) > RECONSTRUCT_LIMIT:
        raise Refused(f"_reconstruct({subtype!r}, {shape!r}, ...) is not how numpy pickles an array")
    return np.ndarray.__new__(_CheckedArray, shape, _dtype(typecode))  # (its dtype: a fresh copy)


def _scalar(dtype, data):
    dtype = _canonical(dtype)
    module = importlib.import_module("numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray")
    return module.scalar(dtype, data)


def _latin1_encode(text, encoding="latin1"):
    """`_codecs.encode` as protocol-2 pickles of bytes use it; any other codec is refused."""
    if not isinstance(text, str) or not isinstance(encoding, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise Refused(f"_codecs.encode with {encoding!r} is not allowed (only latin-1)")
    return text.encode("latin1")


class _Unpickler(pickle.Unpickler):
    """Resolves only numpy's array, dtype and scalar reconstruction and the latin-1 codec, each
    through a checked stand-in."""

    def find_class(self, module, name):
        key = (module, name)
        if key in _RECONSTRUCT:
            return _reconstruct
        if key in _SCALAR:
            return _scalar
        if key == ("numpy", "ndarray"):
            return _CheckedArray
        if key == ("numpy", "dtype"):
            return _dtype
        if key == ("_codecs", "encode"):
            return _latin1_encode
        raise Refused(f"it asks for {module}.{name}, which is not allowed (only numpy arrays and plain values "
                      f"are loaded)")


def _check_opcodes(data: bytes) -> None:
    """Walk the pickle's opcodes (pickletools reads each argument from the data, so a declared
    length past the end fails here without being allocated); memo indices must be sequential."""
    stored = 0
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name in _MEMO_PUTS:
            if not isinstance(arg, int) or arg < 0 or arg > stored:
                raise Refused(f"memo index {arg} after {stored} entries (a pickler stores them in order)")
            if arg == stored:
                stored += 1
        elif op.name == "MEMOIZE":
            stored += 1


def _plain(obj, seen: dict):
    """`obj` with every _CheckedArray turned into a plain ndarray view (dicts, lists, tuples);
    each object converted once (`seen`: id -> result), so shared references cost nothing
    and a cycle is refused."""
    if not isinstance(obj, (_CheckedArray, dict, list, tuple)):
        return obj
    key = id(obj)
    if key in seen:
        if seen[key] is _IN_PROGRESS:
            raise Refused("the pickle holds a cycle, which plain data never does")
        return seen[key]
    seen[key] = _IN_PROGRESS
    if isinstance(obj, _CheckedArray):
        out = obj.view(np.ndarray)
    elif isinstance(obj, dict):
        out = {k: _plain(v, seen) for k, v in obj.items()}
    else:
        out = type(obj)(_plain(v, seen) for v in obj)
    seen[key] = out
    return out
