"""The host library's dense convolutions on oneDNN (backends/c/blas.py dnnl(), runtime/et_float_dnnl.h).

With the smallest convolution on oneDNN set to 0 multiply-adds (et_dnnl_tune, in place of
ET_DNNL_MIN_MACS), every one-group convolution that is not a 1x1 at stride 1 runs on oneDNN:
its forward (with and without bias), input gradient and weight gradient, alone or fused with the update
(conv2d_grad_weight_update, in blocks of rows: et_float_fused.h). Gradients, a few training steps and
the state after them agree with the reference runtime on convolutions of every geometry test_blas.py
runs through the GEMM path (strided, padded, dilated, rectangular, "valid", padding beyond the kernel's
reach, 1x1 at stride 2, several images per batch) and on small planes of many channels, whole or in
pieces of channels, and the library reports a primitive made for each convolution and kind it should
have taken. The threaded library, whose threads run the pieces (each on one thread), gives the same
bits on 1 and 2 threads. With the default threshold, small convolutions keep the GEMM path.

The settings (the smallest convolution, the pieces' channels, the weight gradients' pieces, their blocks) are
set at run time in each program's own library (et_dnnl_tune, which replaces the ET_DNNL_* macros' values): the
tests build two libraries, the serial one (test_blas's FAST) and the threaded one, not one per setting."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from torch import nn

from edgetrain.backends.c import blas
from edgetrain.backends.c.host import OPENMP_CFLAGS, PROJECT_CFLAGS, SANITIZE_CFLAGS
from edgetrain.ops.qgradupdate import split_attrs
from tests.backends.c.test_blas import (FAST, PORTABLE, Blocks, Convs, SamePlanes, StrideOne, _agrees, _programs,
                                        checked_is_raw_and_refuses_overflow, close, fuse_every_update)

pytestmark = pytest.mark.skipif(blas.dnnl() is None or blas.library_blas() is None,
                                reason="oneDNN (pip install onednn-cpu-gomp onednn-devel-cpu-gomp) or a BLAS missing")

#: the threaded library's flags (at -O1, as FAST)
THREADED = tuple(f for f in OPENMP_CFLAGS if f != "-O3") + ("-O1",)
#: et_dnnl_tune's arguments (min_macs, piece, gw_piece, gw_blocks; -1 keeps the macro's): every dense convolution
#: but the 1x1 at stride 1 on oneDNN, in the library's own pieces
ALL = (0.0, -1, -1, -1)
#: ... in pieces of 4 channels wherever the split channels are a multiple of 4 (8, 12, 16, 24, 40, 48, 64,
#: 96 here; 3, 6 and 10 run whole)
SPLIT = (0.0, 4, -1, -1)


def tune(c, min_macs: float = 0.0, piece: int = -1, gw_piece: int = -1, gw_blocks: int = -1):
    """c with its library's oneDNN settings set (et_dnnl_tune) before its first convolution, and the Winograd
    path (et_float_wino.h, tests/backends/c/test_wino.py) off: every 3x3 stride-1 convolution on oneDNN too."""
    assert c.runner._lib.et_dnnl_tune(ctypes.c_double(min_macs), piece, gw_piece, gw_blocks) == 1
    assert c.runner._lib.et_wino_tune(0, 0) == 1
    return c


def programs(batch: int, flags, tuning, net, size):
    """test_blas's _programs, the C program's library set to `tuning` (et_dnnl_tune's arguments)."""
    ref, c, x, y = _programs(batch, flags, net, size)
    return ref, tune(c, *tuning), x, y


def threaded(piece: int) -> tuple:
    """The threaded library's settings: every dense convolution but the 1x1 at stride 1 on oneDNN in pieces
    of `piece` channels (its weight gradients in pieces of piece / 2, as ET_DNNL_GW_PIECE's default)."""
    return (0.0, piece, -1, -1)


class Deep(nn.Module):
    """Convolutions whose weights outnumber their inputs' elements 16 times and more, on planes of 4x4
    to 2x2 (ResNet's last stage at batch 8)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(),  # 8x8 -> 4x4
            nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),  # -> 2x2: 64 x 9 weights per input element of 4, and more
            nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(64, 48, (2, 1), 1, 0, bias=False),
            nn.Flatten(), nn.Linear(48 * 1 * 2, 7))

    def forward(self, x):
        return self.body(x)


def _dense(net) -> list[nn.Conv2d]:
    """The convolutions oneDNN takes at ET_DNNL_MIN_MACS=0: one group, not a 1x1 at stride 1 unpadded."""
    return [m for m in net.modules() if isinstance(m, nn.Conv2d) and m.groups == 1
            and not (m.kernel_size == (1, 1) and m.stride == (1, 1) and m.padding == (0, 0))]


def _primitives(c) -> int:
    return c.runner._lib.et_dnnl_primitives()


def test_the_flags_select_onednn_on_top_of_the_blas_only():
    assert blas.DNNL_FLAG in FAST and blas.DNNL_FLAG in OPENMP_CFLAGS
    assert any("libdnnl" in f for f in blas.link_flags(FAST))
    assert "oneDNN" in blas.describe(FAST)
    for flags in (PROJECT_CFLAGS, SANITIZE_CFLAGS, PORTABLE):  # emitted projects, the sanitizer build, no BLAS
        assert blas.DNNL_FLAG not in flags and blas.link_flags(flags) == ()


def test_its_flag_without_the_blas_is_ignored():
    """A build that takes the BLAS's flags out and leaves -DET_DNNL (tests/quantize/test_frozen_weights.py's
    portable build) compiles the portable kernels and links nothing of oneDNN."""
    flags = PORTABLE + (blas.DNNL_FLAG,)
    assert blas.link_flags(flags) == ()
    ref, c, x, y = _programs(3, flags, Convs, 21)
    assert c.runner.kernels.startswith("portable")
    _agrees(ref, c, x, y, steps=1)


def test_the_environment_leaves_it_out(monkeypatch):
    monkeypatch.setenv(blas.DNNL_ENV, "0")
    assert blas.dnnl() is None and blas.DNNL_FLAG not in blas.compile_flags()
    assert blas.library_blas() is None or blas.BLAS_FLAG in blas.compile_flags()  # the BLAS stays


@pytest.mark.parametrize("net, size, batch, tuning", [
    (Convs, 21, 3, ALL), (Convs, 21, 1, ALL), (StrideOne, 32, 5, ALL), (SamePlanes, 3, 2, ALL), (Blocks, 24, 2, ALL),
    (Deep, 8, 1, ALL), (Deep, 8, 2, ALL),
    (Convs, 21, 3, SPLIT), (StrideOne, 32, 5, SPLIT), (SamePlanes, 3, 2, SPLIT), (Blocks, 24, 2, SPLIT),
    (Deep, 8, 2, SPLIT)])
def test_convolutions_on_onednn_match_the_reference(net, size, batch, tuning):
    """Whole and in pieces (the weights' slices of input channels for the input gradient, strided slices of
    the outputs and of GY: et_float_dnnl.h): one primitive per convolution and kind either way."""
    ref, c, x, y = programs(batch, FAST, tuning, net, size)
    assert "oneDNN" in c.runner.kernels
    _agrees(ref, c, x, y, steps=2)
    # forward and weight gradient of each, the input gradient of each but the first layer's (the input's
    # gradient is not computed)
    assert _primitives(c) == 3 * len(_dense(net())) - 1


@pytest.mark.parametrize("net, size, batch, gw_piece", [(StrideOne, 32, 6, -1), (Deep, 8, 2, -1), (Blocks, 24, 4, -1),
                                                        (StrideOne, 32, 6, 8)])
def test_the_threaded_librarys_groups_of_images_match_the_reference(net, size, batch, gw_piece):
    """The threaded library in pieces of 4 channels (ET_DNNL_SPREAD: 16 pieces wanted): a forward or an input
    gradient of fewer pieces runs in groups of images too (StrideOne at batch 6: groups of 1, 2 and 3 images and
    the whole batch; Deep at batch 2: of 1 image and the whole batch; Blocks at batch 4: of 2 images and the whole
    batch), each group's shared input reordered into a
    slice of its own, one primitive for a group's images; on 2 threads. `gw_piece` 8: the weight gradients in pieces
    of 8 output channels, the others in pieces of 4."""
    ref, c, x, y = programs(batch, THREADED, (0.0, 4, gw_piece, -1), net, size)
    c.runner.threads = 2
    _agrees(ref, c, x, y, steps=2)
    assert _primitives(c) == 3 * len(_dense(net())) - 1


@pytest.mark.parametrize("tuning", [ALL, SPLIT])
def test_the_fused_weight_gradient_and_update_on_onednn(monkeypatch, tuning):
    """Blocks of 36 bytes: every weight gradient here is fused with its update in blocks of rows
    (conv2d_grad_weight_update; the weight and momentum bit for bit the unfused program's in
    tests/passes/test_fuse_float_grad_update.py), and here computed by oneDNN for the whole weight in one
    call, or in pieces of output channels, each piece's rows applied right after it."""
    fuse_every_update(monkeypatch)
    ref, c, x, y = programs(3, FAST, tuning, StrideOne, 32)
    nodes = c.compiled.train_graph.nodes
    fused = [split_attrs(n.attrs)[0] for n in nodes if n.op == "conv2d_grad_weight_update"]
    assert sum(gw["groups"] == 1 for gw in fused) >= len(_dense(StrideOne()))
    assert not [n for n in nodes if n.op == "conv2d_grad_weight" and n.attrs["groups"] == 1]
    _agrees(ref, c, x, y, steps=2)
    # and one more: the grouped convolution's fused gradient runs a group of an image at a time, each a
    # one-group sub-convolution (et_float_fused.h)
    assert _primitives(c) == 3 * len(_dense(StrideOne())) - 1 + 1


