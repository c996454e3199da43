"""The convolutions other than 2-d ones on Cortex-M under QEMU: a float model of Conv3d,
ConvTranspose2d, Conv1d and ConvTranspose1d, and (slow) the int8 1-d CNN of
tests/frontend/test_conv_nd.py (its conv1d layers as qconv2d), each trained by cortex-m4 firmware
printing the host C build's losses, as text."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn

import edgetrain as et
from edgetrain.backends.c import cortexm
from edgetrain.backends.c.export import emit_c
from tests.frontend.test_conv_nd import int8_sensor_program

#: the float model's input: (N, C, D, H, W)
SHAPE = (1, 2, 3, 6, 6)


class _ConvND(nn.Module):
    """A pointwise then a strided Conv3d over (D, H, W) (the second takes an input gradient); its
    D folded into channels for a ConvTranspose2d; H and W flattened to a sequence for a Conv1d and
    a ConvTranspose1d; a linear classifier."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv3d(2, 2, 1)
        self.conv3 = nn.Conv3d(2, 4, (2, 3, 3), padding=(0, 1, 1), stride=(1, 2, 2))
        self.up2 = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.conv1 = nn.Conv1d(4, 6, 3, stride=2, dilation=2, padding=2)
        self.up1 = nn.ConvTranspose1d(6, 3, 2, stride=2)
        self.fc = nn.Linear(3 * 36, 10)

    def forward(self, x):
        h = torch.relu(self.conv3(torch.tanh(self.pre(x))))  # (N, 4, 2, 3, 3)
        h = torch.tanh(self.up2(h.flatten(1, 2)))  # (N, 4, 6, 6)
        h = torch.relu(self.conv1(h.flatten(2)))  # (N, 6, 18)
        return self.fc(torch.tanh(self.up1(h)).flatten(1))  # (N, 3, 36)


def _tools():
    if cortexm.missing_tools() or shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make or cc'}")


def _host_step_lines(prog, data, d):
    emit_c(prog, d, "host", data)
    r = subprocess.run(["make", "-s", "main"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["./main"], cwd=d, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    return [line for line in r.stdout.splitlines() if line.startswith("step ")]


def test_float_conv_nd_model_on_cortex_m4_prints_the_host_builds_losses(tmp_path):
    _tools()
    torch.manual_seed(0)
    prog = et.compile(_ConvND(), (torch.zeros(SHAPE),), optimizer=et.SGD(lr=0.05))
    assert {"conv3d", "conv3d_grad_input", "conv3d_grad_weight", "conv_transpose2d", "conv2d",
            "conv2d_grad_weight"} <= {n.op for n in prog.train_graph.nodes}
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(SHAPE).astype(np.float32), np.array([i % 10])) for i in range(3)]
    host = _host_step_lines(prog, data, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert len(host) == len(data) and list(fw.run.step_lines) == host
    assert fw.size.stack_bound is not None and fw.run.stack_high_water <= fw.size.stack_bound
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)


@pytest.mark.slow  # the int8 kernels it runs are qconv2d's, on Cortex-M in tests/backends/c/test_int8_cortexm.py
def test_int8_conv1d_program_on_cortex_m4_prints_the_host_builds_losses(tmp_path):
    _tools()
    prog, data = int8_sensor_program()
    assert "qconv2d" in {n.op for n in prog.train_graph.nodes}
    host = _host_step_lines(prog, data, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert len(host) == len(data) and list(fw.run.step_lines) == host
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)
