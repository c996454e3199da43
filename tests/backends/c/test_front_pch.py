"""The runtime headers precompiled once (backends/c/front_pch.py): a host library's model_host.c takes
et_front.h.gch where the compiler is GCC, the same program as from the headers' text, and parses the
text where it is not."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.backends.c import front_pch, host, kernel_lib
from edgetrain.backends.c.emit import emit_sources
from tests.backends.c.test_blas import PORTABLE

CC = host.host_compiler()
needs_gcc = pytest.mark.skipif(CC is None or not front_pch.is_gcc(CC), reason="no GCC: no precompiled header")


def _prog(update=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)).eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    prog = et.compile(model, (x,), update=update or et.Full(), optimizer=et.SGD(lr=0.1, momentum=0.9))
    return prog, x, np.array([2, 0])


def _pch_dirs(cache):
    return sorted((cache / "c").glob("pch-*"))


@needs_gcc
def test_a_program_takes_the_precompiled_headers_and_trains_as_the_reference(own_cache):
    """In a cache of its own (own_cache): the first program builds et_front.h.gch, the second reuses it;
    each library's own folder has no et_front.h, and gcc, asked (-H), loads the .gch (its line starts
    with "!")."""
    prog, x, y = _prog()
    c = host.to_c_program(prog, PORTABLE)
    for _ in range(2):
        assert c.step(x, y) == pytest.approx(prog.step(x, y), rel=1e-5, abs=1e-6)
    (pch,) = _pch_dirs(own_cache)
    assert (pch / "et_front.h.gch").is_file() and (pch / "et_front.h").is_file()
    folder = c.runner.c_library.parent
    assert not (folder / kernel_lib.FRONT_HEADER).exists()
    other = host.to_c_program(_prog(et.BiasOnly())[0], PORTABLE)  # another program, the same headers and flags
    assert other.runner.c_library != c.runner.c_library and _pch_dirs(own_cache) == [pch]
    r = subprocess.run([CC, *host.with_guard(PORTABLE), "-I", str(pch), "-fPIC", "-fsyntax-only", "-H",
                        "model_host.c"], cwd=folder, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"! {pch / 'et_front.h.gch'}" in r.stderr.splitlines()


@needs_gcc
@pytest.mark.skipif(shutil.which("objcopy") is None, reason="no objcopy")
def test_the_same_code_with_and_without_the_precompiled_headers(tmp_path, monkeypatch):
    """model_host.c compiled against et_front.h.gch and against et_front.h's text: the same machine code and
    data, byte for byte."""
    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path / "cache"))
    files = emit_sources(_prog()[0])
    pch = front_pch.front_pch(CC, PORTABLE, files)
    sections = {}
    for name, use_pch in (("with", True), ("without", False)):
        work = tmp_path / name
        work.mkdir()
        for f, text in files.items():
            (work / f).write_text(text)
        if not use_pch:
            (work / kernel_lib.FRONT_HEADER).write_text(kernel_lib.front_header(files))
        (work / "model_host.c").write_text(kernel_lib.front_source(files))
        r = subprocess.run([CC, *PORTABLE, *(("-I", str(pch)) if use_pch else ()), "-fPIC", "-H", "-c", "-o", "m.o",
                            "model_host.c"], cwd=work, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        assert (f"! {pch / 'et_front.h.gch'}" in r.stderr.splitlines()) == use_pch  # gcc took it, or the text
        sections[name] = {}
        for sec in (".text", ".rodata", ".data", ".bss"):
            subprocess.run(["objcopy", "-O", "binary", f"--only-section={sec}", "m.o", f"m{sec}"], cwd=work, check=True)
            sections[name][sec] = (work / f"m{sec}").read_bytes()
    assert sections["with"][".text"] and sections["with"] == sections["without"]


def test_the_kernel_headers_do_not_read_model_h():
    """model_host.c includes model.h after et_front.h (the headers before any C token, for GCC's precompiled
    header), where model.c includes it first: no macro that model.h defines is read by a kernel header."""
    files = emit_sources(_prog()[0])
    defined = set(re.findall(r"#define (\w+)", files["model.h"]))
    assert {"ET_ARENA_BYTES", "ET_BATCH", "ET_INPUT_BYTES"} <= defined
    for h in kernel_lib.kernel_headers(files):
        read = defined & set(re.findall(r"\w+", files[h]))
        assert not read, f"{h} reads {sorted(read)} of model.h"


@pytest.mark.skipif(CC is None, reason="no host C compiler")
def test_a_compiler_that_is_not_gcc_parses_the_headers(own_cache, monkeypatch):
    """Where the compiler is not GCC: no precompiled header, et_front.h beside model_host.c, the same
    training."""
    monkeypatch.setattr(front_pch, "is_gcc", lambda cc: False)
    prog, x, y = _prog()
    c = host.to_c_program(prog, PORTABLE)
    assert c.step(x, y) == pytest.approx(prog.step(x, y), rel=1e-5, abs=1e-6)
    assert _pch_dirs(own_cache) == []
    assert (c.runner.c_library.parent / kernel_lib.FRONT_HEADER).read_text() == \
        kernel_lib.front_header(c.runner.c_files)
