"""The host project cross-built for aarch64 (aarch64-linux-gnu-gcc, -static, no BLAS) and run under
qemu-aarch64 user-mode emulation equals the reference runtime (backends/c/cross.py; issue 35
item 4): float32 programs within 1e-5 (losses and every trained tensor), int8 programs bit for bit
(their integer weights and their float32 optimizer state; et_int8_grad.h's NEON blocks keep the
reference's order of float sums)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import cross
from edgetrain.backends.c.layout import CBackendError

pytestmark = pytest.mark.skipif(bool(cross.missing_tools("aarch64")),
                                reason=f"the aarch64 build needs {', '.join(cross.missing_tools('aarch64'))} "
                                       "(apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)")

#: the ELF machine number of aarch64
EM_AARCH64 = 183
EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


def _digits():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import digits
    finally:
        sys.path.remove(str(EXAMPLES))
    return digits.build()


def _digit_samples(n=3):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(2, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, size=2)) for _ in range(n)]


def _conv_net():
    """Stride-1 padded 3x3 convs (et_int8_grad.h's NEON input-gradient block, sw == 1), a depthwise
    and a pointwise conv, a dense layer."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


def _conv_samples(n=3):
    rng = np.random.default_rng(2)
    return [(rng.normal(size=(2, 1, 8, 8)).astype(np.float32), rng.integers(0, 5, size=2)) for _ in range(n)]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _mlp_samples(n=4):
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(2, 8)).astype(np.float32), np.array([i % 3, (i + 1) % 3])) for i in range(n)]


def _check(prog, samples, tmp_path, **kw):
    run = cross.run_cross(prog, samples, "aarch64", out_dir=tmp_path / "proj", **kw)
    assert len(run.losses) == len(samples)
    chk = cross.compare_with_reference(prog, samples, run)
    return run, chk


@pytest.mark.parametrize("fma", [False, True])
def test_float32_digits_under_qemu_aarch64_matches_the_reference(tmp_path, fma):
    """The digits example (3x3 stride-2 convs, batch norm, dense): losses and every tensor within
    1e-5 of the reference, in the project's exact build and the fast one (NEON FMLA)."""
    samples = _digit_samples()
    prog = et.compile(_digits(), (samples[0][0],), optimizer=et.SGD(lr=0.05, momentum=0.9))
    before = {k: np.array(v, copy=True) for k, v in prog.state.items()}
    run, chk = _check(prog, samples, tmp_path, fma=fma)
    assert chk.ok, chk.describe()
    assert chk.loss_rel <= cross.FLOAT_RTOL and chk.float_rel <= cross.FLOAT_RTOL
    # trained: the saved weights moved away from the initial ones; prog itself did not
    assert any(not np.array_equal(run.weights[k].reshape(v.shape), v) for k, v in before.items()
               if np.issubdtype(v.dtype, np.floating))
    assert all(np.array_equal(prog.state[k], v) for k, v in before.items())
    elf = (tmp_path / "proj" / "main").read_bytes()[:20]
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == EM_AARCH64  # not the host's binary


def test_float32_mlp_under_qemu_aarch64_matches_the_reference(tmp_path):
    samples = _mlp_samples()
    prog = et.compile(_mlp(), (samples[0][0],), optimizer=et.SGD(lr=0.1, momentum=0.9))
    _, chk = _check(prog, samples, tmp_path)
    assert chk.ok, chk.describe()


@pytest.mark.parametrize("model", ["digits", "conv_net"])
def test_int8_programs_under_qemu_aarch64_are_bit_exact(tmp_path, model):
    """int8: every integer weight, every float32 optimizer state and every loss equal to the
    reference's bit for bit (the conv net runs et_int8_grad.h's NEON blocks)."""
    net, samples = (_digits(), _digit_samples()) if model == "digits" else (_conv_net(), _conv_samples())
    prog = et.compile(net, (samples[0][0],), optimizer=et.SGD(lr=0.05, momentum=0.9), quantize="int8",
                      calibration=[samples[0][0]])
    run, chk = _check(prog, samples, tmp_path)
    assert chk.int_mismatches == () and chk.float_rel == 0.0 and chk.losses_equal, chk.describe()
    assert any(np.issubdtype(v.dtype, np.integer) for v in run.weights.values())


def test_instruction_counts_per_step(tmp_path):
    """The plugin counts: a step of the MLP costs instructions, the same in steps 2-3 as in steps 2-4
    (per step; the printed losses' digits differ a little), and the count of a run grows with its steps."""
    samples = _mlp_samples()
    prog = et.compile(_mlp(), (samples[0][0],), optimizer=et.SGD(lr=0.1))
    d = cross.emit_standalone(prog, tmp_path / "proj", samples)
    cross.build_cross(d)
    a, b = cross.per_step_instructions(d, steps=(1, 2)), cross.per_step_instructions(d, steps=(1, 3))
    assert a > 1000 and abs(a - b) / b < 0.05, (a, b)
    one = cross.run_emulated(d, ["weights.bin", "samples.bin", "--steps", 1], count=True)
    assert one.exit_code == 0 and one.instructions > a and one.losses


def test_flags_and_names():
    assert "-march=native" not in cross.cross_cflags() and "-static" in cross.cross_cflags()
    assert "-march=armv8-a" in cross.cross_cflags()
    assert set(cross.FMA_FLAGS) <= set(cross.cross_cflags(fma=True))
    assert not set(cross.FMA_FLAGS) & set(cross.cross_cflags())
    assert "BLAS=0" in cross.make_command() and "CC=aarch64-linux-gnu-gcc" in cross.make_command()
    assert cross.get_arch("aarch64-linux") is cross.get_arch("aarch64")
    with pytest.raises(CBackendError, match="unknown cross architecture"):
        cross.get_arch("z80")


def test_a_failing_run_is_reported(tmp_path):
    """A trainer that stops non-zero under QEMU (a label out of range in samples.bin) raises, naming the exit."""
    samples = _mlp_samples()
    bad = [(x, np.array([7, 0])) for x, _ in samples[:1]]
    prog = et.compile(_mlp(), (samples[0][0],), optimizer=et.SGD(lr=0.1))
    d = cross.emit_standalone(prog, tmp_path / "proj", samples)
    from edgetrain.backends.c.project import program_samples
    from edgetrain.backends.c.weights_file import samples_blob

    xs, _ = program_samples(prog, samples[:1])
    (d / "samples.bin").write_bytes(samples_blob(xs, [np.asarray(bad[0][1], np.int64).view(np.uint8)]))
    cross.build_cross(d)
    r = cross.run_emulated(d, ["weights.bin", "samples.bin"])
    assert r.exit_code != 0 and "label" in r.stderr, (r.exit_code, r.stderr)
