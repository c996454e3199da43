"""The weights file and the samples file of a host project (runtime/et_weights.h reads both).

A host project above EMBED_LIMIT_BYTES of state keeps its weights out of model.c: the C text
of a 100 M-parameter model would be a gigabyte and take gcc minutes, where a raw blob is
written and read in a second. The format is a small checked header rather than safetensors:
safetensors' header is JSON, which the C side would have to parse without a library; ours
is fixed-width little-endian fields that ~150 lines of C check completely.

Weights file (little endian), version 2::

    header (64 B): magic "ETWEIGHT", u32 version, u32 count, u64 table hash,
                   u64 file bytes, zero padding
    table: per tensor u32 name bytes, u32 dtype code, u64 bytes, u64 offset,
           u32 CRC-32 of its data, u32 zero, the name, zero padding to 8 bytes
    data

The table hash is FNV-1a 64 over each tensor's name, a zero byte and its byte size (8 bytes
little endian), in the program's state order: the C loader computes it from the program's own
table (model.h's et_state_name / et_state_bytes), so another model's file is refused before
anything is read, and then checks each entry's name and size.

What a reader checks (read_weights here, et_load_weights in C; a file breaking any is refused
with the tensor named): the file's size is the header's; a name is at most MAX_NAME_BYTES and
lies inside the file (the C loader: exactly its own tensor's name, compared before it is read);
each tensor's offset is a multiple of DATA_ALIGN, at or after the end of the table (never in the
header or table), at or after the end of the tensor before it in the table (tensors neither
overlap nor go back) and its bytes end inside the file; and the CRC-32 (zlib's: ISO-HDLC,
reflected 0xEDB88320, initial and final xor 0xFFFFFFFF) of its bytes is the table's, so a
flipped bit is refused. The C loader checks each tensor's CRC where it puts it: a tensor read
into RAM after the read, a mapped frozen one a MiB at a time, each MiB's pages dropped after it
is summed (so the check never holds the file resident). et_save_weights and et_save_tensors
write the CRCs of what they write. Version 1 files (no CRC) are refused: emit the project again.

Mapped frozen weights (standalone host builds, ET_MAP_WEIGHTS=1, the Makefile's default on
Linux): the frozen tensors (layout kind "flash": neither trained, optimizer state nor written in
place) are not read into RAM: et_weights.h maps the weights file read-only and points them into
the mapping (model.c's et_bind_state); after a node that reads one (of at least
RELEASE_MIN_BYTES: all), when the next node does not read it too, model.c drops its pages and those
2 MiB either side (madvise(MADV_DONTNEED); a fault maps the page cache's whole folio around the
page it needs, so neighbours' pages come in too; the next read faults them back from the page
cache), so the resident frozen bytes are about the window one kernel reads
(memory/frozen_window.py models it). Trained tensors and optimizer state are read into RAM and
saved as before; the file must not be changed while the program runs.

Samples file::

    header (64 B): magic "ETSAMPLE", u32 version, u32 count, u64 input bytes,
                   u64 label bytes, zero padding
    count records: the input's bytes then the label's (as project.program_samples gives them)
"""
from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from .layout import CBackendError

#: a host project embeds its weights as C text up to this many bytes of state (about 4 MB of
#: C, a few seconds of gcc); above it they go to WEIGHTS_NAME, read at run time
EMBED_LIMIT_BYTES = 1 << 20
WEIGHTS_NAME, SAMPLES_NAME = "weights.bin", "samples.bin"
WEIGHTS_MAGIC, SAMPLES_MAGIC = b"ETWEIGHT", b"ETSAMPLE"
#: 2: a CRC-32 of each tensor's data in its table entry (1: none)
VERSION = 2
HEADER_BYTES = 64
#: the samples file's format version (its own: unchanged by the weights file's)
SAMPLES_VERSION = 1
#: the longest tensor name a file may hold (a damaged length is refused before anything is read)
MAX_NAME_BYTES = 4096
#: each tensor's bytes start at a multiple of this (a cache line; the C side reads in place)
DATA_ALIGN = 64
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, count, hash / input bytes, file bytes / label bytes
_ENTRY = struct.Struct("<IIQQII")  # name bytes, dtype code, bytes, offset, CRC-32 of the data, zero
#: dtype codes of the table (the C side only checks byte sizes; readers in Python get the dtype)
DTYPE_CODES = {np.dtype(t): k for k, t in enumerate(("float32", "int8", "int32", "int64", "uint8", "int16",
                                                      "float16", "float64"), start=1)}
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


