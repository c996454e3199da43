"""The host library's BLAS path (backends/c/blas.py, runtime/et_float_blas.h) and its portable
fallback: both builds of convolutions of every geometry the GEMM path handles (padding, stride,
dilation, 1x1 with and without stride, no bias), depthwise ones (the host's padded-plane kernels:
strided, dilated, of a size not specialised), a grouped one (the direct kernel in both builds)
and dense layers agree with the reference runtime on gradients and on a few training steps, at
batch 1 (results written in place) and at batch 3 (one GEMM over the batch). Where a ReLU decision
lies within float32 rounding of its threshold, a gradient is judged against the float64 reference
too (float_agreement.py; the case of torchvision's resnet50 on the BLAS)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import blas
from edgetrain.backends.c.graph_lib import FAST_CFLAGS
from edgetrain.backends.c.host import DEFAULT_CFLAGS, PROJECT_CFLAGS, SANITIZE_CFLAGS, to_c_program
from edgetrain.ops import gradupdate
from edgetrain.program import NonFiniteLossError
from tests.backends.c.float_agreement import gradient_mismatches

RTOL = 1e-5
#: quicker builds (the numerics do not depend on -O3)
PORTABLE = tuple(f for f in DEFAULT_CFLAGS if f != "-O3" and f not in blas.compile_flags()) + ("-O1",)
#: the BLAS (also blas.default_flags(), unless EDGETRAIN_BLAS=0): graph_lib's quick flags, DEFAULT_CFLAGS less
#: -O3, then -O1, which test_regressions, test_matrix and test_float build with too (the flags' text keys the
#: cached kernel library, kernel_lib.py: one build for all of them)
FAST = FAST_CFLAGS
needs_blas = pytest.mark.skipif(blas.host_blas() is None, reason="no BLAS installed (pip install scipy-openblas32)")


def close(ours, ref, rtol=RTOL):
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    err = float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))
    assert err <= rtol, f"relative error {err:.3g}"


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(),  # strided, padded, bias
            nn.Conv2d(8, 16, 1),  # pointwise
            nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False),  # depthwise
            nn.Conv2d(16, 16, 5, 2, 2, groups=16), nn.ReLU(),  # depthwise, strided (two column phases)
            nn.Conv2d(16, 16, 3, 1, 2, dilation=2, groups=16, bias=False),  # depthwise, dilated
            nn.Conv2d(16, 16, (1, 3), 1, (0, 1), groups=16),  # depthwise, a size not specialised
            nn.Conv2d(16, 12, 3, 1, 2, dilation=2, bias=False), nn.ReLU(),  # dilated
            nn.Conv2d(12, 8, 3, 1, 1, groups=2),  # grouped: direct kernel
            nn.Conv2d(8, 10, 1, 2, bias=False),  # 1x1 stride 2 (a ResNet shortcut)
            nn.Conv2d(10, 6, (3, 2), (2, 1), (0, 1)),  # rectangular, uneven stride and padding
            nn.Flatten(), nn.Linear(6 * 1 * 4, 7))

    def forward(self, x):
        return self.body(x)


class Blocks(nn.Module):
    """Convolutions whose GEMM columns the BLAS path cuts into blocks (et_float_blas.h
    et_block_step: about 1 MiB of im2col or of output per block, at least 2 columns per weight row): output
    rows of one image, several whole images and the rest, one image in place, the whole batch."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 40, 3, 1, 1), nn.ReLU(),  # the whole batch in one block
            nn.Conv2d(40, 120, 1), nn.ReLU(),  # sized by its 120 output rows: 3 images per block, then 2
            nn.Conv2d(120, 40, 1), nn.ReLU(),
            nn.Conv2d(40, 48, 5, 1, 2), nn.ReLU(),  # 1000 x 576 columns per image: 10-row blocks
            nn.Conv2d(48, 64, 3, 2, 1), nn.ReLU(),  # 432 x 144 per image: 4 images per block, then 1
            nn.Conv2d(64, 600, 1), nn.ReLU(),
            nn.Conv2d(600, 200, 1), nn.ReLU(),  # pointwise, 3 images per block (gathered), then 2
            nn.Conv2d(200, 1200, 1), nn.ReLU(),
            nn.Conv2d(1200, 96, 1, bias=False), nn.ReLU(),  # pointwise, one image per block in place
            nn.Conv2d(96, 2048, 1), nn.ReLU(),
            nn.Conv2d(2048, 8, 1),  # pointwise, 10-row blocks in place
            nn.Flatten(), nn.Linear(8 * 12 * 12, 7))

    def forward(self, x):
        return self.body(x)


