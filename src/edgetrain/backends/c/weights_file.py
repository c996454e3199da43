"""The weights file and the samples file of a host project (runtime/et_weights.h reads both).

A host project above EMBED_LIMIT_BYTES of state keeps its weights out of model.c: the C text
of a 100 M-parameter model would be a gigabyte and take gcc minutes, where a raw blob is
written and read in a second. The format is a small checked header rather than safetensors:
safetensors' header is JSON, which the C side would have to parse without a library; ours
is fixed-width little-endian fields that ~150 lines of C check completely.

Weights file (little endian; every tensor's bytes at a 64-byte aligned offset)::

    header (64 B): magic "ETWEIGHT", u32 version, u32 count, u64 table hash,
                   u64 file bytes, zero padding
    table: per tensor u32 name bytes, u32 dtype code, u64 bytes, u64 offset, the name,
           zero padding to 8 bytes
    data

The table hash is FNV-1a 64 over each tensor's name, a zero byte and its byte size (8 bytes
little endian), in the program's state order: the C loader computes it from the program's own
table (model.h's et_state_name / et_state_bytes), so another model's file is refused before
anything is read, and then checks each entry's name and size.

Samples file::

    header (64 B): magic "ETSAMPLE", u32 version, u32 count, u64 input bytes,
                   u64 label bytes, zero padding
    count records: the input's bytes then the label's (as project.program_samples gives them)
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from .layout import CBackendError

#: a host project embeds its weights as C text up to this many bytes of state (about 4 MB of
#: C, a few seconds of gcc); above it they go to WEIGHTS_NAME, read at run time
EMBED_LIMIT_BYTES = 1 << 20
WEIGHTS_NAME, SAMPLES_NAME = "weights.bin", "samples.bin"
WEIGHTS_MAGIC, SAMPLES_MAGIC = b"ETWEIGHT", b"ETSAMPLE"
VERSION = 1
HEADER_BYTES = 64
#: each tensor's bytes start at a multiple of this (a cache line; the C side reads in place)
DATA_ALIGN = 64
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, count, hash / input bytes, file bytes / label bytes
_ENTRY = struct.Struct("<IIQQ")  # name bytes, dtype code, bytes, offset
#: dtype codes of the table (the C side only checks byte sizes; readers in Python get the dtype)
DTYPE_CODES = {np.dtype(t): k for k, t in enumerate(("float32", "int8", "int32", "int64", "uint8", "int16",
                                                      "float16", "float64"), start=1)}
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


class WeightsFileError(CBackendError):
    """A weights or samples file that is not what the program needs (bad magic, version,
    model, truncated)."""


def table_hash(entries: Sequence[tuple[str, int]]) -> int:
    """FNV-1a 64 of (name, byte size) pairs in order (what et_weights.h computes)."""
    h = _FNV_OFFSET
    for name, nbytes in entries:
        for b in name.encode() + b"\0" + struct.pack("<Q", nbytes):
            h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def _align(n: int, a: int = DATA_ALIGN) -> int:
    return (n + a - 1) // a * a


def weights_blob(tensors: Sequence[tuple[str, np.ndarray]]) -> bytes:
    """The weights file holding `tensors` ((name, array) in the program's state order)."""
    arrays = [(name, np.ascontiguousarray(a)) for name, a in tensors]
    for name, a in arrays:
        if a.dtype not in DTYPE_CODES:
            raise WeightsFileError(f"{name}: dtype {a.dtype} has no code in the weights file format")
    table = b""
    offsets = []
    table_end = HEADER_BYTES + sum(_ENTRY.size + _align(len(n.encode()), 8) for n, _ in arrays)
    end = _align(table_end)
    for name, a in arrays:
        raw = name.encode()
        table += _ENTRY.pack(len(raw), DTYPE_CODES[a.dtype], a.nbytes, end) + raw.ljust(_align(len(raw), 8), b"\0")
        offsets.append(end)
        end = _align(end + a.nbytes)
    h = table_hash([(n, a.nbytes) for n, a in arrays])
    out = bytearray(end)
    out[:HEADER_BYTES] = _HEADER.pack(WEIGHTS_MAGIC, VERSION, len(arrays), h, end).ljust(HEADER_BYTES, b"\0")
    out[HEADER_BYTES:HEADER_BYTES + len(table)] = table
    for (_, a), off in zip(arrays, offsets):
        out[off:off + a.nbytes] = a.reshape(-1).view(np.uint8).tobytes()
    return bytes(out)


def program_weights(prog, layout) -> bytes:
    """The weights file of `prog` for the C program laid out as `layout` (its state tensors in
    the order et_state_name numbers them; optimizer state as the program holds it)."""
    return weights_blob([(st.name, np.asarray(prog.state[st.name], dtype=st.dtype).reshape(st.shape))
                         for st in layout.states.values()])


def read_weights(path) -> dict[str, np.ndarray]:
    """{name: array} of a weights file (as the C program saves it after training), checked."""
    data = Path(path).read_bytes()
    if len(data) < HEADER_BYTES:
        raise WeightsFileError(f"{path}: short file ({len(data)} B): not a weights file")
    magic, version, count, h, size = _HEADER.unpack_from(data)
    if magic != WEIGHTS_MAGIC:
        raise WeightsFileError(f"{path}: not an edgetrain weights file (magic {magic!r})")
    if version != VERSION:
        raise WeightsFileError(f"{path}: format version {version}; this reader reads {VERSION}")
    if len(data) != size:
        raise WeightsFileError(f"{path}: {len(data)} B, its header says {size} B (truncated?)")
    codes = {k: t for t, k in DTYPE_CODES.items()}
    out, pos = {}, HEADER_BYTES
    for _ in range(count):
        n, code, nbytes, off = _ENTRY.unpack_from(data, pos)
        name = data[pos + _ENTRY.size:pos + _ENTRY.size + n].decode()
        pos += _ENTRY.size + _align(n, 8)
        if code not in codes or off + nbytes > size:
            raise WeightsFileError(f"{path}: entry {name!r} is damaged (dtype code {code}, {nbytes} B at {off})")
        out[name] = np.frombuffer(data, codes[code], nbytes // codes[code].itemsize, off).copy()
    if table_hash([(k, v.nbytes) for k, v in out.items()]) != h:
        raise WeightsFileError(f"{path}: its table does not match its hash (damaged)")
    return out


def samples_blob(inputs: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> bytes:
    """The samples file of (input, label) raw byte arrays (project.program_samples)."""
    xs = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in inputs]
    ys = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in labels]
    if not xs or len(xs) != len(ys) or len({a.size for a in xs}) != 1 or len({a.size for a in ys}) != 1:
        raise WeightsFileError("samples: give at least one (input, label) pair, all inputs (and labels) of one size")
    head = _HEADER.pack(SAMPLES_MAGIC, VERSION, len(xs), xs[0].size, ys[0].size).ljust(HEADER_BYTES, b"\0")
    return head + b"".join(x.tobytes() + y.tobytes() for x, y in zip(xs, ys))
