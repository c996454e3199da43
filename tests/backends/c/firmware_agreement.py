"""A compiled program's firmware against its host build: the host project's `main` and the
Cortex-M4 firmware under QEMU train on the same samples and print the same step lines."""
from __future__ import annotations

import subprocess


def firmware_prints_host_steps(prog, data, tmp_path):
    """Build and run the host project (its Makefile links no libm: the kernels need none) and the
    Cortex-M4 firmware on `data`; assert their step lines are equal; the firmware's result."""
    from edgetrain.backends.c import cortexm
    from edgetrain.backends.c.export import emit_c

    emit_c(prog, tmp_path / "host", "host", data)
    r = subprocess.run(["make", "-s", "main"], cwd=tmp_path / "host", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["./main"], cwd=tmp_path / "host", capture_output=True, text=True, timeout=300)
    host = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert len(host) == len(data) and list(fw.run.step_lines) == host
    return fw
