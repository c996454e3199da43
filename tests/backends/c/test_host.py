"""The host side of the C backend: backend="c" in compile, the emitted project (sample driver
built under AddressSanitizer + UBSan), arena guard words, the content-hash build cache,
state sync with prog.state, the non-finite loss rule and the clear errors."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import CBackendError
from edgetrain.backends.c.export import emit_c
from edgetrain.backends.c import host
from edgetrain.backends.c.layout import build_layout
from edgetrain.program import NonFiniteLossError


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(4, 4, 3, 2, 1, groups=4, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(self.dw(self.conv(x)).flatten(1))


def _tiny():
    torch.manual_seed(0)
    return Tiny().eval()


X = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(0))
Y = np.array([2])
OPT = et.SGD(lr=0.1, momentum=0.9)


@pytest.fixture(scope="module")
def progs():
    scheme = et.Sparse(bias_last=1, weights={0: 0.5, 1: 0.5})
    ref = et.compile(_tiny(), (X,), update=scheme, optimizer=OPT)
    c = et.compile(_tiny(), (X,), update=scheme, optimizer=OPT, backend="c")
    return ref, c


def test_backend_c_in_compile(progs):
    ref, c = progs
    assert isinstance(c, et.Program) and isinstance(c.runner, host.CRunner) and c.backend == "c"
    for _ in range(2):
        lc, lr_ = c.step(X, Y), ref.step(X, Y)
        assert abs(lc - lr_) <= 1e-5 * abs(lr_)
    for k in ref.state:
        np.testing.assert_allclose(c.state[k], ref.state[k], rtol=1e-5, atol=1e-6)
    assert c.runner.check_guards()
    assert c.state_dict().keys() == ref.state_dict().keys()
    # the C train graph uses the very arena plan that prog.memory reports
    train = build_layout(ref, ("train",)).graphs["train"]
    assert train.size == ref.memory.arena_bytes and train.offsets == dict(ref.memory.arena.offsets)


def test_state_sync_both_ways(progs):
    ref, c = progs
    name = next(k for k, sel in c.trainable.items() if sel is None)
    # a rebound entry is loaded into the library before the next step
    new = np.full_like(ref.state[name], 0.01)
    ref.state[name] = new.copy()
    c.state[name] = new.copy()
    split = next(k for k, sel in c.trainable.items() if sel is not None)
    ref.state[split] = ref.state[split] * 0.5
    c.state[split] = c.state[split] * 0.5
    lc, lr_ = c.step(X, Y), ref.step(X, Y)
    assert abs(lc - lr_) <= 1e-5 * abs(lr_)
    for k in ref.state:
        np.testing.assert_allclose(c.state[k], ref.state[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.predict(np.repeat(X.numpy(), 3, 0)), ref.predict(np.repeat(X.numpy(), 3, 0)),
                               rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def full_pair():
    return (et.compile(_tiny(), (X,), optimizer=OPT, backend="c"),
            et.compile(_tiny(), (X,), optimizer=OPT, backend="c"))


def test_programs_do_not_share_weights(full_pair):
    a, b = full_pair
    assert a.runner.c_library == b.runner.c_library  # one cached build
    before = {k: v.copy() for k, v in b.state.items()}
    a.step(X, Y)
    for k, v in before.items():
        np.testing.assert_array_equal(b.state[k], v)


def test_non_finite_loss_keeps_weights(full_pair):
    c = full_pair[1]
    c.step(X, Y)
    w = next(iter(c.trainable))
    c.state[w][...] = 3e38  # the next step overflows
    saved = {k: v.copy() for k, v in c.state.items()}
    steps = c.steps
    with pytest.raises(NonFiniteLossError, match="non-finite|loss is"):
        c.step(X, Y)
    assert c.steps == steps
    for k, v in saved.items():
        np.testing.assert_array_equal(c.state[k], v)


@pytest.mark.parametrize("bad", [1e30, float("nan")], ids=["x*1e30", "nan"])
def test_untrainable_input_is_refused_like_the_reference(full_pair, bad):
    """Issue 18 item 5: input a float32 step cannot train on is refused before the library
    runs, as Program.step refuses it; nothing changes."""
    c = full_pair[0]  # [1] is left overflowing by test_non_finite_loss_keeps_weights
    saved, steps = {k: v.copy() for k, v in c.state.items()}, c.steps
    for call in (c.step, c.gradients):
        with pytest.raises(ValueError, match="input 0: .*(non-finite|overflowing)"):
            call(X * bad, Y)
    assert c.steps == steps
    for k, v in saved.items():
        np.testing.assert_array_equal(c.state[k], v)
    assert np.isfinite(c.step(X, Y))


def test_content_hash_cache_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path))
    files = {"model.c": "int et_answer(void) { return 42; }\n", "model.h": "/* */\n"}
    lib = host.build_library(files)
    stamp = lib.stat().st_mtime_ns
    assert host.build_library(dict(files)) == lib and lib.stat().st_mtime_ns == stamp
    libs = tmp_path / "c"  # host libraries live under the cache root's c/ (backends/c/cache.py)
    built = [p for p in libs.iterdir()  # not kernel_lib.py's (the object, its parts) nor link_deps.py's
             if p.is_dir() and not p.name.startswith(("kernels-", "kernel-part-", "deps-"))]
    assert lib.parent.parent == libs and len(built) == 1
    changed = dict(files, **{"model.c": files["model.c"] + "/* changed */\n"})
    assert host.build_library(changed) != lib
    assert host.build_library(files, host.DEFAULT_CFLAGS + ("-DX=1",)) != lib  # the flags are in the key


def test_no_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(host.shutil, "which", lambda name: None)
    with pytest.raises(CBackendError, match="C compiler"):
        host.find_cc()


def _int8_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                         nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 5))


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_emitted_project_runs_clean_under_sanitizers(tmp_path, quantize):
    """emit_c with samples (weights compiled in) -> model.c + main.c built with
    -fsanitize=address,undefined: a few steps print the reference losses, guard words intact
    (float32, and int8 with weights trained on some channels: split storage)."""
    if subprocess.run(["sh", "-c", "command -v gcc"], capture_output=True).returncode:
        pytest.skip("gcc not found")
    if quantize is None:
        scheme = et.Sparse(bias_last=1, weights={0: 0.5, 1: 0.5})
        prog = et.compile(_tiny(), (X,), update=scheme, optimizer=OPT)
    else:
        scheme = et.Sparse(bias_last=2, weights={1: 0.5, 2: 0.25})
        prog = et.compile(_int8_net(), (X,), update=scheme, optimizer=et.SGD(lr=0.05, momentum=0.9),
                          quantize="int8")
        assert any(sel is not None for sel in prog.trainable.values())
    rng = np.random.default_rng(0)
    samples = [(rng.normal(size=(1, 1, 8, 8)).astype(np.float32), np.array([i % 5])) for i in range(3)]
    out = prog.emit_c(tmp_path / "proj", samples=samples)
    for name in ("model.c", "model.h", "Makefile", "README.md", "samples.h", "main.c", "et_common.h"):
        assert (out / name).exists(), name
    exe = host.build_executable(out, host.SANITIZE_CFLAGS)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "guards ok" in r.stdout and "runtime error" not in r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("step")]
    expect = [prog.step(x, y) for x, y in samples]
    np.testing.assert_allclose(losses, expect, rtol=1e-5)


def test_bad_target():
    prog = et.compile(_tiny(), (X,))
    with pytest.raises(CBackendError, match="target"):
        emit_c(prog, "/nonexistent", target="z80")
