"""The C runtime headers (backends/c/runtime/et_*.h) stand alone (issue 34, item 17): each has
an include guard and includes what it uses, so it compiles as the only include of a file, for
the host (portable, the fast library's flags, an emitted project's, the BLAS builds) and for
every firmware target whose cross compiler is installed (the Cortex-M DSP and Helium paths, the
RISC-V ones); no header includes another after its first declaration (no fragment that needs
what an includer defined before it); and the list every program includes is every et_*.h of
the folder less the per-program ones, derived (runtime_headers.py), not written."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from edgetrain.backends.c import emit, graph_lib, kernel_lib, runtime_headers
from edgetrain.backends.c.blas import host_blas, library_blas
from edgetrain.backends.c.host import DEFAULT_CFLAGS, PROJECT_CFLAGS
from edgetrain.backends.c.layout import CBackendError
from edgetrain.backends.c.runtime_headers import (DRIVER_HEADERS, KERNEL_HEADERS, PAGE_HEADER, PROGRAM_HEADERS,
                                                   RUNTIME_DIR, header_text, kernel_headers)
from edgetrain.devices.targets import FIRMWARE_TARGETS, TARGETS

HOST_CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(HOST_CC is None, reason="no host C compiler")
#: a call of an undeclared function is an error (gcc 14's default), not C89's implicit declaration
STRICT = ("-fsyntax-only", "-Werror=implicit-function-declaration", "-Werror=implicit-int")


def _host_configs():
    cfgs = [("c99", ("-std=c99",)), ("library", DEFAULT_CFLAGS), ("project", PROJECT_CFLAGS)]
    for name, blas in (("openblas", host_blas()), ("library-blas", library_blas())):
        if blas is not None:
            cfgs.append((name, (*PROJECT_CFLAGS, *blas.cflags)))
    return cfgs


def _compile_each(cc: str, flags, headers, tmp_path, *include_dirs) -> None:
    """Compile a file that includes only `h`, for every h of `headers` (one translation unit each,
    one compiler call); fail naming the headers whose file did not compile."""
    srcs = []
    for h in headers:
        src = tmp_path / f"only_{h[:-2]}.c"
        src.write_text(f'#include "{h}"\n')
        srcs.append(src.name)
    incs = [f"-I{d}" for d in (RUNTIME_DIR, *include_dirs)]
    r = subprocess.run([cc, *flags, *STRICT, *incs, *srcs], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{cc} {' '.join(flags)}: a runtime header does not compile alone:\n{r.stderr[-6000:]}"


@needs_cc
@pytest.mark.parametrize("flags", [f for _, f in _host_configs()], ids=[n for n, _ in _host_configs()])
def test_each_header_compiles_alone_on_the_host(flags, tmp_path):
    _compile_each(HOST_CC, flags, KERNEL_HEADERS + PROGRAM_HEADERS, tmp_path)


@pytest.mark.parametrize("name", FIRMWARE_TARGETS)
def test_each_header_compiles_alone_for_the_firmware_targets(name, tmp_path):
    t = TARGETS[name]
    cc = t.toolchain.tool("gcc")
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not on PATH (Debian: {t.toolchain.packages})")
    # the firmware's C library: newlib (arm-none-eabi's default), picolibc on RISC-V (its Makefile's SPECS)
    flags = ("-std=gnu11", "-O2", *t.toolchain.arch_flags, *t.defines,
             *(("--specs=picolibc.specs",) if t.backend == "riscv" else ()))
    (tmp_path / "libc.c").write_text("#include <stdint.h>\n#include <string.h>\n")
    if subprocess.run([cc, *flags, "-fsyntax-only", "libc.c"], cwd=tmp_path, capture_output=True).returncode:
        pytest.skip(f"{cc} has no C library here (Debian: {t.toolchain.packages})")
    # the firmware's headers: every kernel header, the weight banks and a run-time check (paging is host-only)
    headers = KERNEL_HEADERS + tuple(h for h in PROGRAM_HEADERS if h != PAGE_HEADER)
    _compile_each(cc, flags, headers, tmp_path)


@needs_cc
def test_the_driver_header_compiles_with_its_programs_model_h(tmp_path):
    """et_weights.h uses model.h's state I/O: it includes model.h, and compiles beside any program's."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    import edgetrain as et

    torch.manual_seed(0)
    prog = et.compile(torch.nn.Sequential(torch.nn.Linear(4, 3)), (np.zeros((2, 4), np.float32),),
                      optimizer=et.SGD(lr=0.1))
    (tmp_path / "model.h").write_text(emit.emit_sources(prog)["model.h"])
    _compile_each(HOST_CC, PROJECT_CFLAGS, DRIVER_HEADERS, tmp_path, tmp_path)


