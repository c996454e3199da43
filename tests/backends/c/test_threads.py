"""The host C library on several threads (CRunner's threads=, runtime/et_common.h's ET_PARALLEL_FOR):
the losses, weights and gradients do not depend on the thread count, bit for bit (float32 and int8).
The layers are large enough that every parallel loop they reach runs split (work >= ET_PARALLEL_MIN_WORK).
The threaded library is host.OPENMP_CFLAGS's (opt-in)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c.host import OPENMP_CFLAGS, CBackendError, CRunner, check_threads, to_c_program

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")

THREADS = (1, 2, 3)


class _MbBlock(nn.Module):
    """An MBV2-ish net: conv, depthwise (stride 1 and 2), batch norm, ReLU6, a residual add, max and
    average pooling, a dense layer."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.ReLU6(),
                                nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16))
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16),
                                  nn.BatchNorm2d(16), nn.ReLU(), nn.AvgPool2d(2))
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.dw(x)
        return self.head(self.down(x).flatten(1))


def _net():
    torch.manual_seed(0)
    m = _MbBlock()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
    return m


def _int8_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                         nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 5))


def _runs(prog, batches):
    """{threads: (losses, state after the steps, gradients of one more batch)} on the C backend."""
    out = {}
    for t in THREADS:
        c = to_c_program(prog, OPENMP_CFLAGS, threads=t)
        assert c.runner.threads == t
        losses = [c.step(x, y) for x, y in batches]
        grads = c.runner.gradients(*batches[0])
        out[t] = (losses, {k: np.array(v) for k, v in c.state.items()}, grads)
    return out


def _same(runs):
    losses, state, grads = runs[THREADS[0]]
    assert all(np.isfinite(losses))
    for t in THREADS[1:]:
        l2, s2, g2 = runs[t]
        assert l2 == losses, (t, l2, losses)  # bit for bit: float == float
        for k in state:
            assert np.array_equal(s2[k], state[k]), (t, k)
        for k in grads:
            assert np.array_equal(g2[k], grads[k]), (t, k)


@pytest.mark.parametrize("batchnorm", ["eval", "train"])
def test_float_steps_do_not_depend_on_threads(batchnorm):
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(4, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, size=4)) for _ in range(3)]
    prog = et.compile(_net(), (batches[0][0],), optimizer=et.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
                      batchnorm=batchnorm)
    runs = _runs(prog, batches)
    _same(runs)
    ref = [prog.step(x, y) for x, y in batches]  # the reference runtime: the spec
    np.testing.assert_allclose(runs[1][0], ref, rtol=1e-4)


def _wide_net():
    """Convolutions whose GEMMs are cut into tiles (et_float_blas.h: at least 2 x ET_SGEMM_TILE_MACS multiply-adds):
    along the columns (64 x 288 x ~900 per block) and along the rows (256 channels of 4x4 pixels); a 5x5 and a
    strided 7x7 depthwise convolution (ET_DW_SPECIALISE's other sizes) and one of run-time size (3x5)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 5, padding=2, groups=64), nn.Conv2d(64, 64, 7, stride=2, padding=3, groups=64),
                         nn.Conv2d(64, 64, (3, 5), padding=(1, 2), groups=64), nn.MaxPool2d(4),
                         nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(256 * 16, 10))


def test_tiled_gemms_and_depthwise_sizes_do_not_depend_on_threads():
    rng = np.random.default_rng(2)
    batches = [(rng.normal(size=(4, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, size=4)) for _ in range(2)]
    prog = et.compile(_wide_net(), (batches[0][0],), optimizer=et.SGD(lr=0.01, momentum=0.9))
    runs = _runs(prog, batches)
    _same(runs)
    ref = [prog.step(x, y) for x, y in batches]
    np.testing.assert_allclose(runs[1][0], ref, rtol=1e-4)


def _blocks_net():
    """Convolutions on the BLAS path (below oneDNN's ET_DNNL_MIN_MACS) whose GEMM blocks (et_float_blas.h's
    et_blocks, about 1 MiB of im2col each) are small enough to run side by side (et_blocks_side_by_side): 1x1
    convolutions 8 -> 48 -> 8 (a 64x64 image per block), a 3x3 of 2 -> 8 channels (blocks of 3 images and of 1),
    and between them a 3x3 of 8 -> 2 channels whose blocks are 56 and 8 output rows of one image (its forward side
    by side; its input gradient one block after another: their windows overlap)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 48, 1), nn.ReLU(), nn.Conv2d(48, 8, 1),
                         nn.ReLU(), nn.Conv2d(8, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 8, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10))


