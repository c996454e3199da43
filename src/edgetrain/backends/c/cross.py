"""The host project cross-compiled for another Linux architecture and run under QEMU user-mode
emulation (issue 35 item 4: phones and boards are Arm).

    run = run_cross(prog, samples, arch="aarch64")      # losses per step, trained weights
    check = compare_with_reference(prog, samples, run)  # float32 within 1e-5, integers exact

The project is the standalone host project (project.py: `emit_c(..., embed_weights=False)`,
weights.bin, samples.bin, main.c); `make main` builds it with the architecture's cross compiler
(`CC=aarch64-linux-gnu-gcc`), the emitted project's flags (host.PROJECT_CFLAGS: every float sum in
the source's order, no FMA contraction) with the architecture's `-march` in place of `-march=native`,
linked `-static` (qemu-aarch64 then needs no sysroot) and without a BLAS (`BLAS=0`: the x86 BLAS the
project was emitted beside cannot link; et_float_gemm.h's portable kernels, and their NEON blocks
on aarch64, run instead). `qemu-aarch64 ./main weights.bin samples.bin --save trained.bin` trains;
its printed losses and saved weights are compared with the reference runtime's run of the same
samples from the same weights.

An architecture is a record (CrossArch) in ARCHES. It is not (yet) an entry of the target
registry (devices/targets.py) because that record describes firmware targets (QEMU machine,
memory regions); CROSS_TARGETS names its emit target ("aarch64-linux") for the CLI (`edgetrain
compile --target aarch64-linux --verify`). Joining the registry, it would be a Target with
backend "c", the host's cost profile (or a phone's), and the fields here: compiler, emulator,
-march flags."""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Optional, Sequence

import numpy as np

from .insn_count import counted_command, read_count
from .layout import CBackendError
from .toolchain import run_tool

#: the float32 tolerance of the comparison (the C backend's tests hold 1e-5): each loss relative to
#: the reference's, each float tensor's largest difference relative to its largest magnitude
FLOAT_RTOL = 1e-5
#: seconds a cross build may take (a large model's model.c at -O3)
BUILD_TIMEOUT_S = 900
#: seconds an emulated run may take by default (QEMU's TCG runs an aarch64 step 5-20x slower than native)
RUN_TIMEOUT_S = 1800
#: the name of the weights file the emulated run saves
TRAINED_NAME = "trained.bin"


@dataclass(frozen=True)
class CrossArch:
    """One Linux architecture the host project cross-builds for: its GNU cross compiler, its
    user-mode QEMU, the -march flags (the baseline every chip of the family runs) and the name
    of its emit target."""

    name: str
    target: str  # the emit target's name (CLI --target)
    cc: str
    emulator: str
    march: tuple = field(default_factory=tuple)


#: aarch64: ARMv8-A, whose Advanced SIMD (NEON) every core has (the kernels' __ARM_NEON blocks)
ARCHES = MappingProxyType({
    "aarch64": CrossArch("aarch64", "aarch64-linux", "aarch64-linux-gnu-gcc", "qemu-aarch64", ("-march=armv8-a",)),
})
#: emit target name -> architecture
CROSS_TARGETS = MappingProxyType({a.target: a for a in ARCHES.values()})


def get_arch(name) -> CrossArch:
    """An architecture by its name ("aarch64") or its emit target's ("aarch64-linux"), or passed through."""
    if isinstance(name, CrossArch):
        return name
    a = ARCHES.get(name) or CROSS_TARGETS.get(name)
    if a is None:
        raise CBackendError(f"unknown cross architecture {name!r}: use one of {sorted(ARCHES)} "
                            f"(or the targets {sorted(CROSS_TARGETS)})")
    return a


def missing_tools(arch="aarch64") -> list[str]:
    """The programs a cross build and run needs that are not on PATH (make, the compiler, QEMU)."""
    a = get_arch(arch)
    return [t for t in ("make", a.cc, a.emulator) if shutil.which(t) is None]


#: the flags of the fast float32 build (fma=True): the ctypes host library's (host.DEFAULT_CFLAGS)
#: fused multiply-adds in the float32 GEMM / convolution kernels (et_float.h's NEON FMLA block) and
#: reassociated `omp simd` float sums; int8 kernels use neither
FMA_FLAGS = ("-DET_OMP_SIMD", "-DET_FLOAT_FMA")


