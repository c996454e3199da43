"""CIFAR-10 in its published "python version": the archive cifar-10-python.tar.gz
(https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz) or the folder cifar-10-batches-py
it extracts to. Each batch (data_batch_1..5, test_batch) is a Python 2 pickle of a dict
{b"data": uint8 (N, 3072) rows of 1024 red, 1024 green, then 1024 blue pixels (32x32,
row-major), b"labels": [N ints], b"batch_label", b"filenames"}; batches.meta names the classes.

A pickle can run any code while it loads, and this one comes from a path the user gives, so
it is read with safepickle.loads, which builds numpy arrays and nothing else besides the
dicts, lists, bytes and numbers the pickle opcodes make themselves, and checks every size the
pickle declares before it is allocated: any other global (os.system, builtins.eval, ...) is
refused with DataError before it is called. Members are read from the archive into memory
(nothing is extracted to disk), each at most MAX_MEMBER_BYTES."""
from __future__ import annotations

import tarfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np

from ..safepickle import Refused, loads
from .mnist import DataError

CIFAR10_PYTHON_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
BATCH_FOLDER = "cifar-10-batches-py"
SPLIT_BATCHES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
META = "batches.meta"
SIDE = 32
PIXELS = 3 * SIDE * SIDE
#: a real batch is 10,000 images of 3,072 bytes plus names (about 31 MB pickled): a member
#: claiming more is not CIFAR-10 and is not read (a small archive cannot make us allocate GBs)
MAX_MEMBER_BYTES = 40 * 2**20


def _unpickle(raw: bytes, where: str) -> dict:
    try:
        obj = loads(raw, encoding="bytes")  # Python 2's str as bytes
    except Refused as err:
        raise DataError(f"{where}: refused to load: {err}") from None
    except Exception as err:  # a malformed pickle raises many types (EOFError, ValueError, TypeError, ...)
        raise DataError(f"{where}: not a CIFAR-10 batch pickle ({type(err).__name__}: {err})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: not a CIFAR-10 batch (a {type(obj).__name__}, expected a dict)")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _read_members(path: Path, names: tuple[str, ...], decode) -> dict[str, object]:
    """{name: decode(raw bytes, where)} of the batch files `names`, from the folder or the
    archive; each is decoded as soon as it is read (one raw batch in memory at a time)."""
    if path.is_dir():
        folder = path / BATCH_FOLDER if (path / BATCH_FOLDER).is_dir() else path
        found = {}
        for name in names:
            file = folder / name
            if not file.is_file():
                raise DataError(f"{folder} has no {name}: not an extracted {BATCH_FOLDER} folder "
                                f"(from {CIFAR10_PYTHON_URL})")
            if file.stat().st_size > MAX_MEMBER_BYTES:
                raise DataError(f"{file} is {file.stat().st_size} bytes, more than a CIFAR-10 batch "
                                f"({MAX_MEMBER_BYTES} at most)")
            found[name] = decode(file.read_bytes(), str(file))
        return found
    found, places = {}, {}
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                name = PurePosixPath(member.name).name
                if name not in names:
                    continue
                where = f"{path}:{member.name}"
                if not member.isfile():
                    raise DataError(f"{where} is not a regular file")
                if name in found:
                    raise DataError(f"{path} holds {name} twice ({places[name]} and {where})")
                if member.size > MAX_MEMBER_BYTES:
                    raise DataError(f"{where} is {member.size} bytes, more than a CIFAR-10 batch "
                                    f"({MAX_MEMBER_BYTES} at most)")
                places[name] = where
                found[name] = decode(archive.extractfile(member).read(), where)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise DataError(f"cannot read {path} as cifar-10-python.tar.gz: {err}") from None
    missing = [n for n in names if n not in found]
    if missing:
        raise DataError(f"{path} has no {', '.join(missing)}: not CIFAR-10's python archive "
                        f"(from {CIFAR10_PYTHON_URL})")
    return found


def _check_meta(meta: dict, where: str, classes: tuple[str, ...]) -> None:
    names = meta.get("label_names")
    if not isinstance(names, list):
        raise DataError(f"{where}: no label_names list: not CIFAR-10's batches.meta")
    decoded = tuple(n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names)
    if decoded != classes:
        raise DataError(f"{where}: classes {list(decoded)} are not CIFAR-10's {list(classes)}")


def _batch_arrays(batch: dict, where: str, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != PIXELS:
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{where}: data is {what}, expected uint8 (N, {PIXELS})")
    if not isinstance(labels, (list, np.ndarray)) or len(labels) != len(data) \
            or not all(isinstance(v, (int, np.integer)) and 0 <= v < n_classes for v in labels):
        raise DataError(f"{where}: labels must be {len(data)} integers in 0..{n_classes - 1}")
    images = data.reshape(len(data), 3, SIDE, SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), np.asarray(labels, dtype=np.int64)


def read_cifar10_python(path, split: str, classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 32, 32, 3) RGB, labels int64 (N,)) of the whole 'train' or 'test'
    split in file order, from cifar-10-python.tar.gz or a cifar-10-batches-py folder."""
    path = Path(path)
    batches = SPLIT_BATCHES[split]

    def decode(raw: bytes, where: str):
        content = _unpickle(raw, where)
        if where.endswith(META):
            return _check_meta(content, where, classes)
        return _batch_arrays(content, where, len(classes))

    members = _read_members(path, (META, *batches), decode)
    return (np.concatenate([members[name][0] for name in batches]),
            np.concatenate([members[name][1] for name in batches]))