def test_convolution_blocks_side_by_side_do_not_depend_on_threads():
    """The pieces' outputs and input gradients written side by side, the weight gradients' partial sums added in
    piece order: the same bits on 1, 2 and 3 threads and in the serial library (its pieces in turn), and the
    reference's gradients."""
    rng = np.random.default_rng(4)
    batches = [(rng.normal(size=(4, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, size=4)) for _ in range(2)]
    prog = et.compile(_blocks_net(), (batches[0][0],), optimizer=et.SGD(lr=0.05, momentum=0.9))
    runs = _runs(prog, batches)
    _same(runs)
    serial = to_c_program(prog)
    assert [serial.step(x, y) for x, y in batches] == runs[1][0]
    assert all(np.array_equal(np.array(v), runs[1][1][k]) for k, v in serial.state.items())
    ref = [prog.step(x, y) for x, y in batches]
    np.testing.assert_allclose(runs[1][0], ref, rtol=1e-4)
    want = prog.gradients(*batches[0])  # after the same steps, as _runs took them
    for k, g in runs[1][2].items():
        np.testing.assert_allclose(g, want[k], rtol=1e-3, atol=1e-4 * np.abs(want[k]).max(), err_msg=k)


def test_int8_steps_do_not_depend_on_threads():
    rng = np.random.default_rng(1)
    batches = [(rng.normal(size=(1, 1, 32, 32)).astype(np.float32), np.array([i % 5])) for i in range(3)]
    prog = et.compile(_int8_net(), (batches[0][0],), update=et.Full(), quantize="int8",
                      optimizer=et.SGD(lr=0.05, momentum=0.9))
    runs = _runs(prog, batches)
    _same(runs)
    ref = [prog.step(x, y) for x, y in batches]  # the int8 program is bit-exact against the reference
    assert runs[1][0] == ref


def _int8_wide_net():
    """int8 layers whose backward loops run split: 1x1 input gradients over 4-channel blocks, the
    depthwise input gradients' single channels (32 of 16x16, each through its thread's plane) and
    4-channel quads (64 of 8x8), the weight-gradient rows with their updates (fused, each row in
    its thread's copy)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.Conv2d(32, 64, 1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=64), nn.ReLU(), nn.Conv2d(64, 64, 1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 5))


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
def test_int8_backward_on_threads_does_not_depend_on_them(momentum):
    rng = np.random.default_rng(3)
    batches = [(rng.normal(size=(2, 3, 32, 32)).astype(np.float32), rng.integers(0, 5, size=2)) for _ in range(2)]
    prog = et.compile(_int8_wide_net(), (batches[0][0],), update=et.Full(), quantize="int8",
                      optimizer=et.SGD(lr=0.05, momentum=momentum))
    runs = _runs(prog, batches)
    _same(runs)
    assert runs[1][0] == [prog.step(x, y) for x, y in batches]  # and the reference's losses, bit for bit


@pytest.mark.parametrize("bad,err", [(0, ValueError), (-2, ValueError), (1.5, TypeError), ("2", TypeError),
                                     (True, TypeError)])
def test_threads_is_validated(bad, err):
    with pytest.raises(err, match="threads must be an int >= 1"):
        check_threads(bad)
    x = np.zeros((1, 1, 8, 8), np.float32)
    with pytest.raises(err, match="threads must be an int >= 1"):
        et.compile(_int8_net(), (x,), backend="c", threads=bad)


def test_threads_default_and_setter(monkeypatch):
    x = np.zeros((1, 1, 8, 8), np.float32)
    prog = et.compile(_int8_net(), (x,))
    monkeypatch.setenv("EDGETRAIN_BLAS_THREADS", "2")
    r = CRunner(prog.compiled, prog.state, flags=OPENMP_CFLAGS)
    assert r.threads == 2
    r.threads = 1
    assert r.threads == 1 and r.rebind(prog.compiled).threads == 1
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        r.threads = 0
    serial = CRunner(prog.compiled, prog.state)  # the default build: serial kernels, the BLAS on the variable's
    assert serial.threads == 2
    with pytest.raises(CBackendError, match="without -fopenmp"):
        serial.threads = 3
    monkeypatch.setenv("EDGETRAIN_BLAS_THREADS", "zero")
    with pytest.raises(ValueError, match="EDGETRAIN_BLAS_THREADS"):
        CRunner(prog.compiled, prog.state)


class _Int8Residual(nn.Module):
    """int8 layers of 12 and 16 channels at 64x64 (2 images): their saturation masks (packed in the forward,
    applied in the backward), bias gradients (12 channels: a block of 8 and 4 more) and the residual qadd
    each span more than ET_PARALLEL_MIN_WORK elements, so those loops run split; the 1x1 input gradients
    run in tiles of their planes."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(12, 16, 1), nn.ReLU(), nn.Conv2d(16, 12, 1))
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 5))

    def forward(self, x):
        x = self.stem(x)
        return self.head(x + self.body(x))


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
def test_int8_masks_bias_gradients_and_adds_on_threads(momentum):
    torch.manual_seed(0)
    rng = np.random.default_rng(5)
    batches = [(rng.normal(size=(2, 3, 64, 64)).astype(np.float32), rng.integers(0, 5, size=2)) for _ in range(2)]
    prog = et.compile(_Int8Residual(), (batches[0][0],), update=et.Full(), quantize="int8",
                      optimizer=et.SGD(lr=0.05, momentum=momentum))
    sizes = {}
    for n in prog.train_graph.nodes:
        if n.op in ("qmask_pack", "qmask_grad", "qconv2d_grad_bias", "qadd"):
            sizes.setdefault(n.op, []).append(n.inputs[0].type.numel)
    assert set(sizes) == {"qmask_pack", "qmask_grad", "qconv2d_grad_bias", "qadd"}, sizes
    assert all(max(v) >= 32768 for v in sizes.values()), sizes  # et_common.h's ET_PARALLEL_MIN_WORK
    runs = _runs(prog, batches)
    _same(runs)
    assert runs[1][0] == [prog.step(x, y) for x, y in batches]  # and the reference's losses, bit for bit
    for k in prog.trainable:  # and its weights
        assert np.array_equal(runs[3][1][k], prog.state[k]), k
    for k, g in prog.gradients(*batches[0]).items():  # and its gradients at those weights
        assert np.array_equal(runs[3][2][k], g), k
