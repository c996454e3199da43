"""The Cortex-M firmware target: startup, linker script, UART console and exit, QEMU runs, size report.

A hand-written program implementing the model.h API (cortexm_fixture/: a 2-input linear
model, squared error, SGD) drives the firmware machinery; programs compiled by edgetrain are
tested end to end (QEMU losses equal to the host build's, as text) when the C emitter is
there. Every test skips without arm-none-eabi-gcc / newlib / qemu-system-arm (Debian:
gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from edgetrain.backends.c import cortexm, firmware_reserves
from edgetrain.backends.c.stack_bound import stack_bound

FIXTURE = Path(__file__).parent / "cortexm_fixture"
LR = np.float32(0.05)  # cortexm_fixture/model.c
W0 = (np.float32(0.5), np.float32(-0.25), np.float32(0.125))  # w[0], w[1], b

pytestmark = pytest.mark.skipif(bool(cortexm.missing_tools()),
                                reason=f"missing {', '.join(cortexm.missing_tools())}")


def fixture_samples(n=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 2)).astype(np.float32)
    y = (2 * x[:, :, 0] - x[:, :, 1] + 0.5).astype(np.float32)
    return x, y


def fixture_losses(x, y):
    """cortexm_fixture/model.c's arithmetic in float32, operation by operation."""
    w0, w1, b = W0
    out = []
    for xi, yi in zip(x[:, 0], y[:, 0]):
        pred = w0 * xi[0] + w1 * xi[1] + b
        err = pred - yi
        out.append(float(err * err))
        g = np.float32(2) * err
        w0 = w0 - LR * g * xi[0]
        w1 = w1 - LR * g * xi[1]
        b = b - LR * g
    return out


def fixture_project(tmp_path, target, samples, **kw):
    d = tmp_path / target
    shutil.copytree(FIXTURE, d)
    cortexm.write_project(d, target, samples, **kw)
    return d


@pytest.mark.parametrize("target", sorted(cortexm.TARGETS))
def test_fixture_trains_under_qemu(tmp_path, target):
    x, y = fixture_samples()
    d = fixture_project(tmp_path, target, (x, y))
    elf = cortexm.build(d)
    run = cortexm.run_qemu(d, target, icount=True)
    assert run.exit_code == 0, run.lines
    want = [cortexm.format_step_line(i, l) for i, l in enumerate(fixture_losses(x, y), start=1)]
    assert list(run.step_lines) == want
    # stack painting measured something plausible, inside the reserve: the static bound
    bound = stack_bound(elf)
    assert run.stack_reserve == firmware_reserves.stack_reserve_for(bound) < cortexm.DEFAULT_STACK_BYTES
    assert 0 < run.stack_high_water <= bound.chain_bytes < bound.bytes < run.stack_reserve
    # the plugin counted each step: the same straight-line code every step
    assert run.instructions_per_step is not None and len(run.instructions_per_step) == len(x)
    assert len(set(run.instructions_per_step)) == 1 and 10 < run.instructions_per_step[0] < 200
    size = cortexm.firmware_size(elf, run)
    assert size.stack_high_water == run.stack_high_water
    assert size.instructions_per_step == run.instructions_per_step[0]
    assert size.sram == size.data + size.bss + size.heap_reserve + size.stack_reserve
    assert size.heap_reserve == 0 and size.stack_bound == bound.bytes  # nothing linked allocates
    assert size.flash >= size.text + size.rodata + size.data
    assert size.sram_used < size.sram <= cortexm.SRAM_BYTES
    # the embedded samples are in flash: 6 * (2 + 1) floats
    assert size.rodata >= x.nbytes + y.nbytes