class StrideOne(nn.Module):
    """Convolutions of vertical stride 1 whose gradients the BLAS path computes, in blocks of one
    image, as kernel-row windows of a one-kernel-row im2col (et_float_blas.h et_row_windows; at
    batch 1 every convolution takes them): whole images ("same", "valid", padding beyond the kernel's reach)
    and blocks of rows (rectangular with uneven padding, dilated); beside those that must not:
    several images per block (at batch 5), one kernel row, stride 2, groups, 1x1."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(),  # batch 5: several images per block
            nn.Conv2d(16, 24, 3, 1, 1), nn.ReLU(),  # "same" (ResNet's 3x3): one whole image per block
            nn.Conv2d(24, 24, 3, 1, 0, bias=False),  # "valid"
            nn.Conv2d(24, 96, (1, 3), 1, (0, 1)), nn.ReLU(),  # one kernel row: the full im2col
            nn.Conv2d(96, 40, (3, 5), 1, (1, 1)),  # rectangular, uneven padding: blocks of 19 rows
            nn.Conv2d(40, 8, 3, 1, 2, dilation=2), nn.ReLU(),  # dilated: blocks of 26 rows
            nn.Conv2d(8, 8, 3, 1, 3),  # padding beyond the kernel's reach
            nn.Conv2d(8, 8, 3, 2, 1), nn.ReLU(),  # stride 2: the full im2col
            nn.Conv2d(8, 8, 3, 1, 1, groups=2),  # grouped: direct kernel
            nn.Conv2d(8, 6, 1),  # pointwise
            nn.Flatten(), nn.Linear(6 * 17 * 16, 7))

    def forward(self, x):
        return self.body(x)


class SamePlanes(nn.Module):
    """Convolutions of strides 1 whose output is as wide as their input, whose im2col rows are one
    copy per kernel tap (et_float_blas.h et_im2col_plane_rows): on a 3x3 plane, a dilation of 4
    (taps whose rows or columns all lie outside it), "same" 3x3 and 1x3, a rectangular 3x5."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, 1, 4, dilation=4), nn.ReLU(),
            nn.Conv2d(8, 8, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(8, 8, (1, 3), 1, (0, 1)),
            nn.Conv2d(8, 6, (3, 5), 1, (1, 2)), nn.ReLU(),
            nn.Flatten(), nn.Linear(6 * 3 * 3, 7))

    def forward(self, x):
        return self.body(x)


class Depthwise(nn.Module):
    """Depthwise convolutions on the host's padded-plane kernels at widths whose weight gradient
    takes register-held column chunks of 16, 8 and 4 and a scalar tail (et_float_gemm.h
    et_dw_gw_chunk), at strides 1 and 2 (constant-stride builds) and kernel sizes 3, 5 and 7."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(8, 8, 3, 1, 1, groups=8), nn.ReLU(),  # 37 columns: 16 + 16 + 4 + 1
            nn.Conv2d(8, 8, 3, 2, 1, groups=8, bias=False),  # stride 2: 19 columns, 16 + 3
            nn.Conv2d(8, 8, 7, 1, 3, groups=8), nn.ReLU(),  # 7x7
            nn.Conv2d(8, 8, 5, 2, 2, groups=8),  # 5x5 stride 2: 10 columns, 8 + 2
            nn.Flatten(), nn.Linear(8 * 10 * 10, 7))

    def forward(self, x):
        return self.body(x)


def _programs(batch: int, flags, net=Convs, size=21):
    torch.manual_seed(0)
    model = net().eval()
    x = torch.randn(batch, 3, size, size)
    y = np.arange(batch) % 7
    make = (lambda: et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.05, momentum=0.9)))
    return make(), to_c_program(make(), flags), x, y


def _agrees(ref, c, x, y, steps: int) -> None:
    """c's gradients, then `steps` steps' losses and the state after them, close to ref's."""
    gr, gc = ref.gradients(x, y), c.gradients(x, y)
    assert set(gr) == set(gc)
    for k in gr:
        close(gc[k], gr[k])
    for _ in range(steps):
        close(c.step(x, y), ref.step(x, y))
    for k in ref.state:
        close(c.state[k], ref.state[k])


def fuse_every_update(monkeypatch) -> None:
    """Blocks of 36 bytes: every weight gradient is fused with its update in blocks of rows
    (conv2d_grad_weight_update)."""
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 3 * 3 * 4)


