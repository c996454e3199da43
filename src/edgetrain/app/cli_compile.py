"""`edgetrain compile`: a model's training program as a C project (host library or Cortex-M
firmware), its memory report and checkpoint; `--verify` runs it and compares its losses
with the reference runtime's."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from ..passes.loss import CLASS_LOSSES, class_dim
from .cli_config import COMPILED_FILE, calibration_from, config_from_options, normalization, say

#: relative difference allowed between the firmware's printed losses and the reference
#: runtime's (float32 sums in another order; the C backend's tests hold 1e-5)
VERIFY_RTOL = 1e-4
#: QEMU's MPS2 boards have 4 MiB at the flash and at the SRAM address: the most a budget can give
#: the firmware's linker script
QEMU_REGION_BYTES = 4 << 20
#: the least flash a Cortex-M firmware region can have: its code alone (startup, UART output, the
#: kernels, newlib's printf) is 38 KB for a two-layer model; a smaller region cannot link
FIRMWARE_MIN_FLASH_BYTES = 32 << 10
_STEP_LINE = re.compile(r"^step (\d+) loss (\S+)$")


def run_compile(args) -> int:
    from .outlock import output_lock

    with output_lock(args.output, "edgetrain compile"):  # one run per -o folder at a time
        return _run_compile(args)


def _run_compile(args) -> int:
    from ..api import BudgetError
    from ..backends.c.staging import write_files
    from .checkpoint import Checkpoint, atomic_write, build_program, to_bytes
    from .train import TrainMeta

    t0 = time.perf_counter()
    config = config_from_options(args, args.model)
    host_like = args.target == "host" or _is_cross(args.target)  # a host project, built here or cross
    if not host_like:
        for name, v in (("--sram", config.sram), ("--flash", config.flash)):
            if v is not None and v > QEMU_REGION_BYTES:
                raise ValueError(f"{name} {v:,} B: the Cortex-M firmware here runs on QEMU boards with "
                                 f"{QEMU_REGION_BYTES:,} B of each memory")
    calib = calibration(args, config)
    built = build_program(config, calibration=calib[0] if calib else None, contributions=args.contributions,
                          search=args.search)
    prog = built.prog
    from ..backends.capabilities import backend_of_target, check_program

    check_program(prog, backend_of_target("host" if host_like else args.target))  # exit 2 naming the op, first
    if not host_like:
        _check_firmware_flash(config.flash)
    second_bank = prog.memory.trainable_bytes if args.weight_banks == 2 and not host_like else 0
    if second_bank and config.sram is not None and prog.memory.peak_bytes + second_bank > config.sram:
        need = prog.memory.peak_bytes + second_bank
        raise BudgetError(f"with --weight-banks 2 the program needs {need:,} B of SRAM at its peak "
                          f"({prog.memory.peak_bytes:,} B + a second copy of the trained state, "
                          f"{second_bank:,} B), over the budget of {config.sram:,} B; the smallest budget that "
                          f"fits is {need:,} B (or use --weight-banks 1)")
    out = Path(args.output)
    meta = TrainMeta(reason="compiled")
    if args.mean is not None or args.std is not None:  # `train --resume` normalises as calibration did
        from ..data.folder import check_image_shape
        from .usermodel import parse_input

        meta.mean, meta.std = normalization(args, check_image_shape(parse_input(config.inputs[0]).shape)[0])
    ckpt = to_bytes(Checkpoint.of(built, meta.as_dict()))
    say(f"compiled {config.model} ({', '.join(config.inputs)}; update {_scheme_text(built.config.update)}"
        f"{', int8' if config.quantize else ''}) in {time.perf_counter() - t0:.1f} s")
    say(f"  {prog.memory.summary()}")
    if second_bank:
        say(f"  two weight banks: + {second_bank / 1024:.1f} KB for the second copy of the trained state = "
            f"peak {(prog.memory.peak_bytes + second_bank) / 1024:.1f} KB")
    if prog.search is not None:
        say(f"  update=auto: {prog.search.summary()}")
    samples = _samples(prog, args, calib[1] if calib else None)
    if host_like:
        from ..backends.c.project import project_files

        files = project_files(prog, samples)
    else:
        from ..backends.c.cortexm import firmware_project_files

        regions = {k: v for k, v in (("sram_bytes", config.sram), ("flash_bytes", config.flash)) if v is not None}
        files = firmware_project_files(prog, args.target, samples, weight_banks=args.weight_banks, **regions)
    report = memory_report(prog, built.config, args.target, second_bank)
    files[COMPILED_FILE] = ckpt
    files["memory.json"] = json.dumps(report, indent=1) + "\n"
    write_files(out, files)  # all at once: a full disk or a crash leaves the previous project whole
    say(f"  wrote the {args.target} project, program.ckpt ({len(ckpt):,} B) to {out}")
    code = 0
    if args.verify:
        report["verify"] = _verify(prog, out, args.target, samples)
        if not report["verify"]["ok"]:
            code = 5
    if prog.firmware is not None:
        report["firmware"] = _firmware_dict(prog.firmware)
    atomic_write(out / "memory.json", (json.dumps(report, indent=1) + "\n").encode())
    if not args.no_plot:
        prog.memory.plot(out / "memory.png")
    say(f"  memory report: {out / 'memory.json'}" + ("" if args.no_plot else f", {out / 'memory.png'}"))
    return code


def _is_cross(target: str) -> bool:
    """Whether `target` is the host project cross-built for another Linux architecture (cross.py)."""
    from ..backends.c.cross import CROSS_TARGETS

    return target in CROSS_TARGETS


def calibration(args, *more):
    """cli_config.calibration_from, without the loader's warning about images of a single class
    (calibrating int8 scales on one class is fine; training on it is not)."""
    import warnings

    from ..data.folder import SingleClassWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingleClassWarning)
        return calibration_from(args, *more)


def _check_firmware_flash(flash) -> None:
    """Refuse a flash region below the firmware's own code (the compiler checks the weights
    against --flash; the code would only fail to link later, after the project is written)."""
    if flash is not None and flash < FIRMWARE_MIN_FLASH_BYTES:
        raise ValueError(f"--flash {flash:,} B cannot hold the firmware: its code alone takes more than "
                         f"{FIRMWARE_MIN_FLASH_BYTES >> 10} KB of flash (38 KB for a two-layer model), and its "
                         f"read-only weights and samples come on top")


def _scheme_text(update) -> str:
    if isinstance(update, dict):
        w = ", ".join(f"{k}:{v:g}" for k, v in update["weights"].items())
        return f"sparse (biases of the last {update['bias_last']}{'; weights ' + w if w else ''})"
    return str(update)


def _samples(prog, args, data=None) -> list:
    """`args.samples` (x, y) pairs for the firmware: images of --calibrate with their labels,
    else random inputs (seed 1) and labels."""
    import torch

    from .usermodel import example_inputs, parse_input

    n = args.samples
    out_t = prog.forward_graph.output("output")
    cdim = class_dim(prog.loss, out_t.type.rank)
    classes = out_t.shape[cdim]
    rng = np.random.default_rng(1)
    specs = [parse_input(s) for s in _input_texts(prog)]
    pairs = []
    for i in range(n):
        if data is not None and len(prog.inputs) == 1:
            b = specs[0].shape[0]
            idx = [(i * b + j) % len(data) for j in range(b)]
            from ..data.folder import check_image_shape

            shape = check_image_shape(specs[0].shape)
            mean, std = normalization(args, shape[0])
            x = data.batch(idx, shape, mean, std)
            y = data.labels[idx]
            if int(y.max()) >= classes:
                raise ValueError(f"labels out of range: {data.source} has {len(data.classes)} classes but the model "
                                 f"outputs {classes}")
        else:
            xs = tuple(t.numpy() for t in example_inputs(specs, seed=1 + i))
            x = xs[0] if len(xs) == 1 else xs
            if prog.loss in CLASS_LOSSES:
                y = rng.integers(0, classes, size=out_t.shape[:cdim] + out_t.shape[cdim + 1:]).astype(np.int64)
            elif prog.loss == "bce_with_logits":  # targets in [0, 1]
                y = rng.random(out_t.shape).astype(np.float32)
            else:
                y = rng.standard_normal(out_t.shape).astype(np.float32)
        pairs.append((x, y))
    del torch
    return pairs


def _input_texts(prog) -> list[str]:
    from .usermodel import InputSpec

    src = prog.input_transform or prog.forward_graph
    out = []
    for name in prog.inputs:
        t = src.input(name).type
        out.append(str(InputSpec(tuple(t.shape), t.dtype if t.dtype in ("int64", "int32") else "float32")))
    return out


def memory_report(prog, config, target: str, second_bank: int = 0) -> dict:
    """The memory.json of `edgetrain compile`. With two weight banks (`second_bank` > 0: the
    bytes of the second copy of the trained state) `peak_bytes` counts that copy too and
    `program_peak_bytes` is the program's own peak."""
    m = prog.memory
    return {"model": config.model, "inputs": list(config.inputs), "update": config.update,
            "quantize": config.quantize, "target": target,
            "budget": {"sram": config.sram, "flash": config.flash},
            "weight_banks": 2 if second_bank else 1, "second_bank_bytes": second_bank,
            "peak_bytes": m.peak_bytes + second_bank, "program_peak_bytes": m.peak_bytes, "arena_bytes": m.arena_bytes, "activation_bytes": m.activation_bytes,
            "trainable_bytes": m.trainable_bytes, "optimizer_bytes": m.optimizer_bytes,
            "flash_bytes": m.frozen_bytes, "weight_bytes": m.weight_bytes,
            "peak_step": m.peak_step, "peak_op": m.peak_op, "summary": m.summary(),
            "trainable": {p: {"shape": list(prog.state[p].shape),
                              "channels": None if sel is None else [sel.dim, len(sel.index)]}
                          for p, sel in prog.trainable.items()},
            "timeline": list(m.timeline)}


