"""Core-aten -> IR converters of 3-D and adaptive pooling and of upsampling (they register into
converters.CONVERTERS). ceil_mode of the 3-D pools is handled as aten_layers.py does for 2-D:
the input padded after its end (-inf for max; zeros, window sums and torch's divisors as a
capture-time constant for average). Bicubic and antialiased upsampling are refused."""
from __future__ import annotations

import math

import torch

from .aten_layers import ceil_out
from .converters import Known, aten, const_aware, converts, unsupported

#: spatial dims of a 3-D pool
SPATIAL3 = 3


def _triple(v) -> tuple:
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v) * (SPATIAL3 // len(v))
    return (int(v),) * SPATIAL3


def _floor_out(size, k, s, p, d) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _ceil_extra3(shape, k, s, p, d, ceil_mode) -> tuple:
    """The planes, rows and columns ceil_mode adds after the input (zeros without it)."""
    if not ceil_mode:
        return (0,) * SPATIAL3
    return tuple((ceil_out(shape[2 + i], k[i], s[i], p[i], d[i]) - _floor_out(shape[2 + i], k[i], s[i], p[i], d[i]))
                 * s[i] for i in range(SPATIAL3))


def _batched(e, x):
    """(x as N, C, D, H, W, the shape to give the result back in): an unbatched C, D, H, W
    input gets a batch of one."""
    if len(x.shape) == 5:
        return x, None
    if len(x.shape) != 4:
        unsupported(f"unsupported op: 3-D pooling of a rank-{len(x.shape)} input (C, D, H, W or N, C, D, H, W)")
    return e.emit("reshape", x, shape=(1,) + tuple(x.shape)), True


def _unbatched(e, y, back):
    return y if back is None else e.emit("reshape", y, shape=tuple(y.shape[1:]))


def _pad_after(e, x, extra, value):
    return e.emit("pad", x, before=(0,) * 5, after=(0, 0) + tuple(extra), value=value)


@converts(aten.max_pool3d_with_indices.default)
def _max_pool3d(e, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    x, back = _batched(e, x)
    k = _triple(kernel)
    s = _triple(stride) if stride else k
    p, d = _triple(padding), _triple(dilation)
    extra = _ceil_extra3(x.shape, k, s, p, d, ceil_mode)
    if any(extra):
        x = _pad_after(e, x, extra, -math.inf)
    return _unbatched(e, e.emit("max_pool3d", x, kernel=k, stride=s, padding=p, dilation=d), back), None


@const_aware(aten.avg_pool3d.default)
def _avg_pool3d(e, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None,
                constant=None):
    """ceil_mode=True (when it adds windows): window sums of the input padded after its end
    with zeros, times 1 / torch's divisor per output position (computed with torch on ones)."""
    if isinstance(x, Known):
        x = x.value()
    x, back = _batched(e, x)
    k = _triple(kernel)
    s = _triple(stride) if stride else k
    p = _triple(padding)
    extra = _ceil_extra3(x.shape, k, s, p, (1,) * SPATIAL3, ceil_mode)
    attrs = dict(kernel=k, stride=s, padding=p)
    if not any(extra):
        y = e.emit("avg_pool3d", x, count_include_pad=bool(count_include_pad),
                   divisor_override=int(divisor_override or 0), **attrs)
        return _unbatched(e, y, back)
    xp = _pad_after(e, x, extra, 0.0)
    if divisor_override:
        return _unbatched(e, e.emit("avg_pool3d", xp, count_include_pad=True,
                                    divisor_override=int(divisor_override), **attrs), back)
    if constant is None:
        unsupported("unsupported op: 3-D average pooling with ceil_mode=True outside capture")
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=torch.float64)
    mean = torch.nn.functional.avg_pool3d(ones, k, s, p, ceil_mode=True, count_include_pad=bool(count_include_pad))
    total = torch.nn.functional.avg_pool3d(ones, k, s, p, ceil_mode=True, divisor_override=1)
    sums = e.emit("avg_pool3d", xp, count_include_pad=True, divisor_override=1, **attrs)
    y = e.emit("mul", sums, constant((mean / total)[0, 0].to(getattr(torch, x.dtype))))
    return _unbatched(e, y, back)


def _out_size(output_size) -> tuple:
    oh, ow = (tuple(output_size) * 2)[:2] if len(output_size) == 1 else tuple(output_size)
    return int(oh), int(ow)


@converts(aten.adaptive_max_pool2d.default)
def _adaptive_max(e, x, output_size):
    return e.emit("adaptive_max_pool2d", x, output_size=_out_size(output_size)), None


# --- upsampling -------------------------------------------------------------------------------------
def _upsample(e, x, mode, output_size, scale_factors, align_corners=False, dims=2):
    """The upsample op over the last `dims` dims: torch's output size floor(in * scale) when
    scale factors are given (and their 1 / scale in the source-index arithmetic)."""
    spatial = tuple(x.shape[-dims:])
    if output_size is not None and scale_factors is not None:
        unsupported(f"unsupported op: upsampling ({mode}) with both an output size and scale factors")
    if scale_factors is not None:
        scales = tuple(float(s) for s in scale_factors)
        size = tuple(int(math.floor(spatial[i] * scales[i])) for i in range(dims))
    elif output_size is not None:
        scales, size = (0.0,) * dims, tuple(int(s) for s in output_size)
    else:
        unsupported(f"unsupported op: upsampling ({mode}) without an output size or scale factors")
    return e.emit("upsample", x, mode=mode, size=size, scales=scales, align_corners=bool(align_corners))


def _scales(*given) -> tuple | None:
    """Per-dim scales of a .default overload (None entries: not given) as a .vec's scale_factors."""
    return None if all(s is None for s in given) else tuple(float(s or 0.0) for s in given)


def _sized(e, x, mode, output_size, given, align_corners=False, dims=2):
    """A .default overload: output_size is always there; the scales only steer the index arithmetic."""
    scales = _scales(*given) or (0.0,) * dims
    return e.emit("upsample", x, mode=mode, size=tuple(int(s) for s in output_size), scales=scales,
                  align_corners=bool(align_corners))


@converts(aten.upsample_nearest2d.vec)
def _nearest2d_vec(e, x, output_size, scale_factors):
    return _upsample(e, x, "nearest", output_size, scale_factors)


@converts(aten._upsample_nearest_exact2d.vec)
def _nearest_exact2d_vec(e, x, output_size, scale_factors):
    return _upsample(e, x, "nearest_exact", output_size, scale_factors)


@converts(aten.upsample_bilinear2d.vec)
def _bilinear2d_vec(e, x, output_size, align_corners, scale_factors):
    return _upsample(e, x, "linear", output_size, scale_factors, align_corners)


@converts(aten.upsample_nearest1d.vec)
def _nearest1d_vec(e, x, output_size, scale_factors):
    return _upsample(e, x, "nearest", output_size, scale_factors, dims=1)


@converts(aten._upsample_nearest_exact1d.vec)
def _nearest_exact1d_vec(e, x, output_size, scale_factors):
    return _upsample(e, x, "nearest_exact", output_size, scale_factors, dims=1)


@converts(aten.upsample_linear1d.vec)
def _linear1d_vec(e, x, output_size, align_corners, scale_factors):
    return _upsample(e, x, "linear", output_size, scale_factors, align_corners, dims=1)


@converts(aten.upsample_nearest2d.default)
def _nearest2d(e, x, output_size, scales_h=None, scales_w=None):
    return _sized(e, x, "nearest", output_size, (scales_h, scales_w))


@converts(aten._upsample_nearest_exact2d.default)
def _nearest_exact2d(e, x, output_size, scales_h=None, scales_w=None):
    return _sized(e, x, "nearest_exact", output_size, (scales_h, scales_w))


@converts(aten.upsample_bilinear2d.default)
def _bilinear2d(e, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _sized(e, x, "linear", output_size, (scales_h, scales_w), align_corners)


@converts(aten.upsample_nearest1d.default)
def _nearest1d(e, x, output_size, scales=None):
    return _sized(e, x, "nearest", output_size, (scales,), dims=1)


@converts(aten.upsample_linear1d.default)
def _linear1d(e, x, output_size, align_corners, scales=None):
    return _sized(e, x, "linear", output_size, (scales,), align_corners, dims=1)


@converts(aten.upsample_bicubic2d.vec, aten.upsample_bicubic2d.default, aten._upsample_bilinear2d_aa.vec,
          aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.vec, aten._upsample_bicubic2d_aa.default,
          aten.upsample_trilinear3d.vec, aten.upsample_trilinear3d.default, aten.upsample_nearest3d.vec,
          aten.upsample_nearest3d.default)
def _refused_upsample(e, x, *args, **kwargs):
    unsupported("unsupported op: upsampling other than nearest, nearest-exact, linear and bilinear "
                "(bicubic, antialiased and 3-d modes are not supported)")
