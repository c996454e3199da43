"""The host library's kernels compiled once per machine, not once per model.

The runtime headers define every kernel `ET_INLINE` (static, always inlined): a model.c that
includes them had each kernel call inlined and specialised at each of its call sites, and gcc
spent a minute on one model's three graphs. For the host library (host.build_library), the
kernels (each `ET_INLINE void et_...(...)` of the runtime headers with a body of at least
MIN_BODY_LINES lines) are instead compiled once into an object of out-of-line wrappers
(`etk_<name>`), cached under the one cache directory keyed by the headers' text, the flags and
the compiler's version; model.c is compiled behind a front file that declares those wrappers
and renames its kernel calls to them. model.c itself (what emit.py writes, and what emitted
projects and the Cortex-M firmware compile) is unchanged. Small helpers (vector loads, exp)
stay inline: per-element calls would cost more than they save.

Out of line, a kernel loses what inlining gave it at each call site: its shape arguments as
constants. For the direct convolutions of the portable kernels (the depthwise and KxK
convolutions of et_float.h) that doubled mbv2's step (4.4 -> 8.0 ms): the tap loops ran with
run-time bounds. So the convolutions are also compiled specialised for the common kernel sizes
and strides (SPECIALISED: 1x1 pointwise; 3x3, 5x5, 7x7 at stride 1 and 2, no dilation), each a wrapper
`etk_<name>_k<K>s<S>` with those arguments constant, and the front file's inline dispatcher
(`etd_<name>`) picks one at each call site, where the arguments are literals (the test folds
away). With the BLAS (ET_BLAS) one-group convolutions are GEMMs and depthwise ones have their own
specialised kernels (et_float_gemm.h's ET_DW_SPECIALISE), so the wrappers are left out there
(PORTABLE_ONLY) and cost that build no compile time. The object is built for this machine
(-march=native in the host flags: AVX2 / AVX-512 where the CPU has them), so its cache key holds
the CPU's identity and feature flags (cpu_identity): a cache directory shared with another CPU
gets its own object. A first build takes minutes: past a second it says what it builds and why,
with its elapsed time (toolchain.announced_build).

The object is compiled in parts, each of one header's kernels and including that header alone (it
includes what it uses), and each part is cached on its own, keyed by its preprocessed text and the
flags that are not the preprocessor's (-D, -U, -I: their whole effect is in that text), as ccache
does: builds whose flags differ in a macro that a part's text does not see (the checked step's
ET_STEP_GUARD outside et_float_fused.h, the profiler's ET_PROFILE, the BLAS's names outside the GEMM
headers) share that part's object and compile only the others; only the linked object is per flags."""
from __future__ import annotations

import hashlib
import math
import os
import platform
import re
import shutil
import time
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .cache import cache_path, publish_build
from .layout import CBackendError
# headers with per-program state (weight banks, the page file, a failed check): never in the shared object
from .runtime_headers import PROGRAM_HEADERS
from .toolchain import announced_build, run_tool, run_tools

#: a kernel definition of the runtime headers: `ET_INLINE void et_name(params) {`
KERNEL_DEF = re.compile(r"^ET_INLINE void (et_\w+)\(([^)]*)\)\s*\{", re.M)
#: a shorter function stays inline in model.c (a helper, called per element or per row)
MIN_BODY_LINES = 6
#: the wrappers' prefix
PREFIX = "etk_"
#: seconds the kernel object's compile may take
KERNELS_TIMEOUT = 600
#: (wrapper suffix, {argument: a constant, or the argument it equals}) of a specialised wrapper:
#: pointwise (1x1, stride 1, no padding) and square kernels of 3, 5, 7 taps at stride 1 and 2
#: without dilation (MobileNets', MCUNets', ResNets' convolutions), these also depthwise
#: (O == G == C: the channel-group loops fold to one iteration); other shapes take the generic wrapper
CONV_SHAPES = (("_k1s1", {"KH": 1, "KW": 1, "SH": 1, "SW": 1, "PH": 0, "PW": 0, "DH": 1, "DW": 1}),
               *((f"_k{k}s{s}{dw}", {"KH": k, "KW": k, "SH": s, "SW": s, "DH": 1, "DW": 1,
                                     **({"O": "C", "G": "C"} if dw else {})})
                 for k in (3, 5, 7) for s in (1, 2) for dw in ("_dw", "")))