def cross_cflags(arch="aarch64", fma: bool = False) -> tuple:
    """The compiler flags of the cross build: the emitted project's (host.PROJECT_CFLAGS: every
    float sum in the source's order, no FMA, the x86 project's losses bit for bit) with the
    architecture's -march for -march=native, linked -static; fma=True adds FMA_FLAGS."""
    from .host import PROJECT_CFLAGS

    base = (f for f in PROJECT_CFLAGS if not f.startswith("-march="))
    return (*base, *get_arch(arch).march, *(FMA_FLAGS if fma else ()), "-static")


def make_command(arch="aarch64", fma: bool = False) -> list[str]:
    """`make main` of an emitted host project for `arch`: its compiler and flags, no BLAS."""
    a = get_arch(arch)
    return ["make", "-s", "-B", "main", f"CC={a.cc}", f"CFLAGS={' '.join(cross_cflags(a, fma))}", "BLAS=0"]


def _require(arch: CrossArch) -> None:
    missing = missing_tools(arch)
    if missing:
        raise CBackendError(f"the {arch.name} build needs {', '.join(missing)} on PATH (Debian: apt-get install "
                            "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user make)")


def build_cross(out_dir, arch="aarch64", fma: bool = False) -> Path:
    """Build `make main` of the host project in out_dir for `arch` (fma: cross_cflags); returns the executable."""
    a = get_arch(arch)
    _require(a)
    out_dir = Path(out_dir)
    r = run_tool(make_command(a, fma), out_dir, BUILD_TIMEOUT_S)
    if r.returncode != 0:
        raise CBackendError(f"the {a.name} build of {out_dir} failed ({' '.join(make_command(a, fma))}):\n"
                            f"{(r.stdout + r.stderr)[-4000:]}")
    return out_dir / "main"


@dataclass(frozen=True)
class EmulatedRun:
    """One run of the trainer under QEMU: its exit code, stdout lines, stderr, the losses it
    printed and (counted) the guest instructions it executed."""

    exit_code: int
    lines: tuple
    stderr: str
    losses: tuple
    instructions: Optional[int] = None


def run_emulated(out_dir, args: Sequence[str] = (), arch="aarch64", count: bool = False,
                 timeout: float = RUN_TIMEOUT_S) -> EmulatedRun:
    """Run out_dir's `main` (built by build_cross) under the architecture's user-mode QEMU with
    `args`; `count`: with the instruction-count plugin (insn_count.py)."""
    a = get_arch(arch)
    _require(a)
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="et-qemu-") as tmp:
        log = Path(tmp) / "insns.log"
        argv = ["./main", *map(str, args)]
        cmd = counted_command(a.emulator, argv, log) if count else [a.emulator, *argv]
        r = run_tool(cmd, out_dir, timeout)
        insns = read_count(log) if count and r.returncode == 0 else None
    lines = tuple(r.stdout.splitlines())
    losses = tuple(float(l.split()[3]) for l in lines if l.startswith("step ") and len(l.split()) == 4)
    return EmulatedRun(r.returncode, lines, r.stderr, losses, insns)


@dataclass(frozen=True)
class CrossRun:
    """run_cross's result: the losses the emulated trainer printed, the weights it saved ({name:
    array}, as the program's state), its project folder and the run itself."""

    arch: str
    losses: tuple
    weights: dict
    out_dir: Path
    run: EmulatedRun


def emit_standalone(prog, out_dir, samples: Iterable) -> Path:
    """The standalone host project of `prog` (weights.bin, samples.bin, main.c; the train graph only)."""
    from .export import emit_c

    return emit_c(prog, out_dir, target="host", samples=samples, embed_weights=False, graphs=("train",))


