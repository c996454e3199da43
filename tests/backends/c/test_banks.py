"""Two weight banks (emit option weight_banks=2, runtime/et_bank.h): a step updates a copy of
the committed bank and commits it by one header write, so a power loss in the middle of a
step leaves the last committed weights. Simulated on the host build (the same emitted C,
compiled with -DET_BANK_TEST_HOOKS): a step aborted after node k, then a "reboot" (et_init,
which resumes from the committed bank the way the firmware does), then the remaining steps
give the weights of an uninterrupted run bit for bit; a corrupted bank is detected by its
CRC and the other one is used. One QEMU run: the banked firmware prints the losses of the
unbanked one."""
from __future__ import annotations

import ctypes
import math
import re
import shutil

import numpy as np
import pytest

from edgetrain.backends.c import cortexm
from edgetrain.backends.c.emit import emit_sources
from edgetrain.backends.c.project import program_samples
from edgetrain.backends.c.host import PROJECT_CFLAGS, build_library, load_private

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no host C compiler")
N_STEPS = 6
RESUME_AT = 3  # steps committed before the power loss


@pytest.fixture(scope="module")
def setup():
    import torch
    import torch.nn as nn

    import edgetrain as et

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
    prog = et.compile(model, (torch.zeros(1, 1, 8, 8),), optimizer=et.SGD(lr=0.05, momentum=0.9))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((1, 1, 8, 8)).astype(np.float32), np.array([i % 10])) for i in range(N_STEPS)]
    xs, ys = program_samples(prog, data)
    flags = (*PROJECT_CFLAGS, "-DET_BANK_TEST_HOOKS")
    libs = {b: build_library(emit_sources(prog, embed_weights=True, graphs=("train",), weight_banks=b), flags)
            for b in (1, 2)}
    prog.banks_data = data
    return prog, xs, ys, libs