def _code(text: str) -> list[str]:
    """The header's lines without comments (a comment's lines kept, emptied) and with each
    continued line joined to the line it continues."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return text.replace("\\\n", " ").split("\n")


def _all_headers():
    return sorted(p.name for p in RUNTIME_DIR.glob("et_*.h"))


@pytest.mark.parametrize("name", _all_headers())
def test_each_header_is_guarded_and_includes_runtime_headers_only_at_its_top(name):
    lines = [ln.strip() for ln in _code((RUNTIME_DIR / name).read_text())]
    directives = [ln for ln in lines if ln.startswith("#")]
    guard = re.fullmatch(r"#\s*ifndef\s+(ET_\w+_H)", directives[0])
    assert guard and re.fullmatch(rf"#\s*define\s+{guard.group(1)}", directives[1]), \
        f"{name} does not open with its include guard: {directives[:2]}"
    assert re.fullmatch(r"#\s*endif", directives[-1]), f"{name} does not end with its guard's #endif"
    first_code = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    late = [(i + 1, ln) for i, ln in enumerate(lines[first_code:], first_code)
            if re.match(r'#\s*include\s+"et_', ln) and ln.split('"')[1] != name]  # a template's self-include is fine
    assert not late, f"{name} includes runtime headers after its first declaration (line {first_code + 1}): {late}"


def test_the_guards_are_distinct():
    guards = [re.search(r"#\s*ifndef\s+(ET_\w+_H)", "\n".join(_code((RUNTIME_DIR / h).read_text()))).group(1)
              for h in _all_headers()]
    assert len(set(guards)) == len(guards), guards


def test_the_program_headers_are_derived_from_the_folder():
    on_disk = set(_all_headers())
    assert set(PROGRAM_HEADERS + DRIVER_HEADERS) <= on_disk
    assert KERNEL_HEADERS == tuple(sorted(on_disk - set(PROGRAM_HEADERS) - set(DRIVER_HEADERS)))
    assert KERNEL_HEADERS == kernel_headers() and "et_common.h" in KERNEL_HEADERS
    # the one list: the emitter's, the graph library's (the op tests'), the kernel object's filter
    assert emit.RUNTIME_HEADERS is KERNEL_HEADERS and kernel_lib.PROGRAM_HEADERS is PROGRAM_HEADERS
    files = graph_lib.emit_graph_sources(_tiny_graph())
    assert [h for h in files if h.endswith(".h")] == list(KERNEL_HEADERS)
    assert kernel_lib.kernel_headers(files) == list(KERNEL_HEADERS)
    assert all(f'#include "{h}"' in files["model.c"] for h in KERNEL_HEADERS)


def _tiny_graph():
    """A graph of one input and no nodes (its output is its input)."""
    from edgetrain.ir import Graph, TensorType, new_value

    x = new_value(TensorType((3,), "float32"), "x")
    return Graph((x,), (), (x,), ("y",))


def test_the_wheel_carries_every_header():
    """pyproject.toml's package data takes every runtime header (a glob, not a list)."""
    import fnmatch
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = RUNTIME_DIR.parents[3]  # src/
    if not (root.parent / "pyproject.toml").exists():
        pytest.skip("edgetrain is installed, not run from its source tree")
    conf = tomllib.loads((root.parent / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["edgetrain"]
    for h in _all_headers():
        rel = (RUNTIME_DIR / h).relative_to(root / "edgetrain").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is in no package-data glob of pyproject.toml"


def test_a_missing_named_header_is_an_error_not_left_out(tmp_path, monkeypatch):
    for h in ("et_common.h", "et_float.h", *PROGRAM_HEADERS):  # et_weights.h (a driver header) missing
        (tmp_path / h).write_text("/* */\n")
    monkeypatch.setattr(runtime_headers, "RUNTIME_DIR", tmp_path)
    with pytest.raises(CBackendError, match="et_weights.h .*missing"):
        kernel_headers()
    (tmp_path / "et_weights.h").write_text("/* */\n")
    assert kernel_headers() == ("et_common.h", "et_float.h")
    with pytest.raises(CBackendError, match="et_nowhere.h is missing"):
        header_text("et_nowhere.h")
