"""The BLAS the host library's float32 convolutions and dense layers run on (issue 20).

The host build (host.DEFAULT_CFLAGS) adds `compile_flags()`: -DET_BLAS, the include folder and
the names of the library's functions, and build_library links `link_flags(flags)` after the
source. runtime/et_float_gemm.h then computes every one-group convolution and every dense
layer as single-precision GEMMs over the whole batch; without -DET_BLAS (no BLAS installed,
EDGETRAIN_BLAS=0, the Cortex-M build, an emitted project's Makefile, the sanitizer build) it
keeps the dependency-free kernels of et_float.h.

The default host build (`default_flags()`) uses the BLAS whenever one is installed;
EDGETRAIN_BLAS=0 turns it off. Its float32 results differ from the portable kernels' in the
order of their sums only: torchvision's resnet50 at 64x64, batch 2, whose layer2.0 gradients
were 2.4e-2 away from the float32 reference on the BLAS, has a ReLU input within float32
rounding of zero; the BLAS result is the one within 1.7e-6 of the float64 reference
(tests/backends/c/float_agreement.py). Tests and benches may ask for it
explicitly (`compile_flags()`). The BLAS is OpenBLAS from the PyPI package
scipy-openblas32 (a pinned dependency: symbols prefixed scipy_, 32-bit indices, its kernels
picked at run time for the CPU). It runs on one thread unless EDGETRAIN_BLAS_THREADS says more
(read by the library at its first GEMM)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

#: the flag that selects the BLAS kernels of et_float_gemm.h
BLAS_FLAG = "-DET_BLAS"
#: environment: "0" never finds a BLAS (the host library then builds the portable kernels)
ENABLE_ENV = "EDGETRAIN_BLAS"


@dataclass(frozen=True)
class Blas:
    """An installed BLAS: its name and version, the compiler and the linker flags."""

    name: str
    cflags: tuple
    ldflags: tuple


def _scipy_openblas32() -> Optional[Blas]:
    try:
        import scipy_openblas32 as sob
    except ImportError:
        return None
    inc, libdir, lib = Path(sob.get_include_dir()), Path(sob.get_lib_dir()), sob.get_library()
    if not (inc / "cblas.h").exists() or not (libdir / f"lib{lib}.so").exists():
        return None
    prefix = "scipy_" if lib.startswith("scipy_") else ""
    return Blas(name=f"scipy-openblas32 {sob.__version__}",
                cflags=(BLAS_FLAG, f"-I{inc}", f"-DET_BLAS_SGEMM={prefix}cblas_sgemm",
                        f"-DET_BLAS_SET_THREADS={prefix}openblas_set_num_threads"),
                ldflags=(f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-l{lib}"))


@lru_cache(maxsize=1)
def host_blas() -> Optional[Blas]:
    """The installed BLAS, or None (not installed, or EDGETRAIN_BLAS=0)."""
    if os.environ.get(ENABLE_ENV) == "0":
        return None
    return _scipy_openblas32()


def compile_flags() -> tuple:
    """The compiler flags that select and find the BLAS (none without one)."""
    b = host_blas()
    return b.cflags if b else ()


def default_flags() -> tuple:
    """The BLAS flags of the default host build: compile_flags(), the BLAS whenever one is
    installed and EDGETRAIN_BLAS is not 0."""
    return compile_flags()


def link_flags(flags: Sequence[str]) -> tuple:
    """The linker flags a build with `flags` needs after its sources (the BLAS when selected)."""
    b = host_blas()
    return b.ldflags if b and BLAS_FLAG in flags else ()


def describe(flags: Sequence[str]) -> str:
    """Which kernels a build with `flags` uses, in words (the benchmarks print it)."""
    b = host_blas()
    if BLAS_FLAG in flags and b:
        return f"BLAS ({b.name}, {os.environ.get('EDGETRAIN_BLAS_THREADS', '1')} thread(s))"
    return "portable kernels (no BLAS)"