def _firmware_dict(size) -> dict:
    import dataclasses

    return dataclasses.asdict(size)


def _reference_of(prog):
    """`prog` run by the reference runtime, from a copy of its state (--verify's reference
    losses whatever backend the program runs on)."""
    from ..backends.reference_runner import ReferenceRunner
    from ..program import Program

    return Program(prog.compiled, ReferenceRunner(prog.compiled, prog.state, prog.steps))


def _float_check(prog, elf: Path, target: str) -> tuple[list[str], bool]:
    """(the float uses of the firmware `elf`, said; whether they fail the check) on a core without an
    FPU (backends/c/float_check.py): a step that holds no float value (backward='integer') must
    link none. A core with an FPU may move the integer loss's bits through a float register (no
    arithmetic): not looked at, ([], False)."""
    from ..backends.c.emit import holds_no_float
    from ..backends.c.float_check import float_uses
    from ..devices.targets import get_target

    if get_target(target).fpu != "none":
        return [], False
    floats = float_uses(elf)
    if not holds_no_float([prog.compiled.train_graph]):
        say(f"  float step on a core without an FPU: {len(floats)} soft-float routines linked")
        return floats, False
    if not floats:
        say("  integer-only: no float instruction or soft-float routine in the ELF")
    return floats, bool(floats)


