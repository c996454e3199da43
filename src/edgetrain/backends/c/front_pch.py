"""The runtime headers precompiled once (GCC's precompiled header), not parsed again for every program.

A host library's model_host.c (kernel_lib.front_source) starts with `#include "et_front.h"`
(kernel_lib.front_header), a header that includes every runtime header of the kernel object, which gcc read
again for every program: the runtime headers with the BLAS's, oneDNN's and the CPU's intrinsics headers
(-march=native), the same text for each program of a set of flags (bench/compile_time.py --pch measures what
reading it costs a build). For GCC, et_front.h is compiled once per set of headers, flags,
compiler and CPU into et_front.h.gch, cached in cache_path("c")/pch-<key> beside the headers it includes;
host.build_library puts that folder on the include path (and leaves et_front.h out of the program's own
folder, which would be searched first), and gcc loads the parsed headers from it. GCC checks that a .gch was
made by the same compiler with compatible options and the same macros where the header reads them, and
otherwise parses et_front.h (from the same folder) as text: the program is the same either way, the same
source. A compiler that is not GCC (clang, whose precompiled headers take other options) gets none
(front_pch returns None) and et_front.h is written beside model_host.c."""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .cache import cache_path, publish_build
from .kernel_lib import FRONT_HEADER as FRONT, front_header, headers_key, kernel_headers
from .layout import CBackendError
from .toolchain import announced_build, run_tool

#: seconds its precompilation may take
PCH_TIMEOUT = 300


@lru_cache(maxsize=None)
def is_gcc(cc: str) -> bool:
    """Whether `cc` is GCC (its predefined macros: __GNUC__ without __clang__, which clang also defines)."""
    r = run_tool([cc, "-dM", "-E", "-x", "c", os.devnull], timeout=60)
    return r.returncode == 0 and "#define __GNUC__ " in r.stdout and "__clang__" not in r.stdout


def front_pch(cc: str, flags: Sequence[str], files: Mapping[str, str]) -> Optional[Path]:
    """The folder of et_front.h.gch for these headers, `flags` (a program's compile flags, -fPIC added here as
    host.build_library adds it) and compiler, built on first use, with et_front.h and the headers it includes
    beside it; None where `cc` is not GCC or the program has no runtime header."""
    if not kernel_headers(files) or not is_gcc(cc):
        return None
    key = headers_key(front_header(files).encode() + b"\0", cc, flags, files)
    d = cache_path("c") / f"pch-{key}"
    if (d / f"{FRONT}.gch").exists():
        return d

    def build(work: Path) -> None:
        for name in kernel_headers(files):
            (work / name).write_text(files[name])
        (work / FRONT).write_text(front_header(files))
        r = run_tool([cc, *flags, "-fPIC", "-x", "c-header", "-o", f"{FRONT}.gch", FRONT], work, PCH_TIMEOUT)
        if r.returncode != 0:
            raise CBackendError(f"the runtime headers failed to precompile in {work}:\n{r.stderr[-4000:]}")

    with announced_build(f"the runtime headers, precompiled ({FRONT}.gch)",
                         f"first use of these headers, flags and compiler on this machine: not yet in the cache {d}; "
                         "built once, then reused"):
        publish_build(d, build, prefix="pch-build-")
    return d