#: defined in the kernel object's sources: a kernel that calls another there may call its wrapper instead of
#: inlining it (runtime/et_float_fused.h)
KERNEL_OBJECT = "ET_KERNEL_OBJECT"
#: the macro under which the specialised wrappers are left out (the host BLAS build, blas.py)
PORTABLE_ONLY = "ET_BLAS"
#: the kernel object is compiled in about this many sources (a header costlier than this share of the whole is
#: split), up to one compiler a CPU at once, then linked into one relocatable object (`cc -r`): a first build's
#: wall time shared by the cores (a fixed count: the same object on any machine)
KERNEL_PARTS = 8
#: the flags whose whole effect is on the preprocessed text (macros, include folders): left out of a part's key,
#: which holds that text instead
PREPROCESSOR_FLAGS = ("-D", "-U", "-I")
#: model_host.c's first include: the kernel headers (front_header)
FRONT_HEADER = "et_front.h"
#: {kernel: the argument sets it is also compiled for (portable kernels only)}
SPECIALISED = {"et_conv2d": CONV_SHAPES, "et_conv2d_grad_input": CONV_SHAPES, "et_conv2d_grad_weight": CONV_SHAPES}


def kernel_headers(files: Mapping[str, str]) -> list[str]:
    """The runtime headers of an emitted program's files, in its include order, less the per-program ones."""
    return [n for n in files if n.endswith(".h") and n != "model.h" and n not in PROGRAM_HEADERS]


def kernel_signatures(files: Mapping[str, str]) -> dict[str, str]:
    """{kernel name: its parameter list} of the kernels the headers define."""
    return {name: k[0] for name, k in _kernels(files).items()}


def _kernels(files: Mapping[str, str]) -> dict[str, tuple[str, int, str]]:
    """{kernel name: (its parameter list, its body's lines, the header that defines it)}"""
    found = {}
    for h in kernel_headers(files):
        text = files[h]
        for m in KERNEL_DEF.finditer(text):
            end = text.find("\n}", m.end())
            lines = text.count("\n", m.end(), end) if end >= 0 else 0
            if lines >= MIN_BODY_LINES:
                found[m.group(1)] = (" ".join(m.group(2).split()), lines, h)
    return found


def kernel_parts(files: Mapping[str, str], parts: int = KERNEL_PARTS) -> list[list[str]]:
    """The kernels of each source: one header's kernels in a part (its source includes that header
    alone), a header costing more than 1/`parts` of the whole (body lines x wrappers) split into
    that many parts or one a kernel, its costliest kernel first to its least loaded part, ties to
    the first. The costliest part first (kernels_object compiles them in this order: the longest
    start first), ties in include order. The same split on every machine."""
    kernels = _kernels(files)
    cost = {n: lines * (1 + len(_variants(n, params))) for n, (params, lines, _) in kernels.items()}
    share = sum(cost.values()) / max(1, parts)
    out: list[list[str]] = []
    for h in kernel_headers(files):
        names = [n for n, k in kernels.items() if k[2] == h]
        if not names:
            continue
        split: list[list[str]] = [[] for _ in range(min(len(names), max(1, math.ceil(sum(cost[n] for n in names)
                                                                                   / share - 1e-9))))]
        load = [0] * len(split)
        for name in sorted(names, key=lambda n: (-cost[n], n)):
            k = load.index(min(load))
            split[k].append(name)
            load[k] += cost[name]
        out += [sorted(p, key=list(kernels).index) for p in split]
    return sorted(out, key=lambda p: -sum(cost[n] for n in p))


def _arg_names(params: str) -> list[str]:
    if params.strip() in ("", "void"):
        return []
    return [re.findall(r"\w+", p.split("[")[0])[-1] for p in params.split(",")]


def _includes(files: Mapping[str, str], only: Optional[set] = None) -> list[str]:
    """The include lines of every kernel header, or of those in `only`."""
    return [f'#include "{h}"' for h in kernel_headers(files) if only is None or h in only]


def _variants(name: str, params: str) -> list[tuple[str, dict]]:
    """(wrapper suffix, {argument: value}) of the specialised wrappers of kernel `name`, in the
    order the dispatcher tries them."""
    args = set(_arg_names(params))
    return [(suffix, v) for suffix, v in SPECIALISED.get(name, ()) if set(v) <= args]


def _params_without(params: str, fixed: dict) -> str:
    kept = [p.strip() for p in params.split(",") if _arg_names(p)[0] not in fixed]
    return ", ".join(kept) or "void"


