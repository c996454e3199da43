"""Probes of the standalone host binary (`emit_c(..., embed_weights=False)` + `make main`;
issue 34 items 18-20): a bad label, a lying weights file and a non-finite step each stop it
with a one-line message and a non-zero exit; it never reads out of bounds, never trains on
bytes that are not the tensor's, and never saves non-finite weights."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import weights_file as wf
from edgetrain.backends.c.layout import build_layout

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
IN, CLASSES, BATCH = 8, 3, 2
DIVERGED = 4  # the exit code of a diverged run (docs/reliability.md, app/divergence.py)
SIGSEGV = -11


def _model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(IN, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    # a frozen weight (mapped from the file: MAP_WEIGHTS=1 on Linux) after the trained first layer, whose
    # gradient carries a NaN input into its weights (a NaN before the ReLU would stop at it)
    m[2].weight.requires_grad_(False)
    return m


def _samples(n=3):
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(BATCH, IN)).astype(np.float32), np.array([i % CLASSES, (i + 1) % CLASSES]))
            for i in range(n)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(program, project folder) of the small MLP with a weights file, `make main` built."""
    d = tmp_path_factory.mktemp("probes")
    prog = et.compile(_model(), (_samples()[0][0],), optimizer=et.SGD(lr=0.1, momentum=0.9))
    out = prog.emit_c(d / "proj", samples=_samples(), embed_weights=False, graphs=("train",))
    subprocess.run(["make", "-s", "main", "BLAS=0"], cwd=out, check=True, capture_output=True, timeout=300)
    return prog, out


def _run(out, weights="weights.bin", samples="samples.bin", *args):
    return subprocess.run(["./main", str(weights), str(samples), *map(str, args)], cwd=out, capture_output=True,
                          text=True, timeout=120)


def _refused(r, *words):
    """The run stopped at load with one printable line on stderr holding `words`, no step taken."""
    assert r.returncode not in (0, SIGSEGV) and r.returncode > 0, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].isprintable(), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "step 1 loss" not in r.stdout
    return lines[0]