def checked_is_raw_and_refuses_overflow(checked, raw, x, y, name: str, match: str) -> None:
    """Three checked steps of `checked` leave its state bit for bit where three raw steps leave `raw`'s (a copy
    with its own library); then row 21 of weight `name` set to overflow in its update (-3.3e38, momentum
    3.4e38: w - 0.05 * 0.9 * 3.4e38 < -float32 max) under a finite loss: the checked step raises
    NonFiniteLossError matching `match` and leaves every state tensor as it was."""
    g = raw.compiled.train_graph
    xin, yin = raw.runner.input_bytes(g, x, training=True), np.ascontiguousarray(raw.runner.label_feed(g, y))
    for _ in range(3):
        assert raw.runner.raw_step(xin, yin) == checked.step(x, y)
    for k, v in raw.state.items():
        np.testing.assert_array_equal(checked.state[k], v, err_msg=k)
    checked.state[name][21, 0, 0, 0] = -3.3e38
    checked.state[f"momentum:{name}"][21, 0, 0, 0] = 3.4e38
    saved = {k: v.copy() for k, v in checked.state.items()}
    with pytest.raises(NonFiniteLossError, match=match):
        checked.step(x, y)
    for k, v in saved.items():
        np.testing.assert_array_equal(checked.state[k], v, err_msg=k)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kernels", ["blas", "portable"])
def test_convolutions_and_dense_layers_match_the_reference(batch, kernels):
    if kernels == "blas" and blas.host_blas() is None:
        pytest.skip("no BLAS installed")
    ref, c, x, y = _programs(batch, FAST if kernels == "blas" else PORTABLE)
    assert c.runner.kernels.startswith("BLAS" if kernels == "blas" else "portable")
    _agrees(ref, c, x, y, steps=3)


@needs_blas
@pytest.mark.parametrize("batch", [1, 5])
def test_gemm_blocks_match_the_reference(batch):
    ref, c, x, y = _programs(batch, FAST, Blocks, 24)
    _agrees(ref, c, x, y, steps=1)


@needs_blas
@pytest.mark.parametrize("batch", [1, 3])
def test_depthwise_widths_match_the_reference(batch):
    ref, c, x, y = _programs(batch, FAST, Depthwise, 37)
    _agrees(ref, c, x, y, steps=2)


@needs_blas
@pytest.mark.parametrize("batch", [1, 5])
def test_kernel_row_windows_match_the_reference(batch):
    ref, c, x, y = _programs(batch, FAST, StrideOne, 32)
    _agrees(ref, c, x, y, steps=2)


@needs_blas
def test_the_blas_links_only_where_asked_for():
    assert blas.link_flags(FAST)
    for flags in (PROJECT_CFLAGS, SANITIZE_CFLAGS, PORTABLE):  # emitted projects, sanitizer build, fallback
        assert blas.BLAS_FLAG not in flags and blas.link_flags(flags) == ()
    assert "BLAS" in blas.describe(FAST) and "portable" in blas.describe(PORTABLE)


@needs_blas
def test_the_default_build_takes_the_blas_unless_the_environment_says_0(monkeypatch):
    blas.host_blas.cache_clear()
    try:
        monkeypatch.delenv(blas.ENABLE_ENV, raising=False)
        assert blas.default_flags() == blas.compile_flags() and blas.BLAS_FLAG in blas.default_flags()
        assert blas.BLAS_FLAG in DEFAULT_CFLAGS
        blas.host_blas.cache_clear()
        monkeypatch.setenv(blas.ENABLE_ENV, "0")
        assert blas.default_flags() == ()
    finally:
        monkeypatch.delenv(blas.ENABLE_ENV, raising=False)
        blas.host_blas.cache_clear()


@pytest.mark.skipif(blas.mkl_blas() is None, reason="MKL not installed (pip install mkl)")
def test_mkl_is_the_library_blas_where_installed():
    flags = blas.compile_flags()
    assert blas.library_blas() == blas.mkl_blas() and blas.MKL_FLAG in flags
    assert blas.describe(flags).startswith("BLAS (MKL") and any("libmkl_core" in f for f in blas.link_flags(flags))
    assert blas.host_blas() is None or blas.MKL_FLAG not in blas.host_blas().cflags  # projects: a BLAS with a header


@needs_blas
def test_openblas_is_taken_on_request_and_agrees(monkeypatch):
    """EDGETRAIN_BLAS=openblas: the library links OpenBLAS even where MKL is installed, and its
    results agree with the reference (so both BLAS builds stay tested where both are installed)."""
    if blas.host_blas() is None:
        pytest.skip("OpenBLAS (scipy-openblas32) not installed")
    monkeypatch.setenv(blas.ENABLE_ENV, "openblas")
    assert blas.library_blas() == blas.host_blas() and blas.MKL_FLAG not in blas.compile_flags()
    flags = PORTABLE + blas.compile_flags()
    assert "openblas" in " ".join(blas.link_flags(flags))
    ref, c, x, y = _programs(3, flags)
    assert c.runner.kernels.startswith("BLAS (scipy-openblas32")
    _agrees(ref, c, x, y, steps=1)


