"""The host library's kernels compiled once per machine (backends/c/kernel_lib.py): found in the
runtime headers, wrapped out of line, model.c's calls renamed to the wrappers, the object
cached and shared by programs of the same headers and flags."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.backends.c import kernel_lib
from edgetrain.backends.c.host import to_c_program
from edgetrain.backends.c.layout import CBackendError
from tests.backends.c.test_blas import PORTABLE

HEADER = """#define ET_INLINE static inline
ET_INLINE void et_big(const float *ET_RESTRICT x, float y[], int n) {
    for (int i = 0; i < n; ++i)
        y[i] = x[i];
    for (int i = 0; i < n; ++i)
        y[i] += x[i];
    y[0] = 0;
    y[1] = 1;
}
ET_INLINE void et_small(float *p) { p[0] = 1; }
"""


def test_kernels_are_the_long_void_functions_with_their_argument_names():
    files = {"model.h": "", "et_k.h": HEADER, "model.c": "void f(float *a) { et_big(a, a, 2); et_small(a); }"}
    assert kernel_lib.kernel_signatures(files) == {"et_big": "const float *ET_RESTRICT x, float y[], int n"}
    assert "void etk_et_big(const float *ET_RESTRICT x, float y[], int n) { et_big(x, y, n); }" in \
        kernel_lib.kernels_source(files)
    front = kernel_lib.front_source(files)
    assert "#define et_big etk_et_big" in front and "et_small" not in front
    assert front.index('#include "et_front.h"') < front.index('#include "model.h"') < front.index("#define et_big") \
        < front.index('#include "model.c"')
    assert front.split("\n")[1] == '#include "et_front.h"'  # the first line after the comment: GCC may take it precompiled
    assert '#include "et_k.h"' in kernel_lib.front_header(files) and "model.h" not in kernel_lib.front_header(files)


def test_program_headers_stay_out_of_the_shared_object():
    files = {"model.h": "", "et_common.h": "", "et_bank.h": HEADER, "et_page.h": HEADER, "model.c": ""}
    assert kernel_lib.kernel_headers(files) == ["et_common.h"]
    assert kernel_lib.kernel_signatures(files) == {}


def _tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)).eval()


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no host C compiler")
def test_two_programs_share_one_kernel_object_and_match_the_reference(own_cache):
    """In a cache of its own (own_cache: the suite's compiled kernel parts linked in): the second program
    reuses the first one's kernel library (built at -O1 without BLAS: the sharing does not depend on the
    flags)."""
    x, y = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1)), np.array([2])
    for scheme in (et.Full(), et.BiasOnly()):
        prog = et.compile(_tiny(), (x,), update=scheme, optimizer=et.SGD(lr=0.1, momentum=0.9))
        c = to_c_program(prog, PORTABLE)
        for _ in range(2):
            assert c.step(x, y) == pytest.approx(prog.step(x, y), rel=1e-5, abs=1e-6)
        front = (c.runner.c_library.parent / "model_host.c").read_text()
        assert "#define et_conv2d etd_et_conv2d" in front and "etk_et_conv2d_k3s1(" in front
    assert len(list((own_cache / "c").glob("kernels-*"))) == 1


CONV_HEADER = """#define ET_INLINE static inline
ET_INLINE void et_conv(float *y, int K, int S, int C, int G) {
    for (int i = 0; i < K; ++i)
        y[i] = S;
    for (int i = 0; i < C; ++i)
        y[i] += G;
    y[0] = 0;
    y[1] = 1;
}
"""


def test_specialised_wrappers_and_the_dispatcher(monkeypatch):
    """A specialised kernel: one wrapper per argument set (constants in, those parameters out;
    an argument may be fixed to another one), and an inline dispatcher that tries them in order."""
    monkeypatch.setattr(kernel_lib, "SPECIALISED", {"et_conv": (("_k3", {"K": 3, "S": 1}), ("_dw", {"G": "C"}))})
    files = {"model.h": "", "et_k.h": CONV_HEADER, "model.c": "void f(float *a) { et_conv(a, 3, 1, 4, 4); }"}
    src = kernel_lib.kernels_source(files)
    assert "void etk_et_conv_k3(float *y, int C, int G) { et_conv(y, 3, 1, C, G); }" in src
    assert "void etk_et_conv_dw(float *y, int K, int S, int C) { et_conv(y, K, S, C, C); }" in src
    front = kernel_lib.front_source(files)
    assert "#define et_conv etd_et_conv" in front
    body = front[front.index("void etd_et_conv("):]
    assert body.index("if (K == 3 && S == 1) { etk_et_conv_k3(y, C, G); return; }") < \
        body.index("if (G == C) { etk_et_conv_dw(y, K, S, C); return; }") < body.index("etk_et_conv(y, K, S, C, G);")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no host C compiler")
def test_a_native_build_is_keyed_by_the_cpu(tmp_path, monkeypatch):
    """-march=native objects of two CPUs (as /proc/cpuinfo tells them) never share a cache entry."""
    from edgetrain.backends.c.host import find_cc

    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path))
    files = {"model.h": "", "et_k.h": HEADER, "model.c": ""}
    cc, flags = find_cc(), ("-O1", "-march=native", "-DET_RESTRICT=")
    first, portable = kernel_lib.kernels_object(cc, flags, files), kernel_lib.kernels_object(cc, flags[::2], files)
    monkeypatch.setattr(kernel_lib, "cpu_identity", lambda: "another CPU")
    assert kernel_lib.kernels_object(cc, flags, files) != first
    assert kernel_lib.kernels_object(cc, flags[::2], files) == portable  # no -march=native: any CPU


def test_the_kernels_are_split_into_parts_once_each_the_same_on_every_machine():
    """kernel_parts: every kernel in one part, the costliest apart, the split a function of the
    headers only (the object's cache key holds the sources)."""
    from edgetrain.backends.c import runtime_headers

    files = {n: runtime_headers.header_text(n) for n in runtime_headers.KERNEL_HEADERS}
    parts = kernel_lib.kernel_parts(files)
    assert 1 < len(parts) <= kernel_lib.KERNEL_PARTS
    flat = [k for p in parts for k in p]
    assert sorted(flat) == sorted(kernel_lib.kernel_signatures(files)) and len(flat) == len(set(flat))
    specialised = [i for i, p in enumerate(parts) if set(p) & set(kernel_lib.SPECIALISED)]
    assert len(specialised) == len(kernel_lib.SPECIALISED)  # the three costliest in three parts
    assert parts == kernel_lib.kernel_parts(files)
    whole = kernel_lib.kernels_source(files)
    defined = {n: h for h in kernel_lib.kernel_headers(files) for n in kernel_lib.kernel_signatures({h: files[h]})}
    for p in parts:
        src = kernel_lib.kernels_source(files, p)
        assert all(f"void etk_{k}(" in src and f"void etk_{k}(" in whole for k in p)
        (header,) = {defined[k] for k in p}  # one header's kernels, and that header alone included
        assert [ln for ln in src.splitlines() if ln.startswith("#include")] == [f'#include "{header}"']


A_HEADER = HEADER.replace("et_big", "et_a_big").replace("y[0] = 0;", "y[0] = ET_A_ZERO;").replace(
    "#define ET_INLINE static inline", "#define ET_INLINE static inline\n#ifndef ET_A_ZERO\n#define ET_A_ZERO 0\n#endif")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no host C compiler")
def test_flags_that_a_parts_text_does_not_see_share_its_object(tmp_path, monkeypatch):
    """Each part is cached by its preprocessed text and the flags less -D/-U/-I: a macro no header
    reads rebuilds no part (a new linked object all the same), a macro one header reads rebuilds
    that header's part alone, another optimisation level every part."""
    from edgetrain.backends.c.host import find_cc

    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path))
    files = {"model.h": "", "et_a.h": A_HEADER, "et_b.h": HEADER, "model.c": ""}
    assert kernel_lib.kernel_parts(files) == [["et_a_big"], ["et_big"]]
    cc, flags = find_cc(), ("-O1", "-DET_RESTRICT=")

    def parts():
        return sorted((tmp_path / "c").glob("kernel-part-*/part.o"))

    objs = [kernel_lib.kernels_object(cc, flags, files)]
    first = parts()
    assert len(first) == 2
    objs.append(kernel_lib.kernels_object(cc, flags + ("-DET_UNREAD=1",), files))
    assert parts() == first and objs[1] != objs[0]
    objs.append(kernel_lib.kernels_object(cc, flags + ("-DET_A_ZERO=2",), files))
    assert len(parts()) == 3 and set(first) < set(parts())  # et_b.h's part shared
    objs.append(kernel_lib.kernels_object(cc, ("-O2", "-DET_RESTRICT="), files))
    assert len(parts()) == 5 and len(set(objs)) == 4
    # a kernel object's folder keeps its sources and the linked object, not the preprocessed text
    # (about 2 MB a part with a BLAS's headers) nor a second copy of the parts' objects
    for obj in objs:
        assert sorted(p.name for p in obj.parent.iterdir() if not p.name.endswith(".h")) == \
            ["et_kernels.o", "et_kernels_0.c", "et_kernels_1.c"]
    with pytest.raises(CBackendError, match="failed to compile"):
        kernel_lib.kernels_object(cc, flags, {**files, "et_b.h": HEADER.replace("y[1] = 1;", "y[1] = undefined_name;")})
    assert len(parts()) == 5 and len(list((tmp_path / "c").glob("kernels-*"))) == 4  # a failed build leaves nothing