def _open(path):
    lib = load_private(path)
    vp = ctypes.c_void_p
    for name, res, args in (("et_init", None, []), ("et_train_step", ctypes.c_float, [vp, vp]),
                            ("et_get_step", ctypes.c_int32, []), ("et_num_state", ctypes.c_int, []),
                            ("et_state_bytes", ctypes.c_long, [ctypes.c_int]),
                            ("et_get_state", ctypes.c_int, [ctypes.c_int, vp])):
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    if hasattr(lib, "et_bank_boot"):
        for name, res, args in (("et_bank_boot", ctypes.c_int, []), ("et_bank_active_index", ctypes.c_int, []),
                                ("et_bank_ptr", vp, [ctypes.c_int]), ("et_bank_bytes", ctypes.c_long, []),
                                ("et_test_abort_after_node", None, [ctypes.c_int])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    lib.et_init()
    return lib


def _step(lib, xs, ys, i):
    return lib.et_train_step(xs[i].ctypes.data, ys[i].ctypes.data)


def _state(lib) -> bytes:
    out = []
    for i in range(lib.et_num_state()):
        buf = np.empty(lib.et_state_bytes(i), dtype=np.uint8)
        assert lib.et_get_state(i, buf.ctypes.data) == 0
        out.append(buf.tobytes())
    return b"".join(out)


def _bank(lib, b) -> np.ndarray:
    n = lib.et_bank_bytes()
    return np.frombuffer((ctypes.c_uint8 * n).from_address(lib.et_bank_ptr(b)), dtype=np.uint8)


@pytest.fixture(scope="module")
def reference(setup):
    """An uninterrupted banked run: the losses and the state after each step (index = steps
    done); bit-equal to the single-bank build's."""
    prog, xs, ys, libs = setup
    one, two = _open(libs[1]), _open(libs[2])
    states, losses = [_state(two)], []
    assert _state(one) == states[0]
    for i in range(N_STEPS):
        l1, l2 = _step(one, xs, ys, i), _step(two, xs, ys, i)
        assert np.float32(l1).tobytes() == np.float32(l2).tobytes()
        losses.append(l2)
        states.append(_state(two))
        assert _state(one) == states[-1] and two.et_get_step() == i + 1
    assert len(set(states)) == len(states)  # every step changed the weights
    return losses, states


def test_power_loss_mid_step_resumes_bit_equal(setup, reference):
    prog, xs, ys, libs = setup
    losses, states = reference
    nodes = len(prog.train_graph.nodes)
    aborted = half_updated = 0
    for k in range(nodes):
        lib = _open(libs[2])
        for i in range(RESUME_AT):
            _step(lib, xs, ys, i)
        committed = lib.et_bank_active_index()
        before = _bank(lib, committed).copy()
        lib.et_test_abort_after_node(k)
        loss = _step(lib, xs, ys, RESUME_AT)
        if not math.isnan(loss):  # node k has no abort point (a member of a fused group)
            continue
        aborted += 1
        # the power failed: the committed bank is untouched, the other one may be half updated
        assert np.array_equal(_bank(lib, committed), before)
        half_updated += not np.array_equal(_bank(lib, 1 - committed), before)
        lib.et_test_abort_after_node(-1)
        lib.et_init()  # reboot: resume from the committed state
        assert lib.et_get_step() == RESUME_AT and lib.et_bank_active_index() == committed
        assert _state(lib) == states[RESUME_AT]
        for i in range(RESUME_AT, N_STEPS):
            assert np.float32(_step(lib, xs, ys, i)).tobytes() == np.float32(losses[i]).tobytes()
        assert lib.et_get_step() == N_STEPS
        assert _state(lib) == states[N_STEPS], f"abort after node {k}"
    assert aborted >= nodes // 2
    assert half_updated > 0  # some aborts came after weight updates had begun on the copy


@pytest.mark.parametrize("which", ["active", "inactive", "both"])
def test_corrupted_bank_is_detected(setup, reference, which):
    prog, xs, ys, libs = setup
    losses, states = reference
    lib = _open(libs[2])
    n = RESUME_AT + 1
    for i in range(n):
        _step(lib, xs, ys, i)
    a = lib.et_bank_active_index()
    for b in {"active": [a], "inactive": [1 - a], "both": [0, 1]}[which]:
        _bank(lib, b)[17] ^= 0x40  # one bit flipped
    if which == "both":
        assert lib.et_bank_boot() == -1  # nothing valid: et_init would start afresh
        return
    lib.et_init()  # reboot
    if which == "active":  # the other bank holds the step before, checksummed: resume there
        assert lib.et_bank_active_index() == 1 - a and lib.et_get_step() == n - 1
        assert _state(lib) == states[n - 1]
        start = n - 1
    else:
        assert lib.et_bank_active_index() == a and lib.et_get_step() == n
        assert _state(lib) == states[n]
        start = n
    for i in range(start, N_STEPS):
        assert np.float32(_step(lib, xs, ys, i)).tobytes() == np.float32(losses[i]).tobytes()
    assert _state(lib) == states[N_STEPS]


def test_weight_banks_option_default_is_unchanged(setup):
    prog = setup[0]
    assert emit_sources(prog, True, graphs=("train",)) == emit_sources(prog, True, graphs=("train",), weight_banks=1)
    with pytest.raises(Exception, match="weight_banks"):
        emit_sources(prog, True, graphs=("train",), weight_banks=3)


@pytest.mark.skipif(bool(cortexm.missing_tools()), reason=f"missing {', '.join(cortexm.missing_tools())}")
def test_banked_firmware_prints_the_same_losses(setup, tmp_path):
    prog, xs, ys, libs = setup
    runs, sizes = {}, {}
    for b in (1, 2):
        d = cortexm.emit_firmware(prog, tmp_path / f"banks{b}", "cortex-m4", prog.banks_data[:3], weight_banks=b)
        elf = cortexm.build(d)
        runs[b] = cortexm.run_qemu(d, "cortex-m4")
        assert runs[b].exit_code == 0, runs[b].lines
        sizes[b] = cortexm.firmware_size(elf)
    assert runs[2].step_lines == runs[1].step_lines and len(runs[1].step_lines) == 3
    # the size report's SRAM holds the second bank: the trained state once more (bank 0 is one
    # initialised object, so the momentum half of it moves from .bss to .data)
    bank_bytes = _open(libs[2]).et_bank_bytes()
    assert sizes[2].sram - sizes[1].sram >= bank_bytes

    # a real system reset (SYSRESETREQ) in the middle of step 2: QEMU restarts the firmware, the
    # reset handler re-runs, the banks in .noinit survive and it resumes after step 1
    d = cortexm.emit_firmware(prog, tmp_path / "reset", "cortex-m4", prog.banks_data[:3], weight_banks=2)
    points = [int(k) for k in re.findall(r"ET_BANK_ABORT_POINT\((\d+)\)", (d / "model.c").read_text())]
    mid = points[len(points) // 2]
    cortexm.build(d, extra_cflags=["-DET_BANK_RESET_AT_STEP=2", f"-DET_BANK_RESET_AT_NODE={mid}"])
    reset = cortexm.run_qemu(d, "cortex-m4")
    assert reset.exit_code == 0, reset.lines
    assert "resumed at step 1" in reset.lines
    assert reset.step_lines == runs[1].step_lines  # step 2 redone from the committed bank: the same losses