#: a mapped frozen tensor of at least this many bytes has its pages released after the nodes that read it:
#: every one, as reading even a small one maps its neighbours' pages (the page cache's folio around it),
#: which stayed resident (57 MB of SmolLM2-135M's norm weights' neighbours) until its release dropped them
RELEASE_MIN_BYTES = 0


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
        if len(raw) > MAX_NAME_BYTES:
            raise WeightsFileError(f"{name[:60]}...: a tensor name of {len(raw)} B (at most {MAX_NAME_BYTES})")
        crc = zlib.crc32(a.reshape(-1).view(np.uint8))
        table += (_ENTRY.pack(len(raw), DTYPE_CODES[a.dtype], a.nbytes, end, crc, 0)
                  + raw.ljust(_align(len(raw), 8), b"\0"))
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
    entries, pos = [], HEADER_BYTES
    for i in range(count):
        if pos + _ENTRY.size > size:
            raise WeightsFileError(f"{path}: short table (entry {i} of {count} past the end of the file)")
        n, code, nbytes, off, crc, _ = _ENTRY.unpack_from(data, pos)
        if n > MAX_NAME_BYTES or pos + _ENTRY.size + n > size:
            raise WeightsFileError(f"{path}: tensor {i}: a name of {n} B (at most {MAX_NAME_BYTES}, inside the file)")
        name = data[pos + _ENTRY.size:pos + _ENTRY.size + n].decode(errors="replace")
        pos += _ENTRY.size + _align(n, 8)
        if code not in codes or nbytes % codes[code].itemsize:
            raise WeightsFileError(f"{path}: entry {name!r} is damaged (dtype code {code}, {nbytes} B at {off})")
        entries.append((name, codes[code], nbytes, off, crc))
    out, prev, view = {}, None, memoryview(data)
    for name, dtype, nbytes, off, crc in entries:
        bad = data_offset_problem(off, nbytes, pos, prev, size)
        if bad:
            raise WeightsFileError(f"{path}: tensor {name}: data offset {off}: {bad}")
        raw = view[off:off + nbytes]  # no copy
        if zlib.crc32(raw) != crc:
            raise WeightsFileError(f"{path}: tensor {name}: its data do not match its checksum (CRC-32 "
                                   f"{zlib.crc32(raw):08x}, the table says {crc:08x}): the file is damaged")
        out[name] = np.frombuffer(raw, dtype).copy()
        prev = (name, off + nbytes)
    if table_hash([(k, v.nbytes) for k, v in out.items()]) != h:
        raise WeightsFileError(f"{path}: its table does not match its hash (damaged)")
    return out


def data_offset_problem(off: int, nbytes: int, table_end: int, prev, size: int) -> str:
    """Why a tensor's data offset breaks the format (the module docstring), or "": `table_end` the
    end of the header and table, `prev` (name, end of its bytes) of the tensor before it or None,
    `size` the file's bytes. et_weights.h's et_offset_problem says the same."""
    if off % DATA_ALIGN:
        return f"not {DATA_ALIGN}-byte aligned"
    if off < table_end:
        return f"inside the header or table (which end at {table_end})"
    if prev is not None and off < prev[1]:
        return f"overlaps tensor {prev[0]} (which ends at {prev[1]})"
    if off > size or nbytes > size - off:
        return f"{nbytes} B there run past the end of the file ({size} B)"
    return ""


