"""MLPerf Tiny's two reference models in the zoo (models/mlperf_tiny.py): their architecture,
float and int8 compilation (gradients against torch.autograd in float), and firmware that fits
256 KB SRAM / 1 MB flash and trains under QEMU with the host C build's losses."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import cortexm
from edgetrain.models.mlperf_tiny import AD_INPUTS, DSCNN_POOL, KWS_CLASSES

#: the reference Keras models' parameter counts (24,908 and 269,992) less their batch-norm
#: moving means and variances, which are buffers in PyTorch (9 x 2 x 64; 8 x 2 x 128 + 2 x 8)
DSCNN_PARAMS, AD_PARAMS = 23_756, 267_928
FIRMWARE_STEPS = 2
SRAM, FLASH = 256 * 1024, 1024 * 1024
#: float32 gradients against torch.autograd (the reference sums in another order)
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5
needs_firmware_tools = pytest.mark.skipif(bool(cortexm.missing_tools()) or shutil.which("cc") is None,
                                          reason=f"missing {', '.join(cortexm.missing_tools()) or 'cc'}")


def _example(name, seed=0):
    x = et.models.example_input(name, seed=seed)
    y = x.numpy() if name == "ad-autoencoder" else np.array([seed % KWS_CLASSES])
    return x.numpy(), y


def _loss(name):
    return "mse" if name == "ad-autoencoder" else "cross_entropy"


def test_ds_cnn_architecture():
    m = et.models.get("ds-cnn", num_classes=KWS_CLASSES)
    assert sum(p.numel() for p in m.parameters()) == DSCNN_PARAMS
    convs = [c for c in m.modules() if isinstance(c, nn.Conv2d)]
    assert [c.groups for c in convs] == [1] + [64, 1] * 4
    assert convs[0].kernel_size == (10, 4) and convs[0].stride == (2, 2)
    shapes = []
    hooks = [c.register_forward_hook(lambda mod, i, o: shapes.append(tuple(o.shape[1:]))) for c in convs]
    out = m(torch.randn(2, 1, 49, 10))
    for h in hooks:
        h.remove()
    assert shapes == [(64, 25, 5)] * 9  # Keras "same": 49x10 -> 25x5, kept by every block
    assert out.shape == (2, KWS_CLASSES) and DSCNN_POOL == (24, 5)
    assert sum(isinstance(b, nn.BatchNorm2d) for b in m.modules()) == 9


def test_autoencoder_architecture():
    m = et.models.get("ad-autoencoder")
    linears = [l for l in m.modules() if isinstance(l, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == \
        [(640, 128)] + [(128, 128)] * 3 + [(128, 8), (8, 128)] + [(128, 128)] * 3 + [(128, 640)]
    assert sum(p.numel() for p in m.parameters()) == AD_PARAMS
    bns = [b for b in m.modules() if isinstance(b, nn.BatchNorm1d)]
    assert len(bns) == 9 and all(not torch.equal(b.running_var, torch.ones_like(b.running_var)) for b in bns)
    assert m(torch.randn(3, AD_INPUTS)).shape == (3, AD_INPUTS)


@pytest.mark.parametrize("name", ["ds-cnn", "ad-autoencoder"])
def test_float_gradients_match_torch(name):
    m = et.models.get(name, num_classes=KWS_CLASSES)
    x, y = _example(name)
    prog = et.compile(m, (torch.from_numpy(x),), loss=_loss(name))
    got = prog.gradients(x, y)
    out = m(torch.from_numpy(x))
    loss = nn.functional.mse_loss(out, torch.from_numpy(y)) if name == "ad-autoencoder" else \
        nn.functional.cross_entropy(out, torch.from_numpy(y))
    want = dict(zip([n for n, _ in m.named_parameters()], torch.autograd.grad(loss, list(m.parameters()))))
    assert set(got) == set(want)
    for k, g in want.items():
        np.testing.assert_allclose(got[k], g.numpy(), rtol=GRAD_RTOL, atol=GRAD_ATOL, err_msg=k)


@pytest.mark.parametrize("name", ["ds-cnn", "ad-autoencoder"])
def test_int8_compiles_with_calibration_and_trains(name):
    m = et.models.get(name, num_classes=KWS_CLASSES)
    calib = [_example(name, seed=s)[0] for s in range(4)]
    prog = et.compile(m, (torch.from_numpy(calib[0]),), loss=_loss(name), quantize="int8",
                      optimizer=et.SGD(lr=0.01, qas=True), calibration=calib)
    x, y = _example(name, seed=1)
    losses = [prog.step(x, y) for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def _firmware_program(name, quantize, update):
    m = et.models.get(name, num_classes=KWS_CLASSES)
    calib = [_example(name, seed=s)[0] for s in range(4)] if quantize else None
    prog = et.compile(m, (et.models.example_input(name),), loss=_loss(name), quantize=quantize, update=update,
                      optimizer=et.SGD(lr=0.01, qas=quantize is not None), calibration=calib)
    return prog, [_example(name, seed=s) for s in range(FIRMWARE_STEPS)]


def _host_step_lines(prog, data, d):
    prog.emit_c(d, target="host", samples=data)
    r = subprocess.run(["make", "-s", "main"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["./main"], cwd=d, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:]
    return [l for l in r.stdout.splitlines() if l.startswith("step ")]


#: what trains on the chip: the DS-CNN fully in int8 (150 KB peak) and its float32 classifier
#: and last block (a full float32 backward needs ~690 KB); the autoencoder's int8 weights are
#: 270 KB, so its last four dense layers train and the rest stay in flash
FIRMWARE_CASES = [("ds-cnn", "int8", et.Full()), ("ds-cnn", None, et.LastK(3)),
                  ("ad-autoencoder", "int8", et.LastK(4))]


@needs_firmware_tools
@pytest.mark.slow
@pytest.mark.parametrize("name,quantize,update", FIRMWARE_CASES, ids=["ds-cnn-int8", "ds-cnn-float", "ad-int8"])
def test_firmware_fits_and_trains_as_the_host_build(tmp_path, name, quantize, update):
    prog, data = _firmware_program(name, quantize, update)
    host = _host_step_lines(prog, data, tmp_path / "host")
    assert len(host) == FIRMWARE_STEPS
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert list(fw.run.step_lines) == host
    assert 0 < fw.size.sram <= SRAM and fw.size.flash <= FLASH
    ref = [prog.step(x, y) for x, y in data]
    np.testing.assert_allclose(fw.run.losses, ref, rtol=1e-5)
