"""Reading a tiny-training model file (the paper's int8 models) without trusting it.

The file is a torch.save zip archive whose `data.pkl` holds dicts, lists, numbers and numpy
arrays (format: shared/assets/README.md). A pickle can run code and a zip member can inflate
to any size, so the file is read with bounds that hold before anything is allocated:

- the zip member's declared size is checked against MAX_MEMBER_BYTES before it is read, and
  the member is inflated no further than that declared size, whatever its stream holds (a
  611 KB archive once inflated a 600 MB member: 1.4 GB of memory);
- the pickle's opcodes are walked once with pickletools (which reads what is there and never
  allocates a declared length up front, where the C unpickler allocates it first: an 8-byte
  length of 600 MB in a 20-byte pickle cost 600 MB), so a length that runs past the data is
  refused first, and so is a memo index beyond the entries stored so far (the C unpickler
  grows its memo to twice the index: LONG_BINPUT 2**27 in a 10-byte pickle cost 2 GB);
- the unpickler names only numpy's array reconstruction, plain numeric dtypes and the latin-1
  codec; arrays are rebuilt through a subclass that checks each array's state (numeric dtype,
  data exactly its shape's bytes) before numpy sees it (numpy 2.4 crashes on an object array
  whose list is shorter than its shape) and that cannot be called directly to allocate;
- anything else that goes wrong (a truncated or bit-flipped archive, garbage, a pickle of the
  wrong things) is a ModelFileError naming the file, never another exception type."""
from __future__ import annotations

import codecs
import importlib
import io
import math
import pickle
import pickletools
import warnings
import zipfile
from pathlib import Path

import numpy as np

#: the largest data.pkl of the paper's three models is 1,023,991 bytes (mcunet-5fps; the others
#: 617 KB and 715 KB): an MCU model's int8 weights fit a flash of a few MB. 32 MiB is 32 times
#: that, and bounds what one file can make the loader allocate (a few times this)
MAX_MEMBER_BYTES = 32 << 20
#: the member of the archive that holds the model
DATA_MEMBER = "data.pkl"
#: dtype kinds a model file's arrays and scalars may have: bool, signed, unsigned, float
_NUMERIC_KINDS = "biuf"
_RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
_SCALAR = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
_MEMO_PUTS = ("PUT", "BINPUT", "LONG_BINPUT")
_IN_PROGRESS = object()


class ModelFileError(ValueError):
    """A model file is missing, not a tiny-training model, corrupt, or larger than allowed."""


class _Refused(pickle.UnpicklingError):
    """The pickle asked for something a tiny-training model file never holds."""


