"""3-D and adaptive pooling, upsampling, pixel (un)shuffle and unfold, captured from torch and
trained: the forward output and every parameter's gradient equal torch.autograd's (a conv
before the layer gets a gradient through it), and the ops the capture chose are the expected ones."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from edgetrain.frontend import capture
from edgetrain.interpreter import run_graph
from edgetrain.frontend.capture import UnsupportedOpError

#: max |ours - torch| / max(|torch|, 1) of outputs and gradients in float32
TOL = 1e-5
CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


class Interp(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.interpolate(x, **self.kw)


#: name -> (spatial dims, layer, input shape, an op the captured graph must hold)
LAYERS = {
    "max_pool3d_ceil": (3, nn.MaxPool3d(2, stride=2, ceil_mode=True), (2, 2, 5, 4, 4), "max_pool3d"),
    "max_pool3d_dil": (3, nn.MaxPool3d((2, 1, 2), stride=1, padding=(1, 0, 0), dilation=(1, 1, 2)),
                       (1, 2, 4, 3, 5), "max_pool3d"),
    "avg_pool3d": (3, nn.AvgPool3d(2, padding=1, count_include_pad=False), (2, 2, 4, 4, 4), "avg_pool3d"),
    "avg_pool3d_ceil": (3, nn.AvgPool3d(2, ceil_mode=True, count_include_pad=False, padding=1), (2, 2, 5, 4, 4),
                        "avg_pool3d"),
    "avg_pool3d_divisor": (3, nn.AvgPool3d(2, stride=1, divisor_override=3), (1, 2, 3, 3, 3), "avg_pool3d"),
    "adaptive_max2d": (2, nn.AdaptiveMaxPool2d((3, 2)), (2, 2, 5, 5), "adaptive_max_pool2d"),
    "adaptive_max1d": (1, nn.AdaptiveMaxPool1d(3), (2, 2, 7), "adaptive_max_pool2d"),
    "adaptive_avg1d": (1, nn.AdaptiveAvgPool1d(3), (2, 2, 7), "adaptive_avg_pool2d"),
    "adaptive_avg2d": (2, nn.AdaptiveAvgPool2d((3, 2)), (2, 2, 5, 5), "adaptive_avg_pool2d"),
    "adaptive_avg2d_divisible": (2, nn.AdaptiveAvgPool2d((2, 2)), (2, 2, 4, 6), "avg_pool2d"),
    "area": (2, Interp(size=(3, 2), mode="area"), (2, 2, 5, 5), "adaptive_avg_pool2d"),
    "nearest2d_scale": (2, nn.Upsample(scale_factor=1.5, mode="nearest"), (2, 2, 4, 4), "upsample"),
    "nearest2d_size": (2, nn.Upsample(size=(7, 5), mode="nearest"), (2, 2, 3, 4), "upsample"),
    "nearest_exact2d": (2, nn.Upsample(scale_factor=1.5, mode="nearest-exact"), (2, 2, 4, 4), "index_select"),
    "bilinear_scale": (2, nn.Upsample(scale_factor=1.7, mode="bilinear"), (2, 2, 4, 4), "upsample"),
    "bilinear_down": (2, Interp(scale_factor=0.6, mode="bilinear"), (2, 2, 5, 5), "upsample"),
    "bilinear_align": (2, nn.Upsample(size=(5, 7), mode="bilinear", align_corners=True), (2, 2, 4, 4), "upsample"),
    "bilinear_recompute": (2, Interp(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
                           (2, 2, 4, 4), "upsample"),
    # nearest-exact, the 1-d modes and bicubic decompose (arange, index, mul) into index_select, mul and add
    "nearest1d": (1, nn.Upsample(scale_factor=2.5, mode="nearest"), (2, 2, 4), "index_select"),
    "linear1d": (1, nn.Upsample(scale_factor=1.7, mode="linear"), (2, 2, 4), "index_select"),
    "linear1d_align": (1, nn.Upsample(size=7, mode="linear", align_corners=True), (2, 2, 4), "index_select"),
    "bicubic": (2, Interp(scale_factor=2, mode="bicubic"), (2, 2, 4, 4), "index_select"),
    "pixel_shuffle": (2, nn.PixelShuffle(2), (2, 8, 2, 2), "permute"),
    "pixel_unshuffle": (2, nn.PixelUnshuffle(2), (2, 2, 4, 4), "permute"),
    "unfold": (2, nn.Unfold(2, padding=1, stride=2), (2, 2, 4, 4), "index_select"),
    "unfold_dilated": (2, nn.Unfold((2, 3), padding=(1, 0), stride=(1, 2), dilation=(2, 1)), (2, 2, 5, 6),
                       "index_select"),
}


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(1.0, float(np.abs(np.asarray(b)).max())))


#: the forms torch decomposes into ops of other families: their checks run with the slow suite
DECOMPOSED = {name for name, (_, _, _, op) in LAYERS.items() if op in ("index_select", "permute")}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in DECOMPOSED else n
                                  for n in sorted(LAYERS)])
def test_layer_trains_as_torch(name):
    torch.manual_seed(0)
    dims, layer, shape, op = LAYERS[name]
    x = torch.randn(shape)
    model = nn.Sequential(CONV[dims](shape[1], shape[1], 3, padding=1), layer, nn.Flatten(), nn.LazyLinear(3))
    model(x)
    y = torch.randn(shape[0], 3)
    prog = et.compile(model, (x,), loss="mse", optimizer=et.SGD(lr=0.1))
    assert op in {n.op for n in prog.forward_graph.nodes}
    ours = prog.gradients(x.numpy(), y.numpy())
    F.mse_loss(model(x), y).backward()
    assert rel(prog.predict(x.numpy()), model(x).detach()) <= TOL
    for k, p in model.named_parameters():
        assert rel(ours[k], p.grad) <= TOL, k


def test_antialiased_upsampling_is_refused_with_the_model_line():
    with pytest.raises(UnsupportedOpError, match="antialiased") as err:
        capture(Interp(scale_factor=0.5, mode="bilinear", antialias=True), (torch.randn(1, 2, 4, 4),))
    assert "test_resample.py" in str(err.value)


@pytest.mark.parametrize("layer", [nn.MaxPool3d(2, stride=2, ceil_mode=True),
                                   nn.AvgPool3d(2, ceil_mode=True, count_include_pad=False, padding=1),
                                   nn.AdaptiveMaxPool2d((2, 3)), nn.AdaptiveAvgPool2d((3, 2))],
                         ids=["max3d", "avg3d", "adaptive_max", "adaptive_avg"])
def test_unbatched_inputs_pool_as_torch(layer):
    x = torch.randn(2, 5, 4, 5)  # C, D, H, W for the 3-D pools; (C, H, W) planes of 2 x 5 for the 2-D ones
    cap = capture(layer, (x,))
    got, _ = run_graph(cap.graph, {**cap.buffers, "input:0": x.numpy()})
    assert rel(got["output"], layer(x)) <= TOL