def _verify(prog, out: Path, target: str, samples) -> dict:
    """Build and run the project; compare its losses with the reference runtime's."""
    import subprocess

    from ..backends.c import CBackendError

    t0 = time.perf_counter()
    floats, float_fault = [], False
    if target == "host":
        r = subprocess.run(["make", "-s", "main"], cwd=out, capture_output=True, text=True)
        if r.returncode != 0:
            raise CBackendError(f"building the host driver in {out} failed:\n{r.stderr[-3000:]}")
        r = subprocess.run(["./main"], cwd=out, capture_output=True, text=True, timeout=600)
        lines = r.stdout.splitlines()
        losses = [float(m.group(2)) for m in map(_STEP_LINE.match, lines) if m]
        exit_code = r.returncode
        where = "host build"
    elif _is_cross(target):  # the host project cross-built, run under QEMU user mode (cross.py)
        from ..backends.c import cross

        arch = cross.get_arch(target)
        cross.build_cross(out, arch)
        run = cross.run_emulated(out, (), arch, timeout=cross.RUN_TIMEOUT_S)
        losses, exit_code, lines = list(run.losses), run.exit_code, list(run.lines)
        where = f"{arch.emulator} ({arch.name})"
    else:
        from ..backends.c import cortexm

        elf = cortexm.build(out)
        run = cortexm.run_qemu(out, target)
        prog.record_firmware(cortexm.firmware_size(elf, run))
        losses, exit_code, lines = list(run.losses), run.exit_code, list(run.lines)
        where = f"QEMU {target}"
        say(f"  firmware: {prog.firmware.describe()}")
        floats, float_fault = _float_check(prog, elf, target)
    spec = prog if prog.backend == "reference" else _reference_of(prog)  # the losses of the spec
    ref = [spec.step(x, y) for x, y in samples]
    diff = max((abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref)), default=float("inf"))
    ok = exit_code == 0 and len(losses) == len(ref) and diff <= VERIFY_RTOL and not float_fault
    for i, (a, b) in enumerate(zip(losses, ref), start=1):
        say(f"  {where}: step {i} loss {a:.9g}   (reference {b:.9g})")
    verdict = (f"verified: {len(losses)} steps, largest relative difference {diff:.2g} (allowed {VERIFY_RTOL:g})" if ok
               else f"verification FAILED: exit {exit_code}, {len(losses)} of {len(ref)} steps, largest relative "
                    f"difference {diff:.2g}; last lines: {' | '.join(lines[-3:])}" if not float_fault
               else f"verification FAILED: backward='integer', yet the ELF computes with floats: {', '.join(floats)}")
    say(f"  {verdict} ({time.perf_counter() - t0:.1f} s)")
    if not ok:
        print(f"edgetrain compile: error: {verdict}", file=sys.stderr)
    return {"ok": ok, "where": where, "losses": losses, "reference": ref, "max_rel_diff": diff,
            "exit_code": exit_code, "float_uses": floats}
