"""The C kernels of the fused weight-gradient updates (runtime/et_float_fused.h,
kernels/float32_fused.py; int8 linear layers: et_int8_grad.h's qconv2d_grad_weight_update)
in whole programs on the host: a float program with an embedding (padding_idx, repeated
and untouched rows), a dense, a grouped and a depthwise convolution and a linear layer
matches the reference runtime within test_float.py's tolerance over several steps, with
and without momentum and weight decay; an int8 program whose Linear weight gradient is
fused through its reshape matches it bit for bit. tests/ops/test_backends.py drives each
kernel on drawn operands against torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import blas
from edgetrain.backends.c.host import to_c_program
from edgetrain.ops import gradupdate
from tests.backends.c.test_float import FAST_CFLAGS, close

FUSED = {"conv2d_grad_weight_update", "linear_grad_weight_update", "embedding_grad_update"}


class TokenConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 8, padding_idx=0)
        self.conv = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False)
        self.dw = nn.Conv2d(8, 8, (3, 1), padding=(1, 0), dilation=(1, 1), groups=8, bias=False)
        self.fc = nn.Linear(8 * 2 * 3, 5)

    def forward(self, t):
        h = self.emb(t).permute(0, 2, 1).reshape(t.shape[0], 8, 4, 6)
        h = torch.relu(self.conv(h))
        return self.fc(torch.relu(self.dw(self.grouped(h))).flatten(1))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 16)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.mark.parametrize("opt", [et.SGD(lr=0.1), et.SGD(lr=0.1, momentum=0.9, weight_decay=1e-2)],
                         ids=["plain", "momentum_wd"])
@pytest.mark.parametrize("batch", [2, 1])
@pytest.mark.parametrize("kernels", ["default", "portable"])
def test_float_fused_updates_match_the_reference(opt, batch, kernels, monkeypatch):
    """Blocks of rows of every kind of et_conv2d_grad_weight_update: one image; several images of one
    group (the portable build's: the BLAS build runs those through one im2col), and of several
    groups (grouped, depthwise)."""
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 3 * 3 * 4 * 2)  # several blocks: rows, groups, depthwise pairs
    torch.manual_seed(0)
    x = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(1))  # rows 40..63 untouched
    x[0, :3] = 0  # padding_idx
    x[1, 4] = x[0, 7] = x[0, 9]  # a row three times
    x, y = x[:batch], np.array([1, 3])[:batch]
    ref = et.compile(TokenConvNet(), (x,), optimizer=opt)
    assert FUSED <= {n.op for n in ref.train_graph.nodes}
    c = to_c_program(ref, FAST_CFLAGS if kernels == "default" else
                     tuple(f for f in FAST_CFLAGS if f not in blas.compile_flags()))
    initial = np.array(ref.state["emb.weight"], copy=True)
    for _ in range(3):
        close(c.step(x, y), ref.step(x, y))
    for k in ref.state:
        close(c.state[k], ref.state[k])
    if not opt.momentum and not opt.weight_decay:  # the padding row and the untouched rows stay as they were
        for rows in (slice(0, 1), slice(40, 64)):
            np.testing.assert_array_equal(c.state["emb.weight"][rows], initial[rows])


def test_int8_linear_fused_through_its_reshape_is_bit_exact():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    y = np.array([4, 11])
    ref = et.compile(SmallCNN().eval(), (x,), quantize="int8", optimizer=et.SGD(lr=0.05, momentum=0.9))
    fused = [n for n in ref.train_graph.nodes if n.op == "qconv2d_grad_weight_update"]
    assert any(n.inputs[2].type.rank == 2 for n in fused), "the Linear's update is fused"
    assert "qconv2d_grad_weight" not in {n.op for n in ref.train_graph.nodes}
    c = to_c_program(ref, FAST_CFLAGS)
    for _ in range(2):
        assert c.step(x, y) == ref.step(x, y)
    for k in ref.state:
        np.testing.assert_array_equal(c.state[k], ref.state[k], err_msg=k)


@pytest.mark.parametrize("batch", [1, 3])
def test_blas_conv_update_over_one_im2col_matches_the_reference(batch, monkeypatch):
    """The host BLAS build's one-group conv2d_grad_weight_update (et_float_fused.h: the batch's im2col
    once, one GEMM per block of rows; with a batch of one the rows of gy read in place) against the
    reference, on convolutions split into blocks of two output rows, padded and strided."""
    if blas.BLAS_FLAG not in FAST_CFLAGS:
        pytest.skip("no host BLAS installed (or EDGETRAIN_BLAS=0)")
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 2 * 8 * 9 * 4)
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(8, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2), nn.ReLU(),
                        nn.Flatten(), nn.Linear(8 * 3 * 3, 4))
    x = torch.randn(batch, 8, 8, 8, generator=torch.Generator().manual_seed(4))
    y = np.arange(batch) % 4
    ref = et.compile(net, (x,), optimizer=et.SGD(lr=0.05, momentum=0.9))
    fused = [n for n in ref.train_graph.nodes if n.op == "conv2d_grad_weight_update"]
    assert len(fused) == 2 and all(int(n.attrs["block"]) < n.inputs[2].type.shape[0] for n in fused)
    c = to_c_program(ref, FAST_CFLAGS)
    for _ in range(3):
        close(c.step(x, y), ref.step(x, y))
    for k in ref.state:
        close(c.state[k], ref.state[k])


@pytest.mark.parametrize("batch", [1, 5])
def test_blas_conv_update_in_column_chunks_matches_the_reference(batch, monkeypatch):
    """et_float_fused.h's column chunks (CH = block * len / O weight columns for all O rows per GEMM)
    where they apply and where they must not: a 1x1 convolution in chunks of one column, a strided
    dilated one whose last chunk is partial, a grouped one (the per-block path), and a first layer
    whose R holds fewer than O floats (CH = 0: the per-block path), batch 1 and 5."""
    if blas.BLAS_FLAG not in FAST_CFLAGS:
        pytest.skip("no host BLAS installed (or EDGETRAIN_BLAS=0)")
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 2 * 9 * 4)
    torch.manual_seed(5)
    net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),  # len 9, block 2: CH 18 / 32 = 0
                        nn.Conv2d(32, 12, 1), nn.ReLU(),  # len 32, block 1: chunks of CH 32 / 12 = 2 columns
                        nn.Conv2d(12, 8, 3, stride=2, dilation=2, padding=2), nn.ReLU(),  # len 108: CH 13, partial
                        nn.Conv2d(8, 8, 3, padding=1, groups=2),  # grouped: never the chunks
                        nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
    x = torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(6))
    y = np.arange(batch) % 4
    ref = et.compile(net, (x,), optimizer=et.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3))
    fused = {tuple(n.inputs[2].type.shape): int(n.attrs["block"]) for n in ref.train_graph.nodes
             if n.op == "conv2d_grad_weight_update"}
    assert fused == {(32, 1, 3, 3): 2, (12, 32, 1, 1): 1, (8, 12, 3, 3): 1, (8, 4, 3, 3): 1}
    c = to_c_program(ref, FAST_CFLAGS)
    for _ in range(3):
        close(c.step(x, y), ref.step(x, y))
    for k in ref.state:
        close(c.state[k], ref.state[k])