# --- 18: labels --------------------------------------------------------------------------------
def _samples_file(out, path, edit):
    """samples.bin of `out` with record k's (input float32 array, label int64 array) changed by edit(k, x, y)."""
    blob = bytearray((out / "samples.bin").read_bytes())
    count, nin, nlab = struct.unpack_from("<IQQ", blob, 12)
    for k in range(count):
        at = wf.HEADER_BYTES + k * (nin + nlab)
        x = np.frombuffer(blob, np.float32, nin // 4, at).copy()
        y = np.frombuffer(blob, np.int64, nlab // 8, at + nin).copy()
        edit(k, x, y)
        blob[at:at + nin] = x.tobytes()
        blob[at + nin:at + nin + nlab] = y.tobytes()
    path.write_bytes(bytes(blob))
    return path


@pytest.mark.parametrize("label", [1 << 20, CLASSES, -1, -(1 << 40)])
def test_a_label_out_of_range_is_refused_at_load_naming_the_sample(built, tmp_path, label):
    """Before: 2^20 read past the logits (SIGSEGV, rc 139); 3 or -1 trained on a wrong loss, exit 0."""
    _, out = built

    def edit(k, x, y):
        if k == 1:
            y[1] = label

    p = _samples_file(out, tmp_path / "s.bin", edit)
    line = _refused(_run(out, "weights.bin", p), "sample 1", f"label {label}", f"[0, {CLASSES})")
    assert str(p) in line
    # the ignored label (torch's ignore_index) is not a bad one
    ok = _samples_file(out, tmp_path / "ok.bin", lambda k, x, y: y.__setitem__(0, -100) if k == 1 else None)
    r = _run(out, "weights.bin", ok)
    assert r.returncode == 0, r.stderr


# --- 19: the weights file ----------------------------------------------------------------------
def _entries(blob):
    """[(table position, name, nbytes, offset)] of a weights file."""
    count = struct.unpack_from("<I", blob, 12)[0]
    out, pos = [], wf.HEADER_BYTES
    for _ in range(count):
        n, _code, nbytes, off = struct.unpack_from("<IIQQ", blob, pos)
        out.append((pos, bytes(blob[pos + wf._ENTRY.size:pos + wf._ENTRY.size + n]).decode(), nbytes, off))
        pos += wf._ENTRY.size + (n + 7) // 8 * 8
    return out, pos


def _with_offset(blob, i, off):
    b = bytearray(blob)
    struct.pack_into("<Q", b, _entries(blob)[0][i][0] + 16, off)
    return bytes(b)


def test_offsets_that_break_the_format_are_refused(built, tmp_path):
    """Before: only off + nbytes > file size was refused; 0, unaligned, or inside the header or
    table trained on those bytes, exit 0."""
    _, out = built
    good = (out / "weights.bin").read_bytes()
    ents, table_end = _entries(good)
    last = len(ents) - 1
    cases = {
        "zero": (_with_offset(good, last, 0), "header or table"),
        "unaligned": (_with_offset(good, last, ents[last][3] + 4), "aligned"),
        "table_start": (_with_offset(good, last, wf.HEADER_BYTES), "header or table"),
        "table": (_with_offset(good, last, (table_end - 1) // wf.DATA_ALIGN * wf.DATA_ALIGN), "header or table"),
        "overlap": (_with_offset(good, last, ents[last - 1][3]), "overlaps"),
        "past_end": (_with_offset(good, last, len(good) - wf.DATA_ALIGN if ents[last][2] > wf.DATA_ALIGN
                                  else (1 << 64) - wf.DATA_ALIGN), "past the end"),
    }
    for name, (blob, msg) in cases.items():
        (tmp_path / f"{name}.bin").write_bytes(blob)
        line = _refused(_run(out, tmp_path / f"{name}.bin"), msg, ents[last][1])
        assert "offset" in line, (name, line)


def test_a_huge_name_length_is_refused_without_reading_garbage(built, tmp_path):
    """Before: 0xFFFFFFF9 wrapped the padded length to 0 and the message printed memory that was
    never read from the file."""
    _, out = built
    good = bytearray((out / "weights.bin").read_bytes())
    for n in (0xFFFFFFF9, 0xFFFFFFFF, 1 << 20):
        b = bytearray(good)
        struct.pack_into("<I", b, wf.HEADER_BYTES, n)
        (tmp_path / "w.bin").write_bytes(bytes(b))
        _refused(_run(out, tmp_path / "w.bin"), f"name of {n} B", "tensor 0")


def test_a_file_from_before_checksums_is_refused_saying_what_to_do(built, tmp_path):
    _, out = built
    good = (out / "weights.bin").read_bytes()
    (tmp_path / "v1.bin").write_bytes(good[:8] + struct.pack("<I", 1) + good[12:])
    _refused(_run(out, tmp_path / "v1.bin"), "version 1", f"reads version {wf.VERSION}", "emit the project again")


def test_a_flipped_data_bit_is_refused_by_its_checksum(built, tmp_path):
    """Before: the data bytes had no checksum; a flipped bit trained on, exit 0. Checked in a frozen
    tensor (mapped from the file) and a trained one (read into RAM), in both builds."""
    prog, out = built
    good = (out / "weights.bin").read_bytes()
    ents, _ = _entries(good)
    kinds = {k: st.kind for k, st in build_layout(prog, ("train",)).states.items()}
    frozen = [e for e in ents if kinds[e[1]] == "flash"]
    trained = [e for e in ents if kinds[e[1]] != "flash"]
    assert frozen and trained
    plain = tmp_path / "plain"
    shutil.copytree(out, plain)
    subprocess.run(["make", "-s", "-B", "main", "BLAS=0", "MAP_WEIGHTS=0"], cwd=plain, check=True,
                   capture_output=True, timeout=300)
    for _, name, nbytes, off in (frozen[0], trained[-1]):
        for bit in (0, 8 * nbytes - 1):
            b = bytearray(good)
            b[off + bit // 8] ^= 1 << (bit % 8)
            (tmp_path / "w.bin").write_bytes(bytes(b))
            for d in (out, plain):
                _refused(_run(d, tmp_path / "w.bin"), "checksum", name)
    # the intact file and the file the binary saves load again
    r = _run(out, "weights.bin", "samples.bin", "--steps", 2, "--save", tmp_path / "t.bin")
    assert r.returncode == 0, r.stderr
    assert _run(out, tmp_path / "t.bin", "samples.bin", "--steps", 1).returncode == 0
    assert set(wf.read_weights(tmp_path / "t.bin")) == set(kinds)


def test_the_python_reader_checks_what_the_binary_checks(tmp_path):
    blob = wf.weights_blob([("a", np.arange(5, dtype=np.float32)), ("b", np.ones(3, np.int8))])
    ents, _ = _entries(blob)
    p = tmp_path / "w.bin"
    b = bytearray(blob)
    b[ents[1][3]] ^= 4
    for data, msg in ((bytes(b), "checksum"), (_with_offset(blob, 1, ents[1][3] + 1), "aligned"),
                      (_with_offset(blob, 1, ents[0][3]), "overlaps"), (_with_offset(blob, 0, 0), "header or table")):
        p.write_bytes(data)
        with pytest.raises(wf.WeightsFileError, match=msg):
            wf.read_weights(p)


# --- 20: a non-finite step ---------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e30])
def test_a_non_finite_step_stops_with_exit_4_and_saves_the_last_good_weights(built, tmp_path, bad):
    """Before: main ran the unchecked step: NaN weights were saved, "guards ok", exit 0."""
    _, out = built

    def edit(k, x, y):
        if k >= 1:
            x[:] = bad

    p = _samples_file(out, tmp_path / "s.bin", edit)
    r = _run(out, "weights.bin", p, "--steps", 6, "--save", tmp_path / "t.bin")
    assert r.returncode == DIVERGED, (r.returncode, r.stdout, r.stderr)
    assert "guards ok" not in r.stdout
    k = int(re.search(r"step (\d+)", r.stderr).group(1))
    assert "non-finite" in r.stderr and 2 <= k <= 6, r.stderr
    saved = wf.read_weights(tmp_path / "t.bin")
    assert all(np.isfinite(v).all() for v in saved.values() if v.dtype.kind == "f")
    ref = _run(out, "weights.bin", p, "--steps", k - 1, "--save", tmp_path / "ref.bin")
    assert ref.returncode == 0, ref.stderr
    want = wf.read_weights(tmp_path / "ref.bin")
    assert all(np.array_equal(saved[n], want[n]) for n in want)  # the weights from before the bad step


def test_without_the_step_guard_non_finite_weights_are_never_saved(built, tmp_path):
    """`make main STEP_GUARD=0` (no backup): a NaN input reaches the trained weights while the
    loss stays finite (the ReLU drops it on the way forward); --save refuses them, exit 4."""
    _, out = built
    raw = tmp_path / "raw"
    shutil.copytree(out, raw)
    subprocess.run(["make", "-s", "-B", "main", "BLAS=0", "STEP_GUARD=0"], cwd=raw, check=True,
                   capture_output=True, timeout=300)
    p = _samples_file(out, tmp_path / "s.bin", lambda k, x, y: x.__setitem__(slice(None), np.nan) if k == 1 else None)
    r = _run(raw, "weights.bin", p, "--steps", 3, "--save", tmp_path / "t.bin")
    assert r.returncode == DIVERGED and "not saved" in r.stderr, (r.returncode, r.stdout, r.stderr)
    assert not (tmp_path / "t.bin").exists() and not (tmp_path / "t.bin.tmp").exists()
    assert _run(raw, "weights.bin", "samples.bin", "--steps", 3, "--save", tmp_path / "t.bin").returncode == 0


def test_the_label_check_takes_the_classes_of_the_loss():
    """main.c's label check (project.label_defines): the class dim of the loss's logits (a sequence
    loss: the last), as Python's label_feed checks; no check for float targets."""
    from edgetrain.backends.c.project import project_files

    torch.manual_seed(0)
    lm = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 7))
    ids = np.array([[1, 2, 3, 4, 5]])
    seq = et.compile(lm, (ids,), loss="sequence_cross_entropy", optimizer=et.SGD(lr=0.1))
    main = project_files(seq, [(ids, ids)], embed_weights=False, graphs=("train",))["main.c"]
    assert "#define ET_LABEL_CLASSES 7\n" in main and "#define ET_LABEL_ELEM 8\n" in main
    assert "#define ET_LABEL_IGNORE (-100)\n" in main
    x = _samples()[0][0]
    mse = et.compile(_model(), (x,), loss="mse", optimizer=et.SGD(lr=0.1))
    main = project_files(mse, [(x, np.zeros((BATCH, CLASSES), np.float32))], embed_weights=False,
                         graphs=("train",))["main.c"]
    assert "#define ET_LABEL_CLASSES" not in main
