"""Build an emitted program with the system C compiler and run it through ctypes.

Libraries are cached by a content hash of the emitted sources, the flags and the compiler;
each C runner (CRunner: a compiled program run through ctypes) loads its own copy of the
library (its state arrays are its weights)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from ...config import usable_cpus
from ...ops.check import RunTimeCheckError
from ...runtime.compiled import CompiledProgram
from ...runtime.runner import RunnerBase, as_array
from .blas import default_flags as blas_default_flags, describe as blas_describe, link_flags as blas_link_flags
from .cache import cache_path, publish_build
from .front_pch import front_pch, is_gcc
from .kernel_lib import FRONT_HEADER, compiler_version, front_header, front_source, kernels_object
from .link_deps import link_flags as deps_link_flags
from .layout import GRAPHS, CBackendError, Layout, build_layout
from .step_guard import double_buffered, with_guard
from .toolchain import announced_build, host_compiler, run_tool

#: the ctypes library: optimised for this machine, no implicit FMA contraction (int8 kernels'
#: float sums must be exactly the reference's), sqrt as an instruction; ET_FLOAT_FMA: the float32 GEMM / convolution kernels use explicit fused multiply-adds where
#: the CPU has them, and ET_OMP_SIMD lets `omp simd` reductions reassociate float sums: the
#: fast host library, within 1e-5 of the reference (int8 kernels use neither); ET_GUARD_WORDS=16: the arena
#: starts on a cache line (runtime/et_common.h); ET_GRAPH_O1: the graphs' call sequences at -O1 (et_common.h
#: ET_GRAPH_ATTR), the kernels at -O3
DEFAULT_CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp-simd", "-DET_OMP_SIMD",
                  "-DET_FLOAT_FMA", "-DET_GUARD_WORDS=16", "-DET_GRAPH_O1", "-std=gnu11",
                  "-Wall", "-Wno-unused-function", "-Wno-unused-variable")
#: an emitted project's Makefile: every float sum in the source's order, no FMA, so its host
#: build prints the very losses its Cortex-M build prints; serial (no -fopenmp: the cross builds take these too)
PROJECT_CFLAGS = tuple(f for f in DEFAULT_CFLAGS if f not in ("-DET_OMP_SIMD", "-DET_FLOAT_FMA", "-DET_GRAPH_O1"))
#: the ctypes library on a machine with a BLAS, unless EDGETRAIN_BLAS=0 (blas.py): et_float_gemm.h's
#: convolutions and dense layers as GEMMs (emitted projects keep the portable kernels)
DEFAULT_CFLAGS = DEFAULT_CFLAGS + blas_default_flags()
#: the threaded host library (opt-in: CRunner(flags=OPENMP_CFLAGS, threads=N)): -fopenmp runs the kernels'
#: ET_PARALLEL_FOR loops, the GEMMs' fixed tiles and the BLAS convolutions' pieces (runtime/et_common.h,
#: et_float_blas.h) on `threads` threads, results independent of the count. At one thread about as fast as the
#: serial build (the depthwise kernels' parallel loops sit where their sizes are constants; GEMM tiles only from 8M
#: multiply-adds; its pieces' weight gradients sum in piece order, the serial build's block after block); not the
#: default: a lent 16-core machine measured it once (docs/benchmarks.md). libgomp's workers spin between loops
#: unless OMP_WAIT_POLICY=passive is in the environment when libgomp loads (PyTorch's import loads it): on a
#: busy shared machine spinning made 2 threads several times slower than 1, on a quiet one passive waking cost
#: more than the second thread gained (bench/step_speed.py's docstring)
OPENMP_CFLAGS = DEFAULT_CFLAGS + ("-fopenmp",)
#: a host library built with this flag too times every node of every graph it runs (emit_graphs.PROFILE's clock
#: brackets), which CRunner.node_seconds reads: bench/step_speed.py --profile's per-op table
PROFILE_FLAG = "-DET_PROFILE"
#: the sanitizer build of the tests
SANITIZE_CFLAGS = ("-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                   "-fno-omit-frame-pointer", "-ffp-contract=off", "-fno-math-errno", "-fopenmp-simd", "-DET_OMP_SIMD",
                   "-std=gnu11")
#: seconds a compile may take (a large model's model.c at -O3)
COMPILE_TIMEOUT = 900
#: model.c from this many bytes on is compiled in pieces side by side, one a CPU (split_flags); below it one
#: compile is about as quick as the pieces' set-up
SPLIT_MIN_BYTES = 256 * 1024
#: at most this many pieces at once
SPLIT_MAX_JOBS = 8
#: environment: a C runner's thread count when none is given (default 1)
THREADS_ENV = "EDGETRAIN_BLAS_THREADS"


def check_threads(threads) -> int:
    """`threads` (the BLAS's and the kernels' thread count of a C runner) as an int >= 1, or a
    ValueError / TypeError saying what it got."""
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be an int >= 1, got {threads!r}")
    if threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads}")
    return int(threads)


def default_threads() -> int:
    """A C runner's thread count when none is given: $EDGETRAIN_BLAS_THREADS, else 1."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if not env:
        return 1
    try:
        return check_threads(int(env))
    except ValueError as err:
        raise ValueError(f"{THREADS_ENV}={env!r}: {err}") from None


