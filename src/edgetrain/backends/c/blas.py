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
explicitly (`compile_flags()`). The BLAS is Intel MKL from the PyPI package mkl where it is
installed (`pip install mkl`: LP64, its GNU OpenMP threading layer, its kernels picked at run
time for the CPU; on a 2-core Xeon it ran ResNet-18's convolution GEMMs 20-40 % faster than
OpenBLAS), else OpenBLAS from the PyPI package scipy-openblas32 (a pinned dependency: symbols
prefixed scipy_, 32-bit indices, its kernels picked at run time for the CPU);
EDGETRAIN_BLAS=openblas takes OpenBLAS even where MKL is installed. It runs on one thread unless
EDGETRAIN_BLAS_THREADS says more (read by the library at its first GEMM).

`host_blas()` is the BLAS with a C header, which an emitted project's Makefile links
(project.py): OpenBLAS (MKL's wheel ships no headers); `library_blas()` the one the ctypes
library links.

On top of the BLAS, the ctypes library runs the larger dense convolutions (not 1x1 at stride 1)
on oneDNN where the PyPI packages onednn-cpu-gomp and onednn-devel-cpu-gomp are installed (a
dependency on x86-64 Linux): `dnnl()`, -DET_DNNL, runtime/et_float_dnnl.h. Its JIT kernels are
picked for the CPU by oneDNN itself (AVX-512 where the CPU has it, whatever OPENBLAS_CORETYPE
says). EDGETRAIN_DNNL=0 leaves it out (every convolution then takes the GEMM path); without a
BLAS it is left out too.

Before both, the library computes the 3x3 stride-1 convolutions of 16 channels and more (forward,
input gradient, weight gradient) as Winograd F(4x4, 3x3) where they have enough 4x4 tiles, else
F(2x2, 3x3), its 36 or 16 GEMMs on oneDNN's matmul where oneDNN is installed, else on the BLAS
(runtime/et_float_wino.h); a build with -DET_WINO=0 leaves it out, one with -DET_WINO4=0 keeps
F(2x2, 3x3) only."""
from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

#: the flag that selects the BLAS kernels of et_float_gemm.h
BLAS_FLAG = "-DET_BLAS"
#: environment: "0" never finds a BLAS (the host library then builds the portable kernels),
#: "openblas" takes OpenBLAS where MKL is installed too
ENABLE_ENV = "EDGETRAIN_BLAS"
#: the flag that selects MKL's declarations in et_float_blas.h
MKL_FLAG = "-DET_BLAS_MKL"
#: MKL's libraries, in link order (LP64 interface, GNU OpenMP threading, core)
MKL_LIBS = ("libmkl_intel_lp64.so", "libmkl_gnu_thread.so", "libmkl_core.so")
#: the flag that runs the dense convolutions on oneDNN (runtime/et_float_dnnl.h)
DNNL_FLAG = "-DET_DNNL"
#: environment: "0" leaves oneDNN out of the ctypes library
DNNL_ENV = "EDGETRAIN_DNNL"
#: oneDNN's library and headers: (distribution, the file of it that locates the folder)
DNNL_LIB = ("onednn-cpu-gomp", "libdnnl.so.3")
DNNL_HEADER = ("onednn-devel-cpu-gomp", "oneapi/dnnl/dnnl.h")


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
def mkl_blas() -> Optional[Blas]:
    """MKL from the PyPI package mkl, or None: its libraries (versioned names only) in one folder."""
    try:
        dist = importlib.metadata.distribution("mkl")
    except importlib.metadata.PackageNotFoundError:
        return None
    found = {}
    for f in dist.files or ():
        name = Path(str(f)).name
        for lib in MKL_LIBS:
            if name.startswith(lib + "."):
                found[lib] = Path(f.locate()).resolve()
    if len(found) != len(MKL_LIBS) or len({p.parent for p in found.values()}) != 1:
        return None
    libdir = found[MKL_LIBS[0]].parent
    return Blas(name=f"MKL {dist.version}", cflags=(BLAS_FLAG, MKL_FLAG),
                ldflags=(f"-L{libdir}", f"-Wl,-rpath,{libdir}", *(f"-l:{found[lib].name}" for lib in MKL_LIBS),
                         "-lgomp", "-lpthread", "-lm", "-ldl"))


def _locate(dist_name: str, suffix: str) -> tuple[Optional[Path], str]:
    """(the installed file of distribution dist_name whose path ends in suffix, its version); (None, "") if absent."""
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None, ""
    for f in dist.files or ():
        if str(f).replace("\\", "/").endswith(suffix):
            path = Path(f.locate()).resolve()
            if path.exists():
                return path, dist.version
    return None, ""


@lru_cache(maxsize=1)
def _onednn() -> Optional[Blas]:
    lib, version = _locate(*DNNL_LIB)
    header, _ = _locate(*DNNL_HEADER)
    if lib is None or header is None:
        return None
    inc = header.parents[len(Path(DNNL_HEADER[1]).parts) - 1]  # the folder that holds oneapi/dnnl/
    libdir = lib.parent
    return Blas(name=f"oneDNN {version}", cflags=(DNNL_FLAG, f"-I{inc}"),
                ldflags=(f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-l:{DNNL_LIB[1]}", "-lgomp"))


def dnnl() -> Optional[Blas]:
    """oneDNN for the ctypes library's dense convolutions (the installed onednn-cpu-gomp and its
    headers), or None: not installed, or EDGETRAIN_DNNL=0."""
    if os.environ.get(DNNL_ENV) == "0":
        return None
    return _onednn()


@lru_cache(maxsize=1)
def host_blas() -> Optional[Blas]:
    """The installed BLAS with a C header (OpenBLAS), or None (not installed, or EDGETRAIN_BLAS=0)."""
    if os.environ.get(ENABLE_ENV) == "0":
        return None
    return _scipy_openblas32()


def library_blas() -> Optional[Blas]:
    """The BLAS the ctypes library links: MKL where installed (unless EDGETRAIN_BLAS=openblas),
    else host_blas(); None with EDGETRAIN_BLAS=0 or none installed."""
    env = os.environ.get(ENABLE_ENV)
    if env == "0":
        return None
    m = mkl_blas() if env != "openblas" else None
    return m if m is not None else host_blas()


def _blas_of(flags: Sequence[str]) -> Optional[Blas]:
    """The BLAS a build with `flags` links: MKL's flag names MKL, else OpenBLAS (none with
    EDGETRAIN_BLAS=0)."""
    if BLAS_FLAG not in flags or os.environ.get(ENABLE_ENV) == "0":
        return None
    return mkl_blas() if MKL_FLAG in flags else host_blas()


def compile_flags() -> tuple:
    """The compiler flags that select and find the BLAS, and oneDNN on top of it where installed
    (none without a BLAS)."""
    b = library_blas()
    if b is None:
        return ()
    d = dnnl()
    return b.cflags + (d.cflags if d else ())


def default_flags() -> tuple:
    """The BLAS flags of the default host build: compile_flags(), the BLAS whenever one is
    installed and EDGETRAIN_BLAS is not 0."""
    return compile_flags()


def link_flags(flags: Sequence[str]) -> tuple:
    """The linker flags a build with `flags` needs after its sources (the BLAS when selected, and
    oneDNN when its flag is there too)."""
    b = _blas_of(flags)
    if b is None:
        return ()
    d = _onednn() if DNNL_FLAG in flags else None
    return b.ldflags + (d.ldflags if d else ())


def describe(flags: Sequence[str]) -> str:
    """Which kernels a build with `flags` uses, in words (the benchmarks print it)."""
    b = _blas_of(flags)
    if b:
        d = _onednn() if DNNL_FLAG in flags else None  # as link_flags: the flags say, not the environment
        wino = "-DET_WINO=0" not in flags  # runtime/et_float_wino.h, on unless the build leaves it out
        tiles = "F(2x2, 3x3)" if "-DET_WINO4=0" in flags else "F(4x4, 3x3) or F(2x2, 3x3)"
        return (f"BLAS ({b.name}, {os.environ.get('EDGETRAIN_BLAS_THREADS', '1')} thread(s))"
                + (f", the dense convolutions on {d.name} (in pieces of channels, one thread each)" if d else "")
                + (f", 3x3 stride-1 ones as Winograd {tiles}" if wino else ""))
    return "portable kernels (no BLAS)"
