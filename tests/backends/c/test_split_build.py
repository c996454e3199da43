"""A large model.c compiled in pieces side by side (host.split_flags: GCC's -flto=N): when it applies, and the
same program, bit for bit, as one compile."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.backends.c import front_pch, host

CC = host.host_compiler()
needs_gcc = pytest.mark.skipif(CC is None or not front_pch.is_gcc(CC), reason="no GCC: model.c is compiled whole")


@needs_gcc
def test_split_only_a_large_model_c_on_more_than_one_cpu_with_gcc(monkeypatch):
    big, small = "x" * host.SPLIT_MIN_BYTES, "x" * (host.SPLIT_MIN_BYTES - 1)
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert host.split_flags(CC, big) == ("-flto=3",)
    assert host.split_flags(CC, small) == ()
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert host.split_flags(CC, big) == (f"-flto={host.SPLIT_MAX_JOBS}",)
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert host.split_flags(CC, big) == ()  # one CPU: nothing to do side by side
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(host, "is_gcc", lambda cc: False)
    assert host.split_flags(CC, big) == ()  # clang and others: one compile


def _prog():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
                                torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU6(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 3)).eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    prog = et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.1, momentum=0.9))
    return prog, x, np.array([2, 0])


@needs_gcc
def test_the_pieces_compute_the_program_of_one_compile_bit_for_bit(own_cache, monkeypatch):
    """The same program built whole and in pieces (SPLIT_MIN_BYTES lowered to 0, two CPUs): its build carries
    -flto=2, and the two libraries give the same losses, gradients, predictions and trained state, bit for bit
    (the inline SGD updates, clamps and adds of model.c are compiled in the pieces)."""
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    prog, x, y = _prog()
    seen = []
    compile_c = host.compile_c
    monkeypatch.setattr(host, "compile_c", lambda cc, args, cwd: (seen.append(list(args)), compile_c(cc, args, cwd)))
    whole = host.to_c_program(prog)
    shutil.rmtree(whole.runner.c_library.parent)  # the cache shares one library between the two (equivalent) builds
    monkeypatch.setattr(host, "SPLIT_MIN_BYTES", 0)
    split = host.to_c_program(prog)
    builds = [a for a in seen if "libmodel.so" in a]
    assert len(builds) == 2 and "-flto=2" not in builds[0] and "-flto=2" in builds[1]
    for _ in range(3):
        lw, ls = whole.step(x, y), split.step(x, y)
        assert np.float32(lw).tobytes() == np.float32(ls).tobytes()
    assert whole.predict(x).tobytes() == split.predict(x).tobytes()
    gw, gs = whole.runner.gradients(x, y), split.runner.gradients(x, y)
    assert gw.keys() == gs.keys() and all(gw[k].tobytes() == gs[k].tobytes() for k in gw)
    for k in whole.state:
        assert np.asarray(whole.state[k]).tobytes() == np.asarray(split.state[k]).tobytes(), k