def find_cc() -> str:
    """The C compiler: $CC, else cc, gcc or clang on PATH (toolchain.host_compiler)."""
    cc = host_compiler()
    if cc is not None:
        return cc
    raise CBackendError("backend='c' needs a C compiler: none of $CC, cc, gcc, clang was found on PATH")


def cache_dir() -> Path:
    """Where the host libraries are cached: the "c" folder of the one cache directory (cache.py:
    $EDGETRAIN_CACHE, else $XDG_CACHE_HOME/edgetrain)."""
    return cache_path("c")


def content_key(files: Mapping[str, str], flags: Sequence[str], cc: str) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    h.update(" ".join(flags).encode() + b"\0" + cc.encode())
    return h.hexdigest()[:24]


def compile_c(cc: str, args: Sequence[str], cwd: Path) -> None:
    """Run the compiler; past COMPILE_TIMEOUT seconds its whole process group is killed
    (toolchain.run_tool: cc1 with it) and ToolTimeout raised."""
    r = run_tool([cc, *args], cwd, COMPILE_TIMEOUT)
    if r.returncode != 0:
        raise CBackendError(f"C compile failed in {cwd} ({cc} {' '.join(args)}):\n{r.stderr[-4000:]}")


def split_flags(cc: str, model_c: str) -> tuple:
    """The flags that compile a large model.c (SPLIT_MIN_BYTES) on this machine's CPUs: with GCC, -flto=N, its
    link-time optimization, which optimizes and compiles model.c's functions in N partitions side by side (one
    `make -jN`, serial where make is missing) once its whole-program pass is done. Only model.c's code takes part
    (the kernel object is a plain object): its calls, loops and arithmetic compile under the same options, a
    function at a time, as in one compile (a test checks the program's numbers bit for bit). () for a small
    model.c, one CPU, or another compiler."""
    jobs = min(usable_cpus(), SPLIT_MAX_JOBS)
    if jobs < 2 or len(model_c.encode()) < SPLIT_MIN_BYTES or not is_gcc(cc):
        return ()
    return (f"-flto={jobs}",)


def build_library(files: Mapping[str, str], flags: Sequence[str] = DEFAULT_CFLAGS) -> Path:
    """Compile model.c of `files` into a shared library (cached); returns its path. The kernels
    come compiled from kernel_lib.py's cache (once per machine, headers and flags); model.c is
    compiled behind its front file, which points its kernel calls at them."""
    cc = find_cc()
    key = content_key(files, flags, cc)
    d = cache_dir() / key
    lib = d / "libmodel.so"
    if lib.exists():
        return lib

    kernels = str(kernels_object(cc, flags, files))  # first: its own build says so
    pch = front_pch(cc, flags, files)  # the headers precompiled (GCC), else None: parsed here
    deps = deps_link_flags(cc, blas_link_flags(flags), compiler_version(cc))  # the BLAS's libraries, linked once

    def build(work: Path) -> None:
        for name, text in files.items():
            (work / name).write_text(text)
        if pch is None:  # else found in the pch folder, beside its .gch (here it would be found first)
            (work / FRONT_HEADER).write_text(front_header(files))
        (work / "model_host.c").write_text(front_source(files))  # model.c calling the cached kernels
        compile_c(cc, [*flags, *split_flags(cc, files["model.c"]), *(("-I", str(pch)) if pch else ()), "-fPIC",
                       "-shared", "-o", "libmodel.so", "model_host.c", kernels, *deps], work)

    with announced_build("this program's C library (libmodel.so)",
                         f"a program not built before with these flags: not in the cache {d}"):
        publish_build(d, build)
    return lib


def build_executable(src_dir, flags: Sequence[str] = SANITIZE_CFLAGS, out: str = "main") -> Path:
    """Compile model.c + main.c of an emitted project (emit_c with samples) into an executable."""
    src_dir = Path(src_dir)
    compile_c(find_cc(), [*flags, "-o", out, "model.c", "main.c"], src_dir)
    return src_dir / out


