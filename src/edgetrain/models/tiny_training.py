"""The paper's int8 ImageNet-pretrained MCU models (mbv2-w0.35, mcunet-5fps, proxyless-w0.3).

`from_tiny_training(path, num_classes=1000)` reads one of the files in the assets'
tiny-training/ folder (a torch.save zip whose data.pkl holds plain Python and numpy; read
with bounded sizes and a restricted unpickler, never a plain pickle load:
tiny_training_reader.py) and returns a float PyTorch module that computes what the int8
model computes, up to rounding: weights w_scale * w, biases x_scale * w_scale * b, ReLU6
where the output range is [0, 6]. The published integers and scales ride along (attribute
`edgetrain_int8_spec`), so `compile(..., quantize="int8")` runs exactly them. Input: RGB
float32 NCHW pixel values 0..255 (the int8 input is pixel - 128).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn

from ..quantize import SPEC_ATTR, LayerSpec, QParams
from .tiny_training_reader import MAX_MEMBER_BYTES, ModelFileError, load_tiny_training  # noqa: F401 (public)

#: uint8 pixel p enters the int8 network as p - PIXEL_OFFSET
PIXEL_OFFSET = 128
#: an output range [0, hi] with hi within this of 6 is ReLU6 (6/255 scale and zero -128)
RELU6_TOLERANCE = 0.05


def _qparams(p: dict, which: str) -> QParams:
    scale = float(p[f"{which}_scale"])
    if not (np.isfinite(scale) and scale > 0):
        raise ModelFileError(f"{which}_scale {scale} is not a positive number")
    return QParams(scale, int(p[f"{which}_zero"]))


def _activation(y: QParams) -> Optional[nn.Module]:
    lo, hi = y.real_range
    if lo != 0.0:
        return None
    return nn.ReLU6() if abs(hi - 6.0) < RELU6_TOLERANCE else nn.ReLU()


class QConvLayer(nn.Module):
    """A conv with bias (batch norm folded) and the activation its int8 output clamp implies."""

    def __init__(self, spec: dict):
        super().__init__()
        p = spec["params"]
        w = np.asarray(p["weight"])
        k = tuple(spec["kernel_size"]) if isinstance(spec["kernel_size"], (tuple, list)) else (spec["kernel_size"],) * 2
        _check_conv(w, k, spec["groups"], spec["stride"])
        self.conv = nn.Conv2d(w.shape[1] * spec["groups"], w.shape[0], k, spec["stride"], (k[0] // 2, k[1] // 2),
                              groups=spec["groups"], bias=True)
        self.x, self.y = _qparams(p, "x"), _qparams(p, "y")
        self.w_int = w.astype(np.int8)
        self.w_scales = np.asarray(p["w_scales"], dtype=np.float32)
        if self.w_scales.shape != (w.shape[0],) or not np.all(np.isfinite(self.w_scales)):
            raise ModelFileError(f"a conv's w_scales {self.w_scales.shape} are not {w.shape[0]} finite numbers")
        self.b_int = np.asarray(p["bias"], dtype=np.int32)
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            weight = self.w_int.astype(np.float32) * self.w_scales.reshape(-1, 1, 1, 1)
            bias = (self.b_int * (self.x.scale * self.w_scales.astype(np.float64))).astype(np.float32)
        if not (np.all(np.isfinite(weight)) and np.all(np.isfinite(bias))):
            raise ModelFileError("a conv's scales make its real weights overflow float32")
        with torch.no_grad():
            self.conv.weight.copy_(torch.from_numpy(weight))
            self.conv.bias.copy_(torch.from_numpy(bias))
        self.act = _activation(self.y) or nn.Identity()

    def forward(self, x):
        return self.act(self.conv(x))

    def layer_spec(self) -> LayerSpec:
        return LayerSpec(self.w_int, self.w_scales, self.b_int, self.x, self.y)


def _check_conv(w: np.ndarray, kernel: tuple, groups, stride) -> None:
    """The conv's weight array fixes its size: a kernel or group count that disagrees (which
    would make nn.Conv2d allocate whatever they say) is a malformed file."""
    if w.ndim != 4 or kernel != w.shape[2:]:
        raise ModelFileError(f"a conv's kernel {kernel} does not match its weights {w.shape}")
    for name, v in (("groups", groups), ("stride", stride)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelFileError(f"a conv's {name} is {v!r}, not a positive int")


class TinyTrainingBlock(nn.Module):
    def __init__(self, spec: dict):
        super().__init__()
        self.pointwise1 = QConvLayer(spec["pointwise1"]) if spec["pointwise1"] is not None else None
        self.depthwise = QConvLayer(spec["depthwise"])
        self.pointwise2 = QConvLayer(spec["pointwise2"])
        self.residual = spec["residual"] is not None
        if spec.get("se") is not None:
            raise ModelFileError("squeeze-and-excitation blocks are not supported")

    def forward(self, x):
        y = self.pointwise1(x) if self.pointwise1 is not None else x
        y = self.pointwise2(self.depthwise(y))
        return x + y if self.residual else y


class TinyTrainingNet(nn.Module):
    """first_conv -> blocks -> [feature_mix] -> global average pool -> classifier (Linear)."""

    def __init__(self, d: dict, num_classes: int, seed: int):
        super().__init__()
        self.first_conv = QConvLayer(d["first_conv"])
        self.blocks = nn.Sequential(*[TinyTrainingBlock(b) for b in d["blocks"]])
        self.feature_mix = QConvLayer(d["feature_mix"]) if d.get("feature_mix") else None
        cp = d["classifier"]["params"]
        w = np.asarray(cp["weight"])
        self.classifier = nn.Linear(w.shape[1], num_classes)
        self.input = self.first_conv.x
        self._classifier_spec = None
        if num_classes == w.shape[0]:
            w_scales = np.asarray(cp["w_scales"], dtype=np.float32)
            x = _qparams(cp, "x")
            w2 = w.reshape(w.shape[0], -1).astype(np.int8)
            with torch.no_grad():
                self.classifier.weight.copy_(torch.from_numpy(w2.astype(np.float32) * w_scales[:, None]))
                self.classifier.bias.copy_(torch.from_numpy((np.asarray(cp["bias"]) * (x.scale * w_scales.astype(
                    np.float64))).astype(np.float32)))
            self._classifier_spec = LayerSpec(w2, w_scales, np.asarray(cp["bias"], dtype=np.int32), x,
                                              _qparams(cp, "y"))
        else:
            gen = torch.Generator().manual_seed(seed)
            bound = 1.0 / np.sqrt(w.shape[1])  # PyTorch's default Linear init, from a local generator
            with torch.no_grad():
                self.classifier.weight.uniform_(-bound, bound, generator=gen)
                self.classifier.bias.uniform_(-bound, bound, generator=gen)

    def forward(self, x):
        x = (x - (PIXEL_OFFSET + self.input.zero)) * self.input.scale
        x = self.blocks(self.first_conv(x))
        if self.feature_mix is not None:
            x = self.feature_mix(x)
        return self.classifier(x.mean((2, 3)))

    def int8_spec(self) -> dict[str, LayerSpec]:
        spec = {f"{name}.conv.weight": m.layer_spec() for name, m in self.named_modules() if isinstance(m, QConvLayer)}
        if self._classifier_spec is not None:
            spec["classifier.weight"] = self._classifier_spec
        return spec


def from_tiny_training(path, num_classes: int = 1000, *, seed: int = 0) -> TinyTrainingNet:
    """One of the paper's int8 models as a float module (eval mode) carrying its published
    int8 parameters. With `num_classes` other than the file's, the classifier is a new
    one (PyTorch's default init from `seed`) to train for the downstream task."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    d = load_tiny_training(path)
    try:
        net = TinyTrainingNet(d, num_classes, seed).eval()
        object.__setattr__(net, SPEC_ATTR, net.int8_spec())
    except ModelFileError as err:
        raise ModelFileError(f"{path}: {err}") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError, OverflowError) as err:
        raise ModelFileError(f"{path} is not a tiny-training model: {type(err).__name__}: {err}") from None
    return net