def kernels_source(files: Mapping[str, str], kernels: Sequence[str] | None = None) -> str:
    """et_kernels.c: the headers, one out-of-line wrapper per kernel, and the specialised
    wrappers (their fixed arguments as constants); of the `kernels` only when given, and then
    only the headers that define them."""
    found = {n: k for n, k in _kernels(files).items() if kernels is None or n in kernels}  # one scan of the headers
    lines = ["/* generated by edgetrain: the runtime's kernels out of line (backends/c/kernel_lib.py) */",
             f"#define {KERNEL_OBJECT} 1", *_includes(files, None if kernels is None else {k[2] for k in found.values()})]
    for name, (params, _, _) in found.items():
        names = _arg_names(params)
        lines.append(f"void {PREFIX}{name}({params}) {{ {name}({', '.join(names)}); }}")
        variants = _variants(name, params)
        if variants:
            lines.append(f"#ifndef {PORTABLE_ONLY}")
        for suffix, fixed in variants:
            call = ", ".join(str(fixed[a]) if a in fixed else a for a in names)
            lines.append(f"void {PREFIX}{name}{suffix}({_params_without(params, fixed)}) {{ {name}({call}); }}")
        if variants:
            lines.append("#endif")
    return "\n".join(lines) + "\n"


def _dispatcher(name: str, params: str) -> list[str]:
    """The front file's inline dispatcher of a specialised kernel: at a call site with literal
    shape arguments the tests fold and one direct call remains."""
    names = _arg_names(params)
    lines = [f"static inline __attribute__((always_inline)) void etd_{name}({params}) {{"]
    for suffix, fixed in _variants(name, params):
        test = " && ".join(f"{a} == {v}" for a, v in fixed.items())
        lines.append(f"  if ({test}) {{ {PREFIX}{name}{suffix}({', '.join(a for a in names if a not in fixed)}); "
                     "return; }")
    return lines + [f"  {PREFIX}{name}({', '.join(names)});", "}"]


def front_header(files: Mapping[str, str]) -> str:
    """FRONT_HEADER, model_host.c's first include: every kernel header (kernel_headers), in the program's include
    order. host.build_library writes it beside model_host.c, or takes it precompiled (front_pch.py)."""
    lines = ["/* generated by edgetrain: the runtime headers, model_host.c's first include (kernel_lib.py) */",
             "#ifndef ET_FRONT_H", "#define ET_FRONT_H", *_includes(files), "#endif"]
    return "\n".join(lines) + "\n"


