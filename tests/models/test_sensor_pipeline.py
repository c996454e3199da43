"""Sensor learning end to end, small (bench/sensors.py is the full run): BasicMotions IMU
series from the .ts reader, a GRU and a 1-D CNN compiled to int8 with QAS (the GRU under a
sparse scheme searched by update="auto" within 64 KB), emitted as Cortex-M4 firmware whose
QEMU losses equal the host C build's, and `edgetrain train --data ts:...` from the command line."""
from __future__ import annotations

import shutil
import subprocess
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import cortexm
from edgetrain.data import wheels

pytestmark = [pytest.mark.skipif(not wheels.available("sktime"),
                                 reason="BasicMotions comes from the sktime 1.2.0 wheel (`python -m edgetrain.data.wheels`)"),
              pytest.mark.filterwarnings("ignore:.*were assigned during export")]  # nn.GRU's _flat_weights
needs_firmware_tools = pytest.mark.skipif(bool(cortexm.missing_tools()) or shutil.which("cc") is None,
                                          reason=f"missing {', '.join(cortexm.missing_tools()) or 'cc'}")

#: a short crop keeps the unrolled GRU small: 16 of BasicMotions' 100 samples (1.6 s of motion)
LENGTH, PER_CLASS, HIDDEN, FIRMWARE_STEPS, LR = 16, 3, 8, 3, 0.05
#: the structural check needs only a few steps of the recurrence
SHORT = 6
BUDGET = "64KB"


class TinyGRU(nn.Module):
    def __init__(self, dims, classes):
        super().__init__()
        self.gru = nn.GRU(dims, HIDDEN, batch_first=True)
        self.classifier = nn.Linear(HIDDEN, classes)

    def forward(self, x):
        out, _ = self.gru(x.transpose(1, 2))
        return self.classifier(out[:, -1])


@pytest.fixture(scope="module")
def motions():
    """PER_CLASS training cases of each class, z-scored per dimension, and the class count."""
    from edgetrain.data.timeseries import load_ts_split

    s = load_ts_split("BasicMotions", "train", length=LENGTH)
    idx = np.concatenate([np.flatnonzero(s.labels == c)[:PER_CLASS] for c in range(len(s.classes))])
    mean, std = s.series.mean(axis=(0, 2)), s.series.std(axis=(0, 2))
    return s.batch(idx, (6, LENGTH), mean, std), s.labels[idx], len(s.classes)


def _host_lines(prog, samples, d):
    prog.emit_c(d, target="host", samples=samples)
    r = subprocess.run(["make", "-s", "main"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["./main"], cwd=d, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    return [l for l in r.stdout.splitlines() if l.startswith("step ")]


def _check_firmware(prog, samples, tmp_path):
    host = _host_lines(prog, samples, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", samples)
    assert list(fw.run.step_lines) == host and len(host) == len(samples)
    assert fw.size.sram <= cortexm.SRAM_BYTES and fw.size.flash <= cortexm.FLASH_BYTES
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in samples], rtol=1e-5)


def test_int8_gru_keeps_its_recurrence_in_float32(motions):
    """The int8 pipeline quantizes the GRU's input projection and the classifier (each weight read
    once); the recurrent weight, read at every time step, and the gates (sigmoid, tanh, mul: no
    int8 rule) stay float32 between them."""
    x, y, classes = motions
    x = np.ascontiguousarray(x[:, :, :SHORT])
    torch.manual_seed(0)
    prog = et.compile(TinyGRU(x.shape[1], classes).eval(), (torch.from_numpy(x[:1]),), quantize="int8",
                      optimizer=et.SGD(lr=LR, qas=True), calibration=[x[i:i + 1] for i in range(4)])
    ops = [n.op for n in prog.stages["quantized"].nodes]
    assert ops.count("qconv2d") == 2 and ops.count("linear") == SHORT  # W_hh at every step
    assert {"sigmoid", "tanh"} <= set(ops)
    losses = [prog.step(x[i:i + 1], y[i:i + 1]) for i in range(len(y))]
    assert np.all(np.isfinite(losses))


@needs_firmware_tools
@pytest.mark.slow  # ~100 s on 2 loaded cores: the analysis, the search's compiles, two C builds, QEMU
def test_gru_auto_sparse_int8_trains_on_cortex_m4_as_on_the_host(motions, tmp_path):
    from edgetrain.sparse.auto import AutoFallbackWarning
    from edgetrain.sparse.finetune import FineTune

    x, y, classes = motions
    torch.manual_seed(0)
    model = TinyGRU(x.shape[1], classes).eval()
    fit, val = np.arange(0, len(y), 2), np.arange(1, len(y), 2)
    # layers 0 and 1 are W_ih and the first of W_hh's per-step copies; bias depth 1 is b_hh
    table = et.sparse.analyze_contributions(model, (x[fit], y[fit]), (x[val], y[val]), layers=[0, 1], bias_ks=[1],
                                            ratios=(0.5, 1.0), config=FineTune(epochs=1, batch=1, lr=LR))
    with warnings.catch_warnings():  # a handful of cases: gains may not clear the table's noise floor
        warnings.simplefilter("ignore", AutoFallbackWarning)
        prog = et.compile(model, (torch.from_numpy(x[:1]),), update="auto", budget=et.Budget(sram=BUDGET),
                          quantize="int8", optimizer=et.SGD(lr=LR, qas=True), contributions=table,
                          calibration=[x[i:i + 1] for i in range(4)])
    assert prog.memory.peak_bytes <= 64 * 1024 and "classifier.weight" in prog.trainable
    _check_firmware(prog, [(x[i:i + 1], y[i:i + 1]) for i in range(FIRMWARE_STEPS)], tmp_path)


@needs_firmware_tools
@pytest.mark.slow  # ~30 s on 2 loaded cores
def test_conv1d_cnn_int8_trains_on_cortex_m4_as_on_the_host(motions, tmp_path):
    x, y, classes = motions
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(x.shape[1], 8, 5, stride=2), nn.ReLU(), nn.Conv1d(8, 8, 3), nn.ReLU(),
                          nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(8, classes)).eval()
    prog = et.compile(model, (torch.from_numpy(x[:1]),), quantize="int8", optimizer=et.SGD(lr=LR, qas=True),
                      calibration=[x[i:i + 1] for i in range(4)])
    assert [n.op for n in prog.stages["quantized"].nodes].count("qconv2d") == 3
    _check_firmware(prog, [(x[i:i + 1], y[i:i + 1]) for i in range(FIRMWARE_STEPS)], tmp_path)


MODEL_FILE = """
import torch
from torch import nn

def make(num_classes=4):
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(6 * 100, num_classes)).eval()
"""


def test_cli_trains_on_ts_data_and_validates_on_the_test_split(tmp_path, capsys):
    from edgetrain.app.cli import main

    (tmp_path / "seq.py").write_text(MODEL_FILE)
    code = main(["train", f"{tmp_path / 'seq.py'}:make", "--input", "1x6x100", "--classes", "4", "--data",
                 "ts:BasicMotions", "--epochs", "1", "--lr", "0.0005", "-o", str(tmp_path / "out"), "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "BasicMotions_TRAIN.ts: 40 images in 4 classes" in out.err + out.out
    assert "val accuracy" in out.err + out.out  # the _TEST.ts sibling, without --val
