"""backends/c/kernel_select.py: model.c names the shapes of its int8 depthwise layers (and their strides),
and whether a dense convolution may take et_gemm_windows_wide; the Cortex-M DSP build compiles the paths of
those only (runtime/et_int8_dw.h, et_int8_gemm.h)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import kernel_select
from edgetrain.backends.c.emit import emit_sources
from edgetrain.backends.c.kernels.int8_params import conv_params

DW_HEADER = Path(kernel_select.__file__).parent / "runtime" / "et_int8_dw.h"
DSP_HEADER = DW_HEADER.with_name("et_int8_dsp.h")
GRAD_HEADER = DW_HEADER.with_name("et_int8_grad.h")


def test_the_bits_are_the_headers():
    text = DW_HEADER.read_text()
    for name, bit in (("K3", kernel_select.DW_K3), ("K5", kernel_select.DW_K5), ("K7", kernel_select.DW_K7),
                      ("KOTHER", kernel_select.DW_KOTHER)):
        assert re.search(rf"^#define ET_DW_{name} {bit}\b", text, re.M), name
    for (k, stride), bit in kernel_select.PLANE_BIT.items():
        assert re.search(rf"^#define ET_DW_P{k}S{stride} {1 << bit}\b", text, re.M), (k, stride)
    assert re.search(rf"^#define ET_K_RGB3 {kernel_select.K_RGB3}\b", DSP_HEADER.read_text(), re.M)
    grad = GRAD_HEADER.read_text()
    assert re.search(rf"^#define ET_DWG_MAX {kernel_select.DWG_MAX}\b", grad, re.M)
    assert re.search(rf"^#define ET_DWG_TAPS {kernel_select.DWG_TAPS}\b", grad, re.M)
    # the scatter form's test in et_qconv_dw_grad_input_fs, with the output sides' bound
    limit = kernel_select.DWG_OUT_MAX
    assert (f"ET_DWG_SCATTER && (P->h > ET_DWG_MAX || P->w > ET_DWG_MAX || khkw > ET_DWG_TAPS || P->ho > {limit} || "
            f"P->wo > {limit})") in grad


def _layer(i, cg, kh, kw, stride=1, c=8, wo=9):
    """A layer's declarations as the int8 kernels write them: a conv of 8 outputs from c channels, groups c / cg."""
    a = {"stride": (stride, stride), "padding": (kh // 2, kw // 2), "dilation": (1, 1), "groups": c // cg,
         "mult": [1 << 30] * 8, "shift": [-1] * 8, "x_zero": -128, "y_zero": -128, "qmin": -128, "qmax": 127}
    return conv_params(None, f"P{i}", (1, c, 9, 9), (8, cg, kh, kw), (1, 8, wo, wo), a)


def _text(layers):
    return "\n".join(["{", *("    " + ln for i, layer in enumerate(layers) for ln in _layer(i, *layer)), "}"])


@pytest.mark.parametrize("layers, bits", [
    ([], 0),
    ([(8, 1, 1), (8, 3, 3), (2, 3, 3)], 0),  # dense and grouped convolutions only
    ([(1, 3, 3), (8, 1, 1)], kernel_select.DW_K3),
    ([(1, 3, 3), (1, 5, 5), (1, 7, 7)], kernel_select.DW_K3 | kernel_select.DW_K5 | kernel_select.DW_K7),
    ([(1, 3, 5), (1, 9, 9), (1, 1, 1)], kernel_select.DW_KOTHER),
])
def test_the_depthwise_layers_shapes(layers, bits):
    assert kernel_select.dw_kernels(_text(layers)) == bits


P = {ks: 1 << b for ks, b in kernel_select.PLANE_BIT.items()}


@pytest.mark.parametrize("layers, bits", [
    ([], 0),
    ([(8, 3, 3, 2), (8, 1, 1)], 0),  # a dense 3x3 at stride 2 is no depthwise plane
    ([(1, 3, 3, 1), (1, 3, 3, 2)], P[3, 1] | P[3, 2]),
    ([(1, 3, 3, 1), (1, 5, 5, 2), (1, 7, 7, 1)], P[3, 1] | P[5, 2] | P[7, 1]),  # proxyless-w0.3: no 3x3 at stride 2
    ([(1, 5, 5, 3), (1, 3, 5, 1), (1, 9, 9, 1)], 0),  # stride 3 and other kernels: the rows
])
def test_the_depthwise_planes_by_kernel_and_stride(layers, bits):
    assert kernel_select.dw_planes(_text(layers)) == bits


@pytest.mark.parametrize("layers, wide", [
    ([], 0),
    ([(1, 3, 3), (8, 1, 1)], 0),  # depthwise and pointwise planes only
    ([(3, 3, 3, 2, 3, 8)], 0),  # the models' first conv: 3x3 over 3 channels, 8 output columns (quads)
    ([(3, 3, 3, 2, 3, 6)], 1),  # 6 columns: the last two in windows
    ([(3, 3, 3, 2, 3, 8), (8, 3, 3)], 1),  # a dense 3x3 over 8 channels
    ([(8, 1, 1, 2)], 1),  # a 1x1 at stride 2 gathers its windows
])
def test_whether_a_dense_convolution_may_take_the_wide_windows(layers, wide):
    assert kernel_select.gemm_windows_wide(_text(layers)) == wide


def _dw(i, side, k=3, stride=1, cg=1):
    """A depthwise (cg 1) or dense layer's declarations over a side x side plane of 8 channels."""
    out = (side + 2 * (k // 2) - k) // stride + 1
    a = {"stride": (stride, stride), "padding": (k // 2, k // 2), "dilation": (1, 1), "groups": 8 // cg,
         "mult": [1 << 30] * 8, "shift": [-1] * 8, "x_zero": -128, "y_zero": -128, "qmin": -128, "qmax": 127}
    return conv_params(None, f"P{i}", (1, 8, side, side), (8, cg, k, k), (1, 8, out, out), a)


@pytest.mark.parametrize("layers, scatter", [
    ([], 0),
    ([(64, 3), (64, 7), (9, 5, 2)], 0),  # the gather form's largest plane side (64) and kernel (7x7)
    ([(65, 3, 2)], 1),  # a side over 64
    ([(9, 9)], 1),  # 81 taps
    ([(200, 3), (64, 3)], 1),
    ([(200, 3, 1, 8)], 0),  # a dense layer: its input gradient is not the depthwise one
])
def test_whether_a_depthwise_layer_needs_the_input_gradients_scatter_form(layers, scatter):
    text = "\n".join(["{", *("    " + ln for i, layer in enumerate(layers) for ln in _dw(i, *layer)), "}"])
    assert kernel_select.dwg_scatter(text) == scatter


class _Net(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, k, 1, k // 2, groups=8), nn.BatchNorm2d(8), nn.ReLU6())
        self.pw = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.pw(self.dw(self.stem(x))).mean((2, 3)))


@pytest.mark.parametrize("k, bits", [(3, kernel_select.DW_K3), (5, kernel_select.DW_K5)])
def test_an_emitted_program_names_its_depthwise_kernels(k, bits):
    torch.manual_seed(0)
    prog = et.compile(_Net(k).eval(), (torch.randn(1, 3, 16, 16),), quantize="int8", update=et.Full(),
                      optimizer=et.SGD(lr=0.01))
    model_c = emit_sources(prog, graphs=("train",))["model.c"]
    assert f"#define ET_DW_KERNELS {bits}\n" in model_c
    # the depthwise layer's plane at stride 1; the stem (3x3 over 3 channels at stride 2, 8 columns) in quads
    assert f"#define ET_DW_PLANES {P[k, 1]}\n" in model_c and "#define ET_GEMM_WINDOWS_WIDE 0\n" in model_c
    assert "#define ET_DWG_SCATTER 0\n" in model_c  # an 8x8 depthwise plane: the gather form
    # before the runtime, and guarded so that a build can pass its own
    assert model_c.index("#ifndef ET_DW_KERNELS") < model_c.index("#define ET_DW_KERNELS") < model_c.index(
        '#include "et_int8_dw.h"')


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_a_large_depthwise_plane_compiles_the_scatter_form_and_trains_as_the_reference():
    """A 70x70 depthwise plane: model.c compiles the input gradient's scatter form, and the C program's
    steps equal the reference's (with the form left out, the gather form's per-row tables would overflow)."""
    from .test_int8 import train_both

    torch.manual_seed(0)
    prog = et.compile(_Net(3).eval(), (torch.randn(1, 3, 140, 140),), quantize="int8", update=et.Full(),
                      optimizer=et.SGD(lr=0.01))
    assert "qconv2d_dw_grad_input" in {n.op for n in prog.train_graph.nodes}
    model_c = emit_sources(prog, graphs=("train",))["model.c"]
    assert "#define ET_DWG_SCATTER 1\n" in model_c
    assert model_c.index("#ifndef ET_DWG_SCATTER") < model_c.index('#include "et_int8_grad.h"')
    rng = np.random.default_rng(0)
    train_both(prog, [(rng.standard_normal((1, 3, 140, 140)).astype(np.float32) * 60, rng.integers(0, 4, 1))
                      for _ in range(2)])
