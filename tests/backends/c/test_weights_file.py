"""Host projects whose weights are a file (weights_file.py, runtime/et_weights.h): the format
round-trips, projects above the embedding limit write it by default, the standalone driver
trains from it as the reference does, and a wrong, short or damaged file (weights or samples)
stops it with a message and a non-zero exit."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import weights_file as wf
from edgetrain.backends.c.layout import build_layout
from edgetrain.backends.c.project import embeds_weights, project_files

needs_cc = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
OPT = et.SGD(lr=0.1, momentum=0.9)


def _mlp(hidden=16, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def _samples(n=3):
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(2, 8)).astype(np.float32), np.array([i % 3, (i + 1) % 3])) for i in range(n)]


def test_format_round_trips_and_hash_names_the_table(tmp_path):
    a = np.arange(10, dtype=np.float32)
    b = np.array([[1, -2], [3, 4]], np.int8)
    blob = wf.weights_blob([("w", a), ("layer.b", b)])
    assert blob[:8] == wf.WEIGHTS_MAGIC and len(blob) % wf.DATA_ALIGN == 0
    p = tmp_path / "w.bin"
    p.write_bytes(blob)
    got = wf.read_weights(p)
    assert list(got) == ["w", "layer.b"] and got["layer.b"].dtype == np.int8
    np.testing.assert_array_equal(got["w"], a)
    np.testing.assert_array_equal(got["layer.b"], b.reshape(-1))
    h = wf.table_hash([("w", 40), ("layer.b", 4)])
    assert h != wf.table_hash([("w", 40), ("layer.c", 4)]) and h != wf.table_hash([("w", 44), ("layer.b", 4)])
    p.write_bytes(blob[:-8])
    with pytest.raises(wf.WeightsFileError, match="truncated"):
        wf.read_weights(p)
    p.write_bytes(b"X" + blob[1:])
    with pytest.raises(wf.WeightsFileError, match="not an edgetrain weights file"):
        wf.read_weights(p)


def test_large_programs_write_a_weights_file_by_default():
    x = _samples()[0][0]
    small = et.compile(_mlp(), (x,), optimizer=OPT)
    big = et.compile(_mlp(hidden=wf.EMBED_LIMIT_BYTES // 4 // 8 + 1), (x,), optimizer=OPT)
    assert embeds_weights(small, build_layout(small)) and not embeds_weights(big, build_layout(big))
    files = project_files(big, _samples())
    assert {wf.WEIGHTS_NAME, wf.SAMPLES_NAME, "et_weights.h", "main.c"} <= set(files) and "samples.h" not in files
    assert "static float et_s0" in files["model.c"] and "= {" not in files["model.c"].split("et_s0")[1][:40]
    files = project_files(small, _samples())
    assert "samples.h" in files and wf.WEIGHTS_NAME not in files
    assert wf.WEIGHTS_NAME in project_files(small, _samples(), embed_weights=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The small MLP's project with a weights file, built."""
    d = tmp_path_factory.mktemp("wfile")
    prog = et.compile(_mlp(), (_samples()[0][0],), optimizer=OPT)
    out = prog.emit_c(d / "proj", samples=_samples(), embed_weights=False)
    subprocess.run(["make", "-s", "main"], cwd=out, check=True, capture_output=True, timeout=300)
    return prog, out


def _run(out, *args):
    return subprocess.run(["./main", *map(str, args)], cwd=out, capture_output=True, text=True, timeout=120)


@needs_cc
def test_standalone_driver_trains_from_the_files_as_the_reference(built):
    prog, out = built
    r = _run(out, "weights.bin", "samples.bin", "--epochs", 2, "--save", "trained.bin")
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("step")]
    ref = et.compile(_mlp(), (_samples()[0][0],), optimizer=OPT)
    np.testing.assert_allclose(losses, [ref.step(x, y) for x, y in _samples() * 2], rtol=1e-5)
    got = wf.read_weights(out / "trained.bin")
    assert list(got) == list(build_layout(prog).states)
    for k, v in ref.state.items():
        np.testing.assert_allclose(got[k], np.asarray(v).reshape(-1), rtol=1e-5, atol=1e-6, err_msg=k)
    assert "peak_rss_kb" in r.stdout and "rss_before_steps_kb" in r.stdout
    times = [float(line.split()[2]) for line in r.stdout.splitlines() if line.startswith("elapsed_s")]
    assert len(times) == len(losses) and all(t >= 0 for t in times)  # each step's wall time
    # the saved file loads again (same layout): training resumes from it
    r = _run(out, "trained.bin", "samples.bin", "--steps", 1)
    assert r.returncode == 0 and "step 1 loss" in r.stdout, r.stderr