def load_private(lib: Path) -> ctypes.CDLL:
    """dlopen a private copy (a second load of one path would share its static arrays)."""
    fd, tmp = tempfile.mkstemp(suffix=".so", prefix="et-")
    os.close(fd)
    shutil.copyfile(lib, tmp)
    try:
        return ctypes.CDLL(tmp, mode=ctypes.RTLD_LOCAL)
    finally:
        os.unlink(tmp)


def _bind(dll: ctypes.CDLL) -> ctypes.CDLL:
    vp, i = ctypes.c_void_p, ctypes.c_int
    sig = {"et_init": (None, []), "et_train_step": (ctypes.c_float, [vp, vp]), "et_predict": (None, [vp, vp]),
           "et_check_guards": (i, []), "et_set_step": (None, [ctypes.c_int32]), "et_get_step": (ctypes.c_int32, []),
           "et_num_state": (i, []), "et_state_name": (ctypes.c_char_p, [i]), "et_state_bytes": (ctypes.c_long, [i]),
           "et_get_state": (i, [i, vp]), "et_set_state": (i, [i, vp]), "et_state_ptr": (vp, [i]),
           "et_num_grads": (i, []), "et_grad_name": (ctypes.c_char_p, [i]), "et_grad_bytes": (ctypes.c_long, [i]),
           "et_gradients": (None, [vp, vp, vp]), "et_train_step_checked": (i, [vp, vp, vp])}
    for name, (res, args) in sig.items():
        f = getattr(dll, name)
        f.restype, f.argtypes = res, args
    return dll


def raise_failed_check(dll: ctypes.CDLL) -> None:
    """RunTimeCheckError with the message of the first run-time check of the model (ops/check.py)
    that failed in the library's last call, as the reference runtime raises it; nothing when none did."""
    if not hasattr(dll, "et_check_error"):  # a program without a check (runtime/et_check.h)
        return
    fn = dll.et_check_error
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    msg = fn()
    if msg:
        raise RunTimeCheckError(msg.decode("utf-8", "replace"))