@pytest.mark.parametrize("tuning", [ALL, SPLIT])
def test_the_checked_step_applies_each_piece_out_of_place(monkeypatch, tuning):
    """Each piece's gradient rows are applied on its thread right after the piece (et_float_fused.h
    et_dnnl_sgd_piece): in the checked step out of place into the other copies (the step guard), so that
    three checked steps leave the state bit for bit where three raw steps leave a copy; a row of a later piece
    overflowing under a finite loss is named, and the step leaves every state tensor as it was."""
    fuse_every_update(monkeypatch)
    ref, checked, x, y = programs(3, FAST, tuning, StrideOne, 32)
    raw = tune(checked.replace(), *tuning)  # its own library
    name = "body.2.weight"  # 24 output channels: 6 pieces of 4 (SPLIT) or whole; row 21 in the last piece
    checked_is_raw_and_refuses_overflow(checked, raw, x, y, name, f"{name} became non-finite")


class Wide(nn.Module):
    """Convolutions of 16 to 64 channels (ResNet's are multiples of 16): oneDNN sums their weight gradients in its
    blocks of 16 x 16 (AVX-512) or 8 x 8 (AVX2) channels, which the fused update reads as they are
    (et_float_fused.h et_dnnl_sgd_blocks): whole (48 output channels, three groups of 16 rows), in one piece of
    32, in two (64, a rectangular kernel of 15 taps), a 1x1 at stride 2."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(),  # 3 input channels: not in whole blocks
            nn.Conv2d(16, 48, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(48, 32, 3, 2, 1), nn.ReLU(),  # 12x12 -> 6x6
            nn.Conv2d(32, 64, (3, 5), 1, (1, 2), bias=False), nn.ReLU(),
            nn.Conv2d(64, 32, 1, 2), nn.ReLU(),  # -> 3x3
            nn.Flatten(), nn.Linear(32 * 3 * 3, 7))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("threads, gw_piece", [(1, 32), (2, 32), (2, 16)])
def test_the_fused_update_reads_the_gradient_in_onednns_blocks(monkeypatch, threads, gw_piece):
    """A weight gradient that oneDNN sums in its blocks of channels goes to the fused update as it is, which
    makes OIHW rows of it 16 (8) at a time: the losses and the state bit for bit those of the update from rows (et_dnnl_tune's
    gw_blocks 0: every gradient reordered into OIHW rows first), in the checked step (out of place) and the raw one (in place), on
    one thread and on the threaded library's two (a whole convolution's groups of rows split over them, the
    pieces on them); and close to the reference's. The gradients in pieces of `gw_piece` output channels: of 32
    as Wide says, or of 16 (the threaded library's default: every one of Wide's in pieces of 16)."""
    fuse_every_update(monkeypatch)
    flags = FAST if threads == 1 else THREADED
    ref, blocks, x, y = programs(4, flags, (0.0, 32, gw_piece, 1), Wide, 12)
    _, rows, _, _ = programs(4, flags, (0.0, 32, gw_piece, 0), Wide, 12)
    for c in (blocks, rows):
        c.runner.threads = threads
    g = rows.compiled.train_graph
    xin, yin = rows.runner.input_bytes(g, x, training=True), np.ascontiguousarray(rows.runner.label_feed(g, y))
    for step in range(4):
        if step < 2:
            loss = blocks.step(x, y)
            assert loss == rows.step(x, y)
            close(loss, ref.step(x, y))
        else:
            assert blocks.runner.raw_step(xin, yin) == rows.runner.raw_step(xin, yin)
        for k, v in rows.state.items():
            np.testing.assert_array_equal(blocks.state[k], v, err_msg=f"{k} after step {step}")
    # the 48-, 32- and 64-channel convolutions' gradients (the last in two pieces of one primitive) and the 1x1's
    assert blocks.runner._lib.et_dnnl_blocked_gradients() == 4
    assert rows.runner._lib.et_dnnl_blocked_gradients() == 0


def test_small_convolutions_keep_the_gemm_path():
    """At the default threshold (4M multiply-adds) none of Convs' convolutions at batch 1 runs on oneDNN."""
    ref, c, x, y = _programs(1, FAST, Convs, 21)
    _agrees(ref, c, x, y, steps=1)
    assert _primitives(c) == 0