def run_cross(prog, samples: Iterable, arch="aarch64", out_dir=None, epochs: int = 1, fma: bool = False) -> CrossRun:
    """Emit `prog` as a standalone host project (its current weights), build it for `arch`, train
    on `samples` ((x, y) pairs as for prog.step) `epochs` times under QEMU and read back the saved
    weights. `prog` itself is not changed. out_dir: the project folder (default: a temporary one,
    removed afterwards). CBackendError when a tool is missing, the build fails or the run does not
    exit 0. fma: the fast float32 build (cross_cflags)."""
    from .weights_file import read_weights

    a = get_arch(arch)
    _require(a)
    samples = list(samples)
    with tempfile.TemporaryDirectory(prefix=f"et-{a.name}-") as tmp:
        d = emit_standalone(prog, Path(out_dir) if out_dir is not None else Path(tmp) / "proj", samples)
        build_cross(d, a, fma)
        run = run_emulated(d, ["weights.bin", "samples.bin", "--epochs", epochs, "--save", TRAINED_NAME], a)
        if run.exit_code != 0:
            raise CBackendError(f"the {a.name} trainer in {d} exited {run.exit_code} under {a.emulator}:\n"
                                f"{run.stderr[-2000:]}{' | '.join(run.lines[-3:])}")
        weights = read_weights(d / TRAINED_NAME)
    return CrossRun(a.name, run.losses, weights, d, run)


@dataclass(frozen=True)
class CrossCheck:
    """The emulated run against the reference runtime: the largest relative difference of the
    losses and of the float tensors, the integer tensors that differ (must be none) and whether
    all is within FLOAT_RTOL."""

    loss_rel: float
    float_rel: float
    int_mismatches: tuple
    losses_equal: bool  # bit-equal losses
    ok: bool

    def describe(self) -> str:
        ints = f"tensors missing or integer tensors differing: {', '.join(self.int_mismatches)}" \
            if self.int_mismatches else "integer tensors bit-exact"
        return (f"losses within {self.loss_rel:.2g} ({'bit-equal' if self.losses_equal else 'relative'}), "
                f"float tensors within {self.float_rel:.2g}, {ints}: {'ok' if self.ok else 'FAILED'}")


def reference_run(prog, samples: Iterable, epochs: int = 1) -> tuple[list[float], dict]:
    """(losses, state) of the reference runtime trained on `samples` from a copy of prog's state."""
    from ..reference_runner import ReferenceRunner

    ref = ReferenceRunner(prog.compiled, prog.state, prog.steps)  # copies the state
    samples = list(samples)
    losses = [ref.step(x, y) for _ in range(epochs) for x, y in samples]
    return losses, {k: np.asarray(v) for k, v in ref.state.items()}


def compare_with_reference(prog, samples: Iterable, run: CrossRun, rtol: float = FLOAT_RTOL,
                           epochs: int = 1) -> CrossCheck:
    """Compare an emulated run (run_cross from prog's current state) with the reference runtime's."""
    ref_losses, ref_state = reference_run(prog, samples, epochs)
    if len(run.losses) != len(ref_losses):
        return CrossCheck(float("inf"), float("inf"), (), False, False)  # a step missing
    a, b = np.asarray(run.losses, np.float64), np.asarray(ref_losses, np.float64)
    loss_rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30), initial=0.0))
    float_rel, ints = 0.0, []
    for name, want in ref_state.items():
        got = run.weights.get(name)  # flat, in the state's element order (weights_file.py)
        if got is None or got.size != want.size:
            ints.append(name)
            continue
        got = got.reshape(want.shape)
        if np.issubdtype(want.dtype, np.floating):
            scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
            float_rel = max(float_rel, float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0)) / scale)
        elif not np.array_equal(got, want):
            ints.append(name)
    ok = not ints and loss_rel <= rtol and float_rel <= rtol
    return CrossCheck(loss_rel, float_rel, tuple(ints), bool(np.array_equal(a.astype(np.float32), b.astype(np.float32))), ok)


def per_step_instructions(out_dir, arch="aarch64", steps: tuple = (1, 3)) -> float:
    """Guest instructions per training step of out_dir's built trainer: the count of a run of
    steps[1] steps less that of steps[0], over the difference (insn_count.py)."""
    lo, hi = steps
    if not 0 <= lo < hi:
        raise ValueError(f"steps={steps}: give (a, b) with 0 <= a < b")
    counts = []
    for n in (lo, hi):
        r = run_emulated(out_dir, ["weights.bin", "samples.bin", "--steps", n], arch, count=True)
        if r.exit_code != 0:
            raise CBackendError(f"the counted run of {out_dir} exited {r.exit_code}: {r.stderr[-1000:]}")
        counts.append(r.instructions)
    return (counts[1] - counts[0]) / (hi - lo)