class _CheckedArray(np.ndarray):
    """What the pickle's arrays are rebuilt as: `__setstate__` checks the state first; the
    class cannot be called (np.ndarray(shape) would allocate any size it is given)."""

    def __new__(cls, *args, **kwargs):
        raise _Refused("numpy.ndarray may only be rebuilt from its pickled data, not called")

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) != 5:
            raise _Refused("an array's pickled state is not numpy's (version, shape, dtype, fortran, data)")
        version, shape, dtype, fortran, data = state
        dtype = _canonical(dtype)
        if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise _Refused(f"an array's shape {shape!r} is not a tuple of sizes")
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            raise _Refused(f"an array of shape {shape} and dtype {dtype} comes with "
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
        raise _Refused(f"dtype {dtype!r} is not a plain numeric dtype")
    return canonical


def _dtype(obj, align=False, copy=False):
    """`numpy.dtype(obj, align, copy)` as a pickle calls it, always as a fresh copy: the BUILD
    that follows sets the dtype's state, and on numpy's shared instance (copy=False) it would
    change int8 for the whole process (a bit flip did: numpy then failed on every int8 array)."""
    if not isinstance(obj, (str, bytes)):
        raise _Refused(f"numpy.dtype({obj!r}) is not how numpy pickles a dtype")
    try:
        dtype = np.dtype(obj)
    except (TypeError, ValueError) as err:
        raise _Refused(f"numpy.dtype({obj!r}): {err}") from None
    return np.dtype(_canonical(dtype), copy=True)


def _reconstruct(subtype, shape, typecode):
    """numpy's `_reconstruct(ndarray, (0,), b'b')`: an empty array that BUILD then fills."""
    if subtype is not _CheckedArray or not isinstance(shape, tuple) or any(
            not isinstance(n, int) or n < 0 for n in shape) or math.prod(shape) > MAX_MEMBER_BYTES:
        raise _Refused(f"_reconstruct({subtype!r}, {shape!r}, ...) is not how numpy pickles an array")
    return np.ndarray.__new__(_CheckedArray, shape, _dtype(typecode))  # (its dtype: a fresh copy)


def _scalar(dtype, data):
    dtype = _canonical(dtype)
    module = importlib.import_module("numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray")
    return module.scalar(dtype, data)


def _latin1_encode(text, encoding="latin1"):
    """`_codecs.encode` as protocol-2 pickles of bytes use it; any other codec is refused."""
    if not isinstance(text, str) or not isinstance(encoding, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise _Refused(f"_codecs.encode with {encoding!r} is not allowed in a model file")
    return text.encode("latin1")


class _Unpickler(pickle.Unpickler):
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
        raise _Refused(f"{module}.{name} is not allowed in a model file")


def _check_opcodes(data: bytes) -> None:
    """Walk the pickle's opcodes (pickletools reads each argument from the data, so a declared
    length past the end fails here without being allocated); memo indices must be sequential."""
    stored = 0
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name in _MEMO_PUTS:
            if not isinstance(arg, int) or arg < 0 or arg > stored:
                raise _Refused(f"memo index {arg} after {stored} entries (a pickler stores them in order)")
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
            raise _Refused("the pickle holds a cycle, which a model file never does")
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


def read_member(path: Path) -> bytes:
    """The bytes of the archive's data.pkl, at most MAX_MEMBER_BYTES (checked before reading)."""
    with zipfile.ZipFile(path) as z:
        info = next((i for i in z.infolist() if i.filename.endswith(DATA_MEMBER)), None)
        if info is None:
            raise ModelFileError(f"{path} has no {DATA_MEMBER}: not a tiny-training model file")
        if info.file_size > MAX_MEMBER_BYTES:
            raise ModelFileError(f"{path}: its {info.filename} declares {info.file_size:,} bytes, more than a "
                                 f"tiny-training model file holds ({MAX_MEMBER_BYTES:,} at most): not read")
        with z.open(info) as f:  # inflates at most what is asked for; stops at the declared size (CRC checked)
            return f.read(info.file_size + 1)


def load_tiny_training(path) -> dict:
    """The raw dict of a tiny-training model file (format: shared/assets/README.md)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"no model file at {path}; the paper's int8 models are in the assets' "
                             f"tiny-training/ folder (mbv2-w0.35.pkl, mcunet-5fps.pkl, proxyless-w0.3.pkl)")
    try:
        data = read_member(path)
        with warnings.catch_warnings():  # a corrupt pickle's odd strings and dtype codes are errors, not news
            warnings.simplefilter("ignore", DeprecationWarning)
            _check_opcodes(data)
            d = _plain(_Unpickler(io.BytesIO(data)).load(), {})
    except ModelFileError:
        raise
    except _Refused as err:
        raise ModelFileError(f"{path}: refused to load: {err}") from None
    except Exception as err:  # a corrupt zip or pickle raises many types (BadZipFile, UnicodeDecodeError, ...)
        raise ModelFileError(f"cannot read {path}: corrupt or not a tiny-training model file "
                             f"({type(err).__name__}: {err})") from None
    if not isinstance(d, dict) or not {"first_conv", "blocks", "classifier"} <= set(d):
        what = f"keys {sorted(map(str, d))[:8]}" if isinstance(d, dict) else f"a {type(d).__name__}"
        raise ModelFileError(f"{path} is not a tiny-training model ({what})")
    return d