def test_the_settings_are_set_before_the_first_convolution_only():
    """et_dnnl_tune refuses once a primitive is made (the pieces' primitives are kept by shape), and the
    library keeps the settings it ran with; a negative value keeps the macro's."""
    ref, c, x, y = programs(1, FAST, (-1.0, -1, -1, -1), Convs, 21)  # the macros': as untuned
    _agrees(ref, c, x, y, steps=1)
    assert _primitives(c) == 0
    ref, c, x, y = programs(3, FAST, ALL, Convs, 21)
    _agrees(ref, c, x, y, steps=1)
    made = _primitives(c)
    assert made == 3 * len(_dense(Convs())) - 1
    assert c.runner._lib.et_dnnl_tune(ctypes.c_double(1e12), 4, 4, 0) == 0
    _agrees(ref, c, x, y, steps=1)
    assert _primitives(c) == made


@pytest.mark.parametrize("piece, fused", [(32, False), (4, False), (32, True), (4, True)])
def test_the_threaded_library_is_the_same_on_any_thread_count(monkeypatch, piece, fused):
    """Its pieces run on its threads (pieces of 4 channels: StrideOne's 16-, 24-, 40- and 96-channel
    convolutions in 4 to 24 pieces; of 32: the 96-channel one in 3, the others whole); `fused`: every weight
    gradient fused with its update, each piece's rows applied on the piece's thread (a whole one's rows split
    over the threads)."""
    if fused:
        fuse_every_update(monkeypatch)
    runs = []
    for threads in (1, 2):
        ref, c, x, y = programs(5, THREADED, threaded(piece), StrideOne, 32)
        c.runner.threads = threads
        assert fused == any(n.op == "conv2d_grad_weight_update" for n in c.compiled.train_graph.nodes)
        losses = [c.step(x, y) for _ in range(2)]
        runs.append((losses, {k: np.array(v) for k, v in c.state.items()}))
        assert _primitives(c) > 0
    assert runs[0][0] == runs[1][0]
    for k, v in runs[0][1].items():
        assert np.array_equal(v, runs[1][1][k]), k