class CRunner(RunnerBase):
    """Runs a compiled program's emitted C through ctypes (its own copy of the library).
    Unsplit state tensors in `self.state` are numpy views of the library's arrays; a weight
    stored split is copied in before and out after each call. The arrays a fused weight-gradient
    update writes are double-buffered (step_guard.py): each step commits by moving them to their
    other copy, and `self.state`'s entries for them are re-pointed after it, so an array taken
    from `self.state` before a step holds the weights before it (read `self.state` again).
    `threads` (default $EDGETRAIN_BLAS_THREADS, else 1; settable) is the thread count of the BLAS and
    of the kernels' parallel loops (runtime/et_common.h's ET_PARALLEL_FOR): the results do not depend on it."""

    backend = "c"

    def __init__(self, compiled: CompiledProgram, state: Optional[Mapping[str, np.ndarray]] = None, steps: int = 0,
                 flags: Optional[Sequence[str]] = None, threads: Optional[int] = None):
        from .emit import emit_sources

        threads = default_threads() if threads is None else check_threads(threads)  # before any build
        super().__init__(compiled, state, steps)
        self.flags = tuple(flags or DEFAULT_CFLAGS)
        self.kernels = blas_describe(self.flags)  # the BLAS or the portable kernels, in words
        self.c_layout: Layout = build_layout(self)
        self.c_files = emit_sources(self, embed_weights=False, layout=self.c_layout)
        self.c_library = build_library(self.c_files, with_guard(self.flags))  # et_train_step_checked's guard
        self._lib = _bind(load_private(self.c_library))
        self.threads = threads
        self._lib.et_init()
        self._views: dict[str, np.ndarray] = {}
        self._view_at: dict[tuple[str, int], np.ndarray] = {}  # (name, address) -> view
        for st in self.c_layout.states.values():
            arr = np.ascontiguousarray(self.state[st.name], dtype=st.dtype)
            if self._lib.et_set_state(st.index, arr.ctypes.data) != 0:
                raise CBackendError(f"could not load state tensor {st.name!r}")
            if st.kind != "split":
                self.state[st.name] = self._views[st.name] = self._view(st, self._lib.et_state_ptr(st.index))
        self._double = double_buffered(self.c_layout)  # their arrays move with each checked step
        self.state = _TrackedState(self.state)
        self._state_obj = self.state
        if self.c_layout.page_bytes:
            self._open_pages()
        self._split = [st for st in self.c_layout.states.values() if st.kind == "split"]
        self.c_layout_names = list(self.c_layout.states)

    @property
    def threads(self) -> int:
        """The thread count of the BLAS and the kernels (et_threads of the library)."""
        return self._threads

    @threads.setter
    def threads(self, n: int) -> None:
        n = check_threads(n)
        try:
            ctypes.c_int.in_dll(self._lib, "et_threads").value = n
        except ValueError:  # built without -fopenmp: serial kernels, the BLAS on $EDGETRAIN_BLAS_THREADS
            if n != default_threads():
                raise CBackendError(f"threads={n}: this C library was built without -fopenmp (its kernels are "
                                    f"serial, its BLAS on ${THREADS_ENV} threads); build it with "
                                    f"flags=host.OPENMP_CFLAGS") from None
        self._threads = n

    def _view(self, st, ptr: int) -> np.ndarray:
        """The numpy view of state `st`'s array at address `ptr` (one per copy, kept)."""
        view = self._view_at.get((st.name, ptr))
        if view is None:
            buf = (ctypes.c_uint8 * (st.numel * np.dtype(st.dtype).itemsize)).from_address(ptr)
            view = self._view_at[st.name, ptr] = np.frombuffer(buf, dtype=st.dtype).reshape(st.shape)
        return view

    def _follow_flips(self) -> None:
        """Point `self.state`'s double-buffered entries at their committed copies (et_state_ptr)."""
        for st in self._double:
            view = self._view(st, self._lib.et_state_ptr(st.index))
            if view is not self._views[st.name]:
                self._views[st.name] = view
                dict.__setitem__(self.state, st.name, view)

    def rebind(self, compiled: CompiledProgram) -> "CRunner":
        """A C runner (same flags, its own library) for `compiled`, from a copy of this state."""
        return CRunner(compiled, self.state, self.steps, self.flags, self.threads)

    def _open_pages(self):
        """Point the library's page API (et_page.h) at the page store's file."""
        ll, lib = ctypes.c_longlong, self._lib
        for name, res, args in (("et_page_open", ctypes.c_int, [ctypes.c_char_p]), ("et_page_close", None, []),
                                ("et_paged_in_bytes", ll, []), ("et_paged_out_bytes", ll, []),
                                ("et_page_error", ctypes.c_int, [])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        if lib.et_page_open(os.fsencode(self.compiled.page_store.path)) != 0:
            raise CBackendError(f"cannot open the page file {self.compiled.page_store.path}")
        weakref.finalize(self, lib.et_page_close)

    def node_seconds(self, graph: str = "train") -> np.ndarray:
        """Seconds spent in each node of `graph` ("train", "forward" or "grad"; float64, in the order of
        `self.c_layout.graphs[graph].graph.nodes`), summed over every call of the library since it was loaded.
        Only a library built with PROFILE_FLAG keeps these clocks."""
        if graph not in self.c_layout.graphs:
            raise CBackendError(f"graph={graph!r}: this program has {sorted(self.c_layout.graphs)}")
        if PROFILE_FLAG not in self.flags:
            raise CBackendError(f"node_seconds: this C library was built without {PROFILE_FLAG} (flags=...)")
        fn = self._lib.et_profile
        fn.restype, fn.argtypes = ctypes.POINTER(ctypes.c_double), [ctypes.c_int]
        n = len(self.c_layout.graphs[graph].graph.nodes)
        return np.ctypeslib.as_array(fn(GRAPHS.index(graph)), shape=(n,)).copy() if n else np.zeros(0)

    def paged_bytes(self) -> tuple[int, int]:
        """(bytes read from, bytes written to) the page file by the library so far."""
        if not self.c_layout.page_bytes:
            return 0, 0
        return int(self._lib.et_paged_in_bytes()), int(self._lib.et_paged_out_bytes())

    def _check_pages(self, before: tuple[int, int]) -> None:
        after = self.paged_bytes()
        self.last_paged_in_bytes, self.last_paged_out_bytes = after[0] - before[0], after[1] - before[1]
        if self.c_layout.page_bytes and self._lib.et_page_error():
            raise CBackendError(f"reading or writing the page file {self.compiled.page_store.path} failed")

    # --- state sync -------------------------------------------------------------------
    def _push(self):
        if self.state is not self._state_obj:  # a new dict: take it over
            self._state_obj = self.state = _TrackedState(self.state)
            self.state.rebound.update(self._views)
        for name in list(self.state.rebound):
            view = self._views.get(name)
            cur = self.state[name]
            if view is not None and cur is not view:  # the user rebound the entry: load it, keep the view
                view[...] = as_array(cur, _tt(view), f"state[{name!r}]")
                dict.__setitem__(self.state, name, view)
        self.state.rebound.clear()
        for st in self._split:
            arr = np.ascontiguousarray(self.state[st.name], dtype=st.dtype)
            if arr.shape != st.shape:
                raise ValueError(f"state[{st.name!r}]: expected shape {st.shape}, got {arr.shape}")
            self._lib.et_set_state(st.index, arr.ctypes.data)

    def _pull_split(self):
        for st in self._split:
            out = np.empty(st.shape, dtype=st.dtype)
            self._lib.et_get_state(st.index, out.ctypes.data)
            dict.__setitem__(self.state, st.name, out)

    def input_bytes(self, g, x, training: bool = False) -> np.ndarray:
        """The library's input buffer for model input(s) `x`: the graph inputs' bytes in order."""
        feeds = self.data_feeds(g, x, training)
        names = self.compiled.graph_inputs
        if len(names) == 1:
            return np.ascontiguousarray(feeds[names[0]])
        return np.concatenate([np.ascontiguousarray(feeds[n]).reshape(-1).view(np.uint8) for n in names])

    # --- running ------------------------------------------------------------------------
    def step(self, x, y) -> float:
        g = self.compiled.train_graph
        xin = self.input_bytes(g, x, training=True)
        yin = np.ascontiguousarray(self.label_feed(g, y))
        self._push()
        self._lib.et_set_step(self.steps)
        loss_c = ctypes.c_float()
        paged = self.paged_bytes()
        bad = self._lib.et_train_step_checked(xin.ctypes.data, yin.ctypes.data, ctypes.byref(loss_c))
        self._follow_flips()
        self._check_pages(paged)
        raise_failed_check(self._lib)  # a failed check made the loss NaN: the state was kept
        loss = float(loss_c.value)
        if bad:
            raise self.non_finite(loss, "" if bad < 0 else self.c_layout_names[bad - 1])
        self._pull_split()
        self.steps += 1
        return loss

    def gradients(self, x, y) -> dict[str, np.ndarray]:
        g = self.compiled.grad_graph
        xin = self.input_bytes(g, x, training=True)
        yin = np.ascontiguousarray(self.label_feed(g, y))
        self._push()
        self._lib.et_set_step(self.steps)
        outs = [np.empty(v.shape, dtype=v.dtype) for v in g.outputs]
        ptrs = (ctypes.c_void_p * max(len(outs), 1))(*[o.ctypes.data for o in outs])
        paged = self.paged_bytes()
        self._lib.et_gradients(xin.ctypes.data, yin.ctypes.data, ptrs)
        self._check_pages(paged)
        raise_failed_check(self._lib)
        return self.full_gradients(dict(zip(g.output_names, outs)))

    def predict(self, x) -> np.ndarray:
        self._push()
        return super().predict(x)

    def predict_batch(self, x) -> np.ndarray:
        g = self.compiled.forward_graph
        out = np.empty(g.output("output").shape, dtype=np.float32)
        # a name for the input bytes: `.ctypes.data` is a bare address, which keeps no array
        # alive (the int8 input transform's fresh array was freed before the call read it)
        xin = self.input_bytes(g, x)
        self._lib.et_predict(xin.ctypes.data, out.ctypes.data)
        raise_failed_check(self._lib)
        return out

    def check_guards(self) -> bool:
        """True if the arena's guard words are intact."""
        return self._lib.et_check_guards() == 0

    def raw_step(self, xin: np.ndarray, yin: np.ndarray) -> float:
        """One et_train_step on prepared arrays (graph input layout), no checks or sync: for timing."""
        return float(self._lib.et_train_step(xin.ctypes.data, yin.ctypes.data))


class _TrackedState(dict):
    """The state of a C runner: remembers the entries rebound since the last sync (entries
    changed in place are the library's own arrays and need no sync)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.rebound: set = set()

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.rebound.add(key)

    def update(self, *args, **kw):
        for k, v in dict(*args, **kw).items():
            self[k] = v


def _tt(view):
    from ...ir import TensorType

    return TensorType(tuple(view.shape), str(view.dtype))


def to_c_program(prog, flags: Optional[Sequence[str]] = None, threads: Optional[int] = None):
    """The same program run by the C backend: a Program holding `prog`'s compiled program and
    a C runner (its own library, on `threads` threads) from a copy of `prog`'s state and step count."""
    return type(prog)(prog.compiled, CRunner(prog.compiled, prog.state, prog.steps, flags, threads))