def test_disabled_by_environment(monkeypatch):
    blas.host_blas.cache_clear()
    try:
        monkeypatch.setenv(blas.ENABLE_ENV, "0")
        assert blas.host_blas() is None and blas.compile_flags() == () and blas.default_flags() == ()
        assert blas.link_flags(FAST) == ()
    finally:
        monkeypatch.delenv(blas.ENABLE_ENV)
        blas.host_blas.cache_clear()


def _relu_at_its_threshold():
    """A net whose first hidden unit is 2**-30 above the ReLU threshold in float64 and exactly
    on it in float32 (its weight 1 + 2**-30 rounds to 1): the two references take opposite
    sides of the ReLU for any summation order, as resnet50's near-zero element did for two."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 4)).double().eval()
    with torch.no_grad():
        model[0].weight[0] = torch.tensor([1.0 + 2.0 ** -30, 0.0], dtype=torch.float64)
        model[0].bias[0] = -1.0
    x = torch.tensor([[1.0, 0.0], [0.5, 2.0]], dtype=torch.float64)
    y = np.array([1, 3])

    def grads(m, xx):
        return et.compile(m, (xx,), update=et.Full()).gradients(xx.numpy(), y)

    return grads(copy.deepcopy(model).float(), x.float()), grads(model, x)


def test_a_gradient_on_the_float64_side_of_a_relu_threshold_is_accepted():
    ref32, ref64 = _relu_at_its_threshold()
    on64 = {k: v.astype(np.float32) for k, v in ref64.items()}  # a summation order landing on the float64 side
    # the float32 reference alone rejects it (the old rule, which failed resnet50 on the BLAS)
    assert gradient_mismatches(on64, ref32, lambda: [ref32], RTOL)
    assert gradient_mismatches(on64, ref32, lambda: [ref64], RTOL) == {}
    assert gradient_mismatches(on64, ref32, lambda: [ref32, ref64], RTOL) == {}  # one reference that meets it
    assert gradient_mismatches(ref32, ref32, lambda: pytest.fail("float64 reference not needed"), RTOL) == {}
    wrong = dict(on64, **{"0.weight": on64["0.weight"] * np.float32(1.001)})  # a fault: neither reference
    assert set(gradient_mismatches(wrong, ref32, lambda: [ref64, ref32], RTOL)) == {"0.weight"}


@needs_blas
@pytest.mark.parametrize("batch", [1, 5])
def test_plane_rows_im2col_matches_the_reference(batch):
    ref, c, x, y = _programs(batch, FAST, SamePlanes, 3)
    _agrees(ref, c, x, y, steps=1)


#: et_scratch's buffers at sizes from a few floats to past glibc's mmap threshold (128 KB), each slot grown in turn
_SCRATCH_SOURCE = """#include <stdint.h>
#include "et_float_blas.h"
int scratch_misaligned(void) {
    static const size_t n[] = {1, 3, 17, 1000, 40000, 100000, (size_t)1 << 20, (size_t)5 << 20};
    int bad = 0;
    for (int slot = 0; slot < ET_SCRATCH_SLOTS; ++slot)
        for (size_t i = 0; i < sizeof n / sizeof n[0]; ++i) {
            float *p = et_scratch(slot, n[i]);
            if (p) p[n[i] - 1] = 1.f;
            bad += !p || (uintptr_t)p % 64 != 0;
        }
    return bad;
}
"""


@needs_blas
def test_the_scratch_buffers_start_on_a_cache_line(tmp_path):
    """The host kernels' per-thread scratch (et_float_blas.h et_scratch: oneDNN's operands, the GEMM path's
    matrices) starts on a 64-byte boundary whatever its size: malloc's 16 bytes put a vector across two lines."""
    import ctypes
    import subprocess

    from edgetrain.backends.c.emit import RUNTIME_DIR

    (tmp_path / "s.c").write_text(_SCRATCH_SOURCE)
    flags = [f for f in FAST if f != blas.DNNL_FLAG]
    r = subprocess.run(["gcc", *flags, "-shared", "-fPIC", f"-I{RUNTIME_DIR}", "s.c", "-o", "s.so",
                        *blas.link_flags(flags)], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ctypes.CDLL(str(tmp_path / "s.so")).scratch_misaligned() == 0