@needs_cc
def test_bad_files_stop_the_driver_with_a_message(built, tmp_path):
    prog, out = built
    good = (out / "weights.bin").read_bytes()
    other = et.compile(_mlp(hidden=12), (_samples()[0][0],), optimizer=OPT)
    cases = {
        "missing.bin": (None, "cannot open the weights file"),
        "short.bin": (good[:len(good) - 4], "truncated"),
        "magic.bin": (b"NOTWEIGH" + good[8:], "not an edgetrain weights file"),
        "version.bin": (good[:8] + b"\x07" + good[9:], "version 7"),
        "other.bin": (wf.program_weights(other, build_layout(other)), "weights of another model"),
        "tiny.bin": (good[:10], "short file"),
    }
    for name, (blob, msg) in cases.items():
        if blob is not None:
            (tmp_path / name).write_bytes(blob)
        r = _run(out, tmp_path / name, "samples.bin")
        assert r.returncode != 0 and msg in r.stderr, (name, r.stdout, r.stderr)
        assert "step" not in r.stdout
    samples = (out / "samples.bin").read_bytes()
    (tmp_path / "s_short.bin").write_bytes(samples[:-1])
    (tmp_path / "s_wrong.bin").write_bytes(wf.samples_blob([np.zeros(5, np.float32)], [np.zeros(2, np.int64)]))
    for name, msg in (("s_short.bin", "truncated"), ("s_wrong.bin", "not this model's sizes")):
        r = _run(out, "weights.bin", tmp_path / name)
        assert r.returncode != 0 and msg in r.stderr, (name, r.stderr)


@needs_cc
def test_save_grads_writes_the_gradients_of_the_next_sample(built):
    """--save-grads after N steps: the gradients of sample N (modulo the count) at the trained
    weights, in the weights file format, as the reference computes them."""
    prog, out = built
    r = _run(out, "weights.bin", "samples.bin", "--steps", 1, "--save-grads", "grads.bin")
    assert r.returncode == 0, r.stdout + r.stderr
    got = wf.read_weights(out / "grads.bin")
    ref = et.compile(_mlp(), (_samples()[0][0],), optimizer=OPT)
    x0, y0 = _samples()[0]
    ref.step(x0, y0)
    want = ref.gradients(*_samples()[1])
    assert set(got) == {f"grad:{k}" for k in want} | {"loss"}
    for k, v in want.items():
        np.testing.assert_allclose(got[f"grad:{k}"], np.asarray(v).reshape(-1), rtol=1e-5, atol=1e-6, err_msg=k)


@needs_cc
def test_save_grads_without_the_gradient_graph_is_refused(tmp_path):
    prog = et.compile(_mlp(), (_samples()[0][0],), optimizer=OPT)
    out = prog.emit_c(tmp_path / "proj", samples=_samples(), embed_weights=False, graphs=("train",))
    subprocess.run(["make", "-s", "main"], cwd=out, check=True, capture_output=True, timeout=300)
    r = _run(out, "weights.bin", "samples.bin", "--steps", 1, "--save-grads", "grads.bin")
    assert r.returncode != 0 and "without the gradient graph" in r.stderr, r.stdout + r.stderr
    assert not (out / "grads.bin").exists()


def test_standalone_makefile_links_the_host_blas_when_there_is_one(monkeypatch):
    """The standalone trainer links the BLAS the ctypes library uses (its paths on this
    machine); none found (EDGETRAIN_BLAS=0, not installed): the portable kernels."""
    from edgetrain.backends.c import blas

    prog = et.compile(_mlp(), (_samples()[0][0],), optimizer=OPT)
    fake = blas.Blas("fake-blas 1", ("-DET_BLAS", "-I/opt/fake/include", "-DET_BLAS_SGEMM=f_sgemm"),
                     ("-L/opt/fake/lib", "-lfake"))
    monkeypatch.setattr(blas, "host_blas", lambda: fake)
    mk = project_files(prog, _samples(), embed_weights=False)["Makefile"]
    assert "BLAS_HEADER := /opt/fake/include/cblas.h" in mk and "BLAS_LDFLAGS := -L/opt/fake/lib -lfake" in mk
    assert "$(CC) $(CFLAGS) $(BLAS_CFLAGS) -o $@ model.c main.c $(BLAS_LDFLAGS)" in mk
    assert "BLAS" not in project_files(prog, _samples(), embed_weights=True)["Makefile"]  # the embedded driver
    monkeypatch.setattr(blas, "host_blas", lambda: None)
    mk = project_files(prog, _samples(), embed_weights=False)["Makefile"]
    assert "BLAS" not in mk and "$(CC) $(CFLAGS) -o $@ model.c main.c\n" in mk


@needs_cc
def test_standalone_main_links_the_blas_or_says_it_is_missing(built):
    """`make main` links the host BLAS where one is installed (BLAS=0: the portable kernels);
    a BLAS header that is not where the project was emitted stops make with a message."""
    from edgetrain.backends.c.blas import host_blas

    prog, out = built
    if host_blas() is None:
        pytest.skip("no host BLAS installed")
    ldd = subprocess.run(["ldd", "main"], cwd=out, capture_output=True, text=True).stdout
    assert "openblas" in ldd
    r = subprocess.run(["make", "-B", "main", "BLAS_HEADER=/nonexistent/cblas.h"], cwd=out, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "is not at /nonexistent/cblas.h" in r.stderr and "BLAS=0" in r.stderr
    subprocess.run(["make", "-s", "-B", "main", "BLAS=0"], cwd=out, check=True, capture_output=True, timeout=300)
    try:
        ldd = subprocess.run(["ldd", "main"], cwd=out, capture_output=True, text=True).stdout
        assert "openblas" not in ldd
        assert _run(out, "weights.bin", "samples.bin", "--steps", 1).returncode == 0
    finally:  # the module's other tests use the default build
        subprocess.run(["make", "-s", "-B", "main"], cwd=out, check=True, capture_output=True, timeout=300)
