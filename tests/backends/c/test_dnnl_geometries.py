"""Property tests of the host library's convolutions on oneDNN (runtime/et_float_dnnl.h) over drawn
geometries: channels (multiples of the piece or not), kernels, strides, paddings up to the kernel's
size, dilations, groups, bias, images per batch, whole or in pieces of 4 channels, with and without
every weight gradient fused with its update (et_float_fused.h).

test_dnnl.py checks hand-picked networks; here hypothesis draws the convolution, so the right and
bottom paddings oneDNN is given, the pieces' slices and a fused piece's rows meet shapes nobody
picked. Gradients, two steps and the state after them agree with the reference runtime, and the
threaded library gives the same bits on one thread and on two (the settings, as test_dnnl.py's, set at run time:
et_dnnl_tune). Slow (a C build per example): run with
`pytest -m slow`; HYPOTHESIS_PROFILE=explore draws new examples."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

import edgetrain as et
from edgetrain.backends.c import blas
from edgetrain.backends.c.host import to_c_program
from tests.backends.c.test_blas import FAST, _agrees
from tests.backends.c.test_dnnl import ALL, SPLIT, THREADED, fuse_every_update, threaded, tune

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(blas.dnnl() is None or blas.library_blas() is None,
                                 reason="oneDNN (pip install onednn-cpu-gomp onednn-devel-cpu-gomp) or a BLAS missing")]

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@st.composite
def geometries(draw):
    """(batch, conv, input height, input width): a convolution with an output of at least 1x1."""
    g = draw(st.sampled_from([1, 1, 1, 2, 4]))
    c = g * draw(st.sampled_from([1, 3, 4, 8, 17, 32]))
    o = g * draw(st.sampled_from([4, 8, 12, 32, 40, 64]))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, kh)), draw(st.integers(0, kw))
    h, w = draw(st.integers(1, 17)), draw(st.integers(1, 17))
    assume(_out(h, kh, sh, ph, dh) >= 1 and _out(w, kw, sw, pw, dw) >= 1)
    conv = nn.Conv2d(c, o, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups=g, bias=draw(st.booleans()))
    return draw(st.integers(1, 3)), conv, h, w


def _program(batch: int, conv: nn.Conv2d, h: int, w: int):
    """A 1x1 convolution into `conv`, then ReLU and a linear layer: make() compiles it for a Full SGD step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, conv.in_channels, 1), conv, nn.ReLU(), nn.Flatten(), nn.LazyLinear(5))
    x = torch.randn(batch, 3, h, w)
    model(x)  # the linear layer's input size
    model.eval()
    y = np.arange(batch) % 5
    return (lambda: et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.05, momentum=0.9))), x, y


@contextlib.contextmanager
def _drawn(monkeypatch, geometry, fused: bool):
    """_program's (make, x, y) for a drawn geometry; `fused`: every weight gradient fused with its update
    while the block runs."""
    with monkeypatch.context() as m:
        if fused:
            fuse_every_update(m)
        yield _program(*geometry)


@SETTINGS
@given(geometry=geometries(), split=st.booleans(), fused=st.booleans())
def test_drawn_convolutions_on_onednn_match_the_reference(monkeypatch, geometry, split, fused):
    conv = geometry[1]
    with _drawn(monkeypatch, geometry, fused) as (make, x, y):
        ref, c = make(), tune(to_c_program(make(), FAST), *(SPLIT if split else ALL))
        assert fused == any(n.op == "conv2d_grad_weight_update" for n in c.compiled.train_graph.nodes)
        _agrees(ref, c, x, y, steps=2)
        # the drawn convolution's forward and weight gradient at least (its input gradient too where it
        # is not the first layer's; a 1x1 at stride 1 unpadded, a grouped one unfused keep the GEMM path)
        one_by_one = conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.padding == (0, 0)
        if conv.groups == 1 and not one_by_one:
            assert c.runner._lib.et_dnnl_primitives() >= 3


@SETTINGS
@given(geometry=geometries(), piece=st.sampled_from([4, 32]), fused=st.booleans())
def test_drawn_convolutions_are_the_same_on_one_thread_and_two(monkeypatch, geometry, piece, fused):
    with _drawn(monkeypatch, geometry, fused) as (make, x, y):
        runs = []
        for threads in (1, 2):
            c = tune(to_c_program(make(), THREADED, threads=threads), *threaded(piece))
            runs.append(([c.step(x, y) for _ in range(2)], {k: np.array(v) for k, v in c.state.items()}))
        assert runs[0][0] == runs[1][0]
        for k, v in runs[0][1].items():
            np.testing.assert_array_equal(v, runs[1][1][k], err_msg=k)
        _agrees(make(), tune(to_c_program(make(), THREADED, threads=2), *threaded(piece)), x, y, steps=1)
