"""A small CIFAR-10 in the published "python version" format, made by the tests: a
cifar-10-batches-py folder (batches.meta, data_batch_1..5, test_batch) whose files are pickled
as Python 2's cPickle.dump(obj, f, 2) wrote the real ones (str as SHORT_BINSTRING/BINSTRING,
numpy arrays through numpy.core.multiarray._reconstruct), and its cifar-10-python.tar.gz."""
from __future__ import annotations

import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np

from edgetrain.data.cifar import CIFAR10_CLASSES

BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
PER_CLASS = 2  # images of each class in each batch


def py2_pickle(obj) -> bytes:
    """`obj` (dicts, lists, bytes, ints, uint8 arrays) in the bytes Python 2 writes with protocol 2."""
    out = bytearray(b"\x80\x02")

    def string(b: bytes):
        out.extend(b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b)

    def integer(v: int):
        out.extend(b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v))

    def emit(o):
        if isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                emit(k)
                emit(v)
            out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                emit(v)
            out.extend(b"e")
        elif isinstance(o, bytes):
            string(o)
        elif isinstance(o, int):
            integer(o)
        elif isinstance(o, np.ndarray) and o.dtype == np.uint8:
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n")
            integer(0)
            out.extend(b"\x85")  # TUPLE1: shape (0,)
            string(b"b")
            out.extend(b"\x87R(")  # TUPLE3, REDUCE, MARK of the state
            integer(1)
            out.extend(b"(")
            for d in o.shape:
                integer(d)
            out.extend(b"tcnumpy\ndtype\n")
            string(b"u1")
            integer(0)
            integer(1)
            out.extend(b"\x87R(")
            integer(3)
            string(b"|")
            out.extend(b"NNN")
            integer(-1)
            integer(-1)
            integer(0)
            out.extend(b"tb\x89")  # dtype state, BUILD, NEWFALSE (not Fortran order)
            string(o.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    emit(obj)
    out.extend(b".")
    return bytes(out)


def batch_images(index: int) -> tuple[np.ndarray, list[int]]:
    """Batch `index`'s images (N, 32, 32, 3) and labels: image j of class c is filled with
    red = 10 c + index, green = 100 + j, blue = 200 + index (pixels say where they came from)."""
    labels = [c for _ in range(PER_CLASS) for c in range(len(CIFAR10_CLASSES))]
    images = np.empty((len(labels), 32, 32, 3), dtype=np.uint8)
    for j, c in enumerate(labels):
        images[j] = (10 * c + index, 100 + j, 200 + index)
    images[:, 0, 1, 0] = 255  # one marked pixel: row 0, column 1, red; shows the layout
    return images, labels


def batch_dict(index: int) -> dict:
    images, labels = batch_images(index)
    rows = images.transpose(0, 3, 1, 2).reshape(len(images), 3 * 32 * 32)  # R plane, G plane, B plane
    name = BATCHES[index]
    title = b"testing batch 1 of 1" if name == "test_batch" else f"training batch {index + 1} of 5".encode()
    return {b"batch_label": title, b"labels": labels, b"data": np.ascontiguousarray(rows),
            b"filenames": [f"img_{index}_{j}.png".encode() for j in range(len(labels))]}


def make_batches_folder(root: Path, replace: dict | None = None) -> Path:
    """root/cifar-10-batches-py with every file; `replace` maps a file name to other bytes."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    meta = {b"num_cases_per_batch": PER_CLASS * 10, b"label_names": [c.encode() for c in CIFAR10_CLASSES],
            b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(py2_pickle(meta))
    for i, name in enumerate(BATCHES):
        (folder / name).write_bytes(py2_pickle(batch_dict(i)))
    (folder / "readme.html").write_text("<html>CIFAR-10</html>")
    for name, raw in (replace or {}).items():
        (folder / name).write_bytes(raw)
    return folder


def make_archive(root: Path, replace: dict | None = None) -> Path:
    """root/cifar-10-python.tar.gz holding cifar-10-batches-py/..., as the published archive."""
    folder = make_batches_folder(root / "src", replace)
    path = root / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    return path


class Payload:
    """Unpickling calls os.system(command): what an attacker's batch file would do."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        import os

        return os.system, (self.command,)


def malicious_pickle(command: str) -> bytes:
    return pickle.dumps({b"data": Payload(command), b"labels": []}, protocol=2)