def samples_blob(inputs: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> bytes:
    """The samples file of (input, label) raw byte arrays (project.program_samples)."""
    xs = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in inputs]
    ys = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in labels]
    if not xs or len(xs) != len(ys) or len({a.size for a in xs}) != 1 or len({a.size for a in ys}) != 1:
        raise WeightsFileError("samples: give at least one (input, label) pair, all inputs (and labels) of one size")
    head = _HEADER.pack(SAMPLES_MAGIC, SAMPLES_VERSION, len(xs), xs[0].size, ys[0].size).ljust(HEADER_BYTES, b"\0")
    return head + b"".join(x.tobytes() + y.tobytes() for x, y in zip(xs, ys))


#: model.c's part of mapped frozen weights (state_decls, before the frozen tensors' pointers): the
#: switch (off unless the build sets it: the library keeps its arrays), which tensors point into the
#: file (et_bind_state), and the release of a file-backed tensor's whole pages
MAPPED_DECLS = r"""
#ifndef ET_MAP_WEIGHTS
#define ET_MAP_WEIGHTS 0
#endif
#if ET_MAP_WEIGHTS
#include <sys/mman.h>
#include <unistd.h>
/* 1: state tensor i points into the mapped weights file (its pages may be dropped: read again from the file) */
static unsigned char et_state_file_backed[ET_NUM_STATE + 1];
static long long et_released_weight_bytes;
static uintptr_t et_wmap_lo, et_wmap_hi; /* the mapping's pages (et_weight_map_range) */
void et_weight_map_range(const void *p, unsigned long n) {
  const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  et_wmap_lo = (uintptr_t)p, et_wmap_hi = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);
}
/* drop this process's pages of file-backed tensor i at [p, p + n), and ET_RELEASE_SLACK bytes either
   side within the mapping: a fault maps the page cache's (large) folio around the page it needs, so
   reading a tensor maps pages of its neighbours, which would otherwise stay. Dropping a page that is
   still needed is safe (read-only, file-backed): the next read faults it in again */
#ifndef ET_RELEASE_SLACK
#define ET_RELEASE_SLACK (2u << 20)
#endif
static void et_release_weight(int i, const void *p, size_t n) {
  static uintptr_t pg;
  if (!et_state_file_backed[i] || !et_wmap_hi) return; /* memory of its own (no mapping): keep it */
  if (!pg) pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p > et_wmap_lo + ET_RELEASE_SLACK ? (uintptr_t)p - ET_RELEASE_SLACK : et_wmap_lo;
  uintptr_t b = (uintptr_t)p + n + ET_RELEASE_SLACK < et_wmap_hi ? (uintptr_t)p + n + ET_RELEASE_SLACK : et_wmap_hi;
  a &= ~(pg - 1), b = (b + pg - 1) & ~(pg - 1);
  if (b > a && madvise((void *)a, b - a, MADV_DONTNEED) == 0) et_released_weight_bytes += (long long)(b - a);
}
long long et_weight_release_bytes(void) { return et_released_weight_bytes; }
#define ET_RELEASE_WEIGHT(i, p, n) et_release_weight((i), (p), (n))
#else
long long et_weight_release_bytes(void) { return 0; }
void et_weight_map_range(const void *p, unsigned long n) { (void)p, (void)n; }
#define ET_RELEASE_WEIGHT(i, p, n) ((void)0)
#endif"""


def mapped_state_decl(st) -> str:
    """The declaration of a frozen state tensor of a program whose weights are in the weights
    file: a pointer into the mapping (bound by et_bind_state) when ET_MAP_WEIGHTS, else an array."""
    n = max(st.numel, 1)
    return "\n".join(["#if ET_MAP_WEIGHTS",
                      f"static const {st.ctype} *{st.c_name}; /* frozen: in the mapped weights file */",
                      "#else", f"static {st.ctype} {st.c_name}[{n}] ET_ALIGNED(16);", "#endif"])