def front_source(files: Mapping[str, str]) -> str:
    """model_host.c: the headers (FRONT_HEADER first, before any C token, so that GCC may load it precompiled;
    then model.h, which they do not read), the wrappers' prototypes, model.c's kernel calls renamed to them
    (those it makes), then model.c (its own includes are then no-ops: include guards)."""
    model_c = files["model.c"]
    lines = ["/* generated by edgetrain: model.c calling the cached kernels (backends/c/kernel_lib.py) */",
             f'#include "{FRONT_HEADER}"', *(['#include "model.h"'] if "model.h" in files else [])]
    called = set(re.findall(r"\b(\w+)\(", model_c))  # one pass over model.c, not a search per kernel
    for name, params in kernel_signatures(files).items():
        if name not in called:
            continue
        lines.append(f"void {PREFIX}{name}({params});")
        variants = _variants(name, params)
        if not variants:
            lines.append(f"#define {name} {PREFIX}{name}")
            continue
        lines.append(f"#ifndef {PORTABLE_ONLY}")
        lines += [f"void {PREFIX}{name}{suffix}({_params_without(params, fixed)});" for suffix, fixed in variants]
        lines += [*_dispatcher(name, params), f"#define {name} etd_{name}", "#else", f"#define {name} {PREFIX}{name}",
                  "#endif"]
    lines.append('#include "model.c"')
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=None)
def cpu_identity() -> str:
    """This machine's CPU as -march=native sees it: the model and feature flags of /proc/cpuinfo
    (Linux), else the platform's processor string."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + " " + platform.processor()
    keep = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(sorted(set(keep)))


@lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    r = run_tool([cc, "--version"], timeout=60)
    return r.stdout.splitlines()[0] if r.stdout else cc


def part_key(preprocessed: str, flags: Sequence[str], cc: str) -> str:
    """The cache key of a part's object: its preprocessed text, the flags less the preprocessor's
    (PREPROCESSOR_FLAGS: their effect is in that text), the compiler's version, and this CPU's
    identity when built for it (-march=native)."""
    h = hashlib.sha256(preprocessed.encode() + b"\0")
    h.update(" ".join(f for f in flags if not f.startswith(PREPROCESSOR_FLAGS)).encode() + b"\0")
    h.update(compiler_version(cc).encode())
    if "-march=native" in flags:
        h.update(b"\0" + cpu_identity().encode())
    return h.hexdigest()[:24]


def headers_key(source: bytes, cc: str, flags: Sequence[str], files: Mapping[str, str]) -> str:
    """The cache key of what is compiled from `source` and the kernel headers it includes (the kernel object,
    front_pch.py's precompiled header): that source, the headers' names and text, the flags, the compiler's
    version, and this CPU's identity when built for it (-march=native: another CPU gets its own)."""
    h = hashlib.sha256(source)
    for name in kernel_headers(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    h.update(" ".join(flags).encode() + b"\0" + compiler_version(cc).encode())
    if "-march=native" in flags:
        h.update(b"\0" + cpu_identity().encode())
    return h.hexdigest()[:24]


def kernels_object(cc: str, flags: Sequence[str], files: Mapping[str, str]) -> Path:
    """The compiled kernels (et_kernels.o, position independent) for these headers, flags and
    compiler: built on first use, then reused from cache_path("c")/kernels-<key>. A build
    preprocesses each part (kernel_parts), takes the parts whose objects the cache holds
    (cache_path("c")/kernel-part-<part_key>), compiles the others side by side and caches them,
    then links them all into one relocatable object."""
    sources = [kernels_source(files, names) for names in kernel_parts(files)] or [kernels_source(files)]
    root = cache_path("c")
    key = headers_key("\0".join(sources).encode(), cc, flags, files)
    d = root / f"kernels-{key}"
    obj = d / "et_kernels.o"
    if obj.exists():
        return obj

    def failed(work: Path, k: int, r) -> CBackendError:
        return CBackendError(f"the kernel library failed to compile in {work} (et_kernels_{k}.c):\n{r.stderr[-4000:]}")

    def build(work: Path) -> None:
        for name in kernel_headers(files):
            (work / name).write_text(files[name])
        for k, src in enumerate(sources):
            (work / f"et_kernels_{k}.c").write_text(src)
        t0 = time.monotonic()
        jobs = os.cpu_count() or 1
        pre = run_tools([[cc, *flags, "-fPIC", "-E", "-o", f"et_kernels_{k}.i", f"et_kernels_{k}.c"]
                         for k in range(len(sources))], work, KERNELS_TIMEOUT, jobs)
        for k, r in enumerate(pre):
            if r.returncode != 0:
                raise failed(work, k, r)
        parts = [root / f"kernel-part-{part_key((work / f'et_kernels_{k}.i').read_text(), flags, cc)}" / "part.o"
                 for k in range(len(sources))]
        todo = [k for k, p in enumerate(parts) if not p.exists()]
        results = run_tools([[cc, *flags, "-fPIC", "-c", "-o", f"et_kernels_{k}.o", f"et_kernels_{k}.c"] for k in todo],
                            work, max(1.0, KERNELS_TIMEOUT - (time.monotonic() - t0)), jobs)
        for k, r in zip(todo, results):
            if r.returncode != 0:
                raise failed(work, k, r)
        for k in todo:  # cached for the next flags that give this part the same text
            publish_build(parts[k].parent, lambda w, k=k: shutil.copyfile(work / f"et_kernels_{k}.o", w / "part.o"),
                          prefix="kernel-part-build-")
        r = run_tool([cc, "-r", "-nostdlib", "-o", "et_kernels.o",
                      *(f"et_kernels_{k}.o" if k in todo else str(p) for k, p in enumerate(parts))],
                     work, max(1.0, KERNELS_TIMEOUT - (time.monotonic() - t0)))
        if r.returncode != 0:
            raise CBackendError(f"the kernel library's parts failed to link in {work}:\n{r.stderr[-4000:]}")
        for k in range(len(sources)):  # the preprocessed text (about 2 MB a part) and the parts' objects
            (work / f"et_kernels_{k}.i").unlink()  # (cached apart) served their turn
            (work / f"et_kernels_{k}.o").unlink(missing_ok=True)

    n = len(kernel_signatures(files))
    what = f"the runtime's kernel library ({n} kernel{'' if n == 1 else 's'}, et_kernels.o)"
    why = (f"first use of these runtime headers, flags and compiler on this machine: not yet in the cache {d}; "
           f"built once, then reused")
    with announced_build(what, why):
        publish_build(d, build, prefix="kernels-build-")
    return obj