def test_make_run_and_samples_as_pairs(tmp_path):
    """`make run` gives the same output; samples may be given as a list of (x, y) pairs
    (embedded as their bytes, integral float values included)."""
    import subprocess
    x, y = fixture_samples(3, seed=1)
    x = np.round(x)
    d = fixture_project(tmp_path, "cortex-m4", list(zip(x, y)))
    r = subprocess.run(["make", "-s", "-C", str(d), "run"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    steps = [l for l in r.stdout.splitlines() if l.startswith("step ")]
    assert steps == [cortexm.format_step_line(i, l) for i, l in enumerate(fixture_losses(x, y), start=1)]


def test_heap_is_whole_pages_at_a_page_boundary(tmp_path):
    """newlib's malloc (printf's %g) extends the heap to 4 KiB boundaries: a 4 KiB heap that
    started off a boundary made it fail (an assert, exit 1) depending on the size of .bss."""
    import subprocess
    d = fixture_project(tmp_path, "cortex-m4", fixture_samples(2))
    cortexm.build(d)
    nm = subprocess.run(["arm-none-eabi-nm", str(d / "firmware.elf")], capture_output=True, text=True, check=True)
    syms = {name: addr for addr, _, name in (line.split() for line in nm.stdout.splitlines() if line.count(" ") == 2)}
    start, end = int(syms["__heap_start"], 16), int(syms["__heap_end"], 16)
    assert start % 4096 == 0 and (end - start) % 4096 == 0
    with pytest.raises(cortexm.CortexMError, match="whole 4 KiB pages"):
        cortexm.write_project(tmp_path / "odd", "cortex-m4", fixture_samples(2), heap_bytes=6000)


def test_arena_guard_failure_exits_nonzero(tmp_path):
    d = fixture_project(tmp_path, "cortex-m4", fixture_samples(3))
    cortexm.build(d, extra_cflags=["-DET_FIXTURE_SMASH_ARENA"])
    run = cortexm.run_qemu(d, "cortex-m4")
    assert run.exit_code == 2  # ET_EXIT_ARENA_GUARD (cortexm.h)
    assert any("guard" in l for l in run.lines)
    assert len(run.step_lines) == 1


def test_program_too_big_for_sram_fails_to_link(tmp_path):
    d = fixture_project(tmp_path, "cortex-m7", fixture_samples(2))
    with pytest.raises(cortexm.CortexMError, match="region `RAM' overflowed"):
        cortexm.build(d, extra_cflags=[f"-DET_FIXTURE_BSS_BYTES={cortexm.SRAM_BYTES}"])


def test_format_step_line_round_trips():
    for v in (np.float32(0.1), np.float32(2.3025851), np.float32(1e-30), np.float32(12345.678)):
        line = cortexm.format_step_line(7, v)
        assert np.float32(float(line.split()[-1])) == v
    assert cortexm.format_step_line(0, 0.5) == "step 0 loss 0.5"


def test_unknown_target():
    with pytest.raises(cortexm.CortexMError, match="cortex-m4"):
        cortexm.get_target("cortex-m0")


# --- compiled programs end to end: firmware losses == host C build's losses, as text ----------
def _compiled(quantize):
    import torch
    import torch.nn as nn

    import edgetrain as et

    torch.manual_seed(0)
    if quantize is None:
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
        shape = (1, 1, 8, 8)
    else:
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                              nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(8, 10))
        shape = (1, 3, 12, 12)
    prog = et.compile(model, (torch.zeros(shape),), quantize=quantize, optimizer=et.SGD(lr=0.05))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(shape).astype(np.float32), np.array([i % 10])) for i in range(3)]
    return prog, data


def _host_step_lines(prog, data, d):
    import subprocess

    from edgetrain.backends.c.export import emit_c

    emit_c(prog, d, "host", data)
    r = subprocess.run(["make", "-s", "main"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["./main"], cwd=d, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    return [l for l in r.stdout.splitlines() if l.startswith("step ")]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler (cc) for the host build")
@pytest.mark.parametrize("quantize,target", [(None, "cortex-m4"), ("int8", "cortex-m7"), ("int8", "cortex-m55")])
def test_compiled_program_matches_host_build(tmp_path, quantize, target):
    prog, data = _compiled(quantize)
    host = _host_step_lines(prog, data, tmp_path / "host")
    assert len(host) == len(data)
    fw = cortexm.run_firmware(prog, tmp_path / target, target, data)
    run = fw.run
    assert run.exit_code == 0, run.lines
    # the size report is on the program: it fits, and the stack was measured
    assert prog.firmware is fw.size and 0 < fw.size.sram <= 256 * 1024 and fw.size.flash <= 1024 * 1024
    assert fw.size.stack_high_water and prog.firmware.describe().startswith("flash ")
    assert list(run.step_lines) == host
    # the trained program's reference losses agree (to float tolerance: the references sum
    # in another order)
    ref = [prog.step(x, y) for x, y in data]
    np.testing.assert_allclose(run.losses, ref, rtol=1e-5)
    size = fw.size
    assert size.flash <= cortexm.FLASH_BYTES and size.sram <= cortexm.SRAM_BYTES
    assert size.bss >= prog.memory.arena_bytes  # the arena is a zero-initialised static buffer
    # the generated code has a static stack bound, the reserve is sized to it, nothing allocates
    assert size.stack_bound is not None and run.stack_high_water <= size.stack_bound < size.stack_reserve
    assert size.heap_reserve == 0
    assert run.instructions_per_step and min(run.instructions_per_step) > 1000