def released_reads(layout, key: str, min_bytes: int = RELEASE_MIN_BYTES) -> list[tuple]:
    """Per node of graph `key`: the mappable frozen tensors (layout kind "flash") of at least
    `min_bytes` it reads, as StateArrays (through views: storage roots; a node whose output is a
    view of one does not read it)."""
    from .kernels import EmitContext

    ctx, roots = EmitContext(layout, key), layout.graphs[key].roots
    out = []
    for n in layout.graphs[key].graph.nodes:
        seen, views = {}, {roots[o] for o in n.outputs}
        for v in n.inputs:
            st = ctx.state_of(v) if roots[v] not in views else None  # a view of it reads nothing
            if st is not None and st.kind == "flash" and st.numel * np.dtype(st.dtype).itemsize >= min_bytes:
                seen[st.name] = st
        out.append(tuple(seen.values()))
    return out


def release_hooks(layout, key: str, inner=None, min_bytes: int = RELEASE_MIN_BYTES, schedule=None):
    """For graph_function: `inner`'s hooks (node -> (before, after)) with, after each node, the
    release of the large frozen tensors it read that the next node does not read
    (ET_RELEASE_WEIGHT: a no-op unless the build maps the weights); `inner` itself when no node
    reads one. `schedule` (the program's, for the train graph): when its problem was built with
    mapped_weights, the releases are the schedule's instead (remat/weights.weight_releases: a
    weight it keeps stays resident, one it pages in again is dropped after its reader)."""
    reads = released_reads(layout, key, min_bytes)
    if not any(reads):
        return inner
    nodes = layout.graphs[key].graph.nodes
    pos = {id(n): i for i, n in enumerate(nodes)}
    planned = None
    if key == "train" and schedule is not None and getattr(schedule.problem, "mapped_weights", False):
        from ...remat.weights import weight_releases

        by_name = {st.name: st for st in layout.states.values() if st.kind == "flash"}
        planned = [[by_name[n] for n in r if n in by_name] for r in weight_releases(schedule, layout.graphs[key].graph)]

    def hooks(node):
        before, after = inner(node) if inner is not None else ([], [])
        i = pos[id(node)]
        if planned is not None:
            drop = planned[i]
        else:
            later = {st.name for st in reads[i + 1]} if i + 1 < len(reads) else set()
            drop = [st for st in reads[i] if st.name not in later]
        rel = [f"ET_RELEASE_WEIGHT({st.index}, {st.c_name}, {st.numel * np.dtype(st.dtype).itemsize});" for st in drop]
        return before, [*after, *rel]
    return hooks


def host_step_ram(layout, mapped: bool = True, key: str = "train", release_min: int = RELEASE_MIN_BYTES,
                  guarded: bool = True) -> dict:
    """The modelled RAM of the standalone host binary's step (bytes, the runtime's own overhead
    not included): {"arena", "ram_state" (state read into RAM: trained tensors, optimizer
    state, written buffers, split weights), "frozen" (the mappable frozen tensors' bytes),
    "frozen_window" (memory/frozen_window.py: the most of them resident at once when mapped),
    "guard" (the checked step's backup or second copy of each array the step writes: the
    Makefile's STEP_GUARD=1, step_guard.py; 0 when not `guarded`), "modelled" (arena + ram_state
    + guard + the window when `mapped`, else + every frozen byte)}."""
    from ...memory.frozen_window import frozen_window
    from .step_guard import guarded_arrays

    def nbytes(st):
        return st.numel * np.dtype(st.dtype).itemsize

    frozen = {st.name: nbytes(st) for st in layout.states.values() if st.kind == "flash"}
    ram_state = sum(nbytes(st) for st in layout.states.values() if st.kind != "flash")
    reads = [[st.name for st in r] for r in released_reads(layout, key, 0)]
    win = frozen_window(reads, frozen, release_min)
    frozen_ram = win.peak_bytes if mapped else win.total_bytes
    guard = sum(nbytes(st) for st in guarded_arrays(layout)) if guarded else 0
    return {"arena": layout.arena_bytes, "ram_state": ram_state, "frozen": win.total_bytes,
            "frozen_window": win.peak_bytes, "window_node": win.at_node, "guard": guard,
            "modelled": layout.arena_bytes + ram_state + guard + frozen_ram}
