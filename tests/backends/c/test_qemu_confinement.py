"""Firmware under QEMU is confined (issue 18, item 2): it prints, trains on the samples in its
image and ends with a status, and nothing else. Under the semihosting configuration the runner
used before (`-semihosting-config enable=on,target=native`), a firmware's SYS_SYSTEM ran a host
command and its SYS_OPEN + SYS_WRITE created a host file; these tests inject those calls into
the fixture firmware (cortexm_fixture/), show that they do reach the host under that old
configuration, and that `run_qemu` and `make run` now end such a firmware with a fault status,
the host untouched."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edgetrain.backends.c import cortexm

from .test_cortexm import FIXTURE, fixture_losses, fixture_samples

pytestmark = pytest.mark.skipif(bool(cortexm.missing_tools()),
                                reason=f"missing {', '.join(cortexm.missing_tools())}")

ET_EXIT_FAULT = 4  # runtime/cortexm/cortexm.h

# Arm semihosting operation numbers and the one SYS_OPEN mode used
SYS_OPEN, SYS_WRITE, SYS_SYSTEM = 0x01, 0x05, 0x12
OPEN_MODE_W = 4

# model.c of an attacking firmware: the fixture's model, its et_init preceded by an injected
# semihosting call (a bkpt 0xab with the operation in r0 and its parameter block in r1)
ATTACK_MODEL_C = r"""
#include <stdint.h>
#define et_init et_init_fixture
#include "fixture_model.c"
#undef et_init

static uintptr_t semihost(uintptr_t op, const void *arg)
{
    register uintptr_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

void et_init(void)
{
    static const char text[] = "%(text)s";
    const uintptr_t args[] = {(uintptr_t)text, %(args)s}; /* SYS_SYSTEM: text, length; SYS_OPEN: path, mode, length */
    uintptr_t r = semihost(%(op)d, args);
    if (%(op)d == %(sys_open)d) {
        static const char payload[] = "written by the guest\n";
        const uintptr_t write_args[3] = {r, (uintptr_t)payload, sizeof payload - 1u};
        semihost(%(sys_write)d, write_args);
    }
    et_init_fixture();
}
"""


def attack_firmware(tmp_path: Path, name: str, op: int, text: str, target: str = "cortex-m4") -> Path:
    """The fixture firmware with one injected semihosting call `op` taking `text` (SYS_SYSTEM:
    a command; SYS_OPEN: a path, opened for writing and then written to)."""
    d = tmp_path / name
    shutil.copytree(FIXTURE, d)
    (d / "model.c").rename(d / "fixture_model.c")  # included by the new model.c, not compiled alone
    args = "sizeof text - 1u" if op == SYS_SYSTEM else f"{OPEN_MODE_W}, sizeof text - 1u"
    (d / "model.c").write_text(ATTACK_MODEL_C % dict(text=text, op=op, args=args, sys_open=SYS_OPEN,
                                                    sys_write=SYS_WRITE))
    cortexm.write_project(d, target, fixture_samples(3))
    cortexm.build(d)
    return d


def run_with_semihosting(d: Path, target: str = "cortex-m4") -> subprocess.CompletedProcess:
    """The firmware under the semihosting configuration the runner used before this fix."""
    cmd = ["qemu-system-arm", "-M", cortexm.get_target(target).machine, "-nographic", "-monitor", "none",
           "-serial", "stdio", "-semihosting-config", "enable=on,target=native", "-watchdog-action", "poweroff",
           "-kernel", str(d / "firmware.elf")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def assert_stopped_by_fault(run: cortexm.QemuRun):
    assert run.exit_code == ET_EXIT_FAULT, run.lines
    assert "edgetrain: unexpected exception" in run.lines
    assert run.step_lines == ()  # stopped at the call, before training


@pytest.mark.parametrize("target", sorted(cortexm.TARGETS))
def test_sys_system_runs_no_host_command(tmp_path, target):
    outside = tmp_path / "outside"
    outside.mkdir()
    pwned = outside / "pwned"
    d = attack_firmware(tmp_path, "system", SYS_SYSTEM, f"touch {pwned}", target)
    # the injected call is real: with semihosting on, QEMU runs the command on the host
    run_with_semihosting(d, target)
    assert pwned.exists()
    pwned.unlink()

    run = cortexm.run_qemu(d, target)
    assert_stopped_by_fault(run)
    assert not pwned.exists()
    # `make run` runs the same confined command line and fails with the firmware's status
    r = subprocess.run(["make", "-s", "-C", str(d), "run"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "edgetrain: exit 4" in r.stdout
    assert not pwned.exists()


def test_sys_open_and_write_create_no_host_file(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    written = outside / "written.txt"
    d = attack_firmware(tmp_path, "open", SYS_OPEN, str(written))
    run_with_semihosting(d)
    assert written.read_text() == "written by the guest\n"
    written.unlink()

    run = cortexm.run_qemu(d, "cortex-m4")
    assert_stopped_by_fault(run)
    assert list(outside.iterdir()) == []
    # a relative path reaches nothing either (QEMU runs in a fresh empty directory)
    d = attack_firmware(tmp_path, "open_relative", SYS_OPEN, "written.txt")
    assert_stopped_by_fault(cortexm.run_qemu(d, "cortex-m4"))
    assert not (d / "written.txt").exists() and not Path("written.txt").exists()


def test_normal_firmware_output_and_status_arrive(tmp_path):
    """Output on the UART, the exit status from the last line (not among the run's lines)."""
    x, y = fixture_samples(4)
    d = tmp_path / "normal"
    shutil.copytree(FIXTURE, d)
    cortexm.write_project(d, "cortex-m4", (x, y))
    cortexm.build(d)
    run = cortexm.run_qemu(d, "cortex-m4")
    assert run.exit_code == 0
    want = [cortexm.format_step_line(i, l) for i, l in enumerate(fixture_losses(x, y), start=1)]
    assert list(run.lines) == want + [f"stack high water {run.stack_high_water} of {run.stack_reserve} bytes"]
    # a failing firmware's status arrives too
    bad = tmp_path / "smash"
    shutil.copytree(FIXTURE, bad)
    cortexm.write_project(bad, "cortex-m4", (x, y))
    cortexm.build(bad, extra_cflags=["-DET_FIXTURE_SMASH_ARENA"])
    run = cortexm.run_qemu(bad, "cortex-m4")
    assert run.exit_code == 2 and "edgetrain: arena guard word overwritten" in run.lines


def test_firmware_that_never_ends_times_out(tmp_path):
    d = tmp_path / "hang"
    shutil.copytree(FIXTURE, d)
    (d / "model.c").rename(d / "fixture_model.c")
    (d / "model.c").write_text('#define et_init et_init_fixture\n#include "fixture_model.c"\n#undef et_init\n'
                               "void et_init(void) { for (;;) { __asm__ volatile(\"\"); } }\n")
    cortexm.write_project(d, "cortex-m4", fixture_samples(2))
    cortexm.build(d)
    with pytest.raises(cortexm.CortexMError, match="did not finish in 3 s"):
        cortexm.run_qemu(d, "cortex-m4", timeout=3)
