"""Fused int8 ops: a dense convolution (a 1x1 expansion, or a network's first 3x3 conv)
computed one channel block at a time and immediately convolved depthwise, so its full
output is never stored.

``qconv2d_pw_dw(x, w1, b1, w2, b2) -> (y, scratch)`` is, by definition,

    t = qconv2d(x, w1, b1; pw)      # groups 1, any kernel, stride and padding
    y = qconv2d(t, w2, b2; dw)      # depthwise: groups == channels of t == channels of y

with output channel c of y depending only on channel c of t. The kernel (and this
reference) loops over blocks of CHANNEL_BLOCK channels: it computes those channels of t
into a small buffer with the qconv2d reference and convolves them depthwise into the
same channels of y. Each half *is* `qconv2d_ref` on a channel slice, so y is bit-identical
to the two ops in sequence (their accumulators are exact integers either way).

Memory: the op holds x, y and one block of t (N * block * H_t * W_t int8 bytes, 4 KB for
one 64x64 channel) instead of all of t. `block`, the attribute BLOCK (CHANNEL_BLOCK when
absent), is the channels the scratch holds: passes/widen_scratch.py raises it where the
step's peak has room, so a kernel can compute more channels and rows per call. The block
buffer is the op's second output, `scratch`, which nothing reads: liveness, the arena planner,
the reorderer and the reference runtime therefore count it while (and only while) the op
runs, with no special case. The reference returns the last block computed in it.

Attributes are the two layers' qconv2d attributes, flattened under the prefixes "pw_"
and "dw_" (`fuse_attrs` / `split_attrs`), so every value stays a scalar or a tuple: the
IR freezes only lists (a nested dict would stay mutable) and prints attributes one key
at a time.

Forward only: no vjp (the fusion runs after autodiff, on layers whose intermediate no
backward node reads). Cost: the MACs of both convolutions; bytes touched are the fused
op's operands (the block buffer stays in the working set, it is never written out).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, count_attr, prefix_attrs, register, unprefix_attrs
from .qconv import qconv_infer, qconv2d_ref

#: Channels of the expansion computed (and held in the scratch buffer) per step: one, as
#: the Tiny Training Engine / TinyEngine fused inverted-residual kernels do; the scratch
#: is then a single channel plane, the least memory this fusion can use.
CHANNEL_BLOCK = 1

#: the op's name (passes/fuse.py builds it, passes/stream.py splits it back into two convs)
PW_DW_OP = "qconv2d_pw_dw"
PW, DW = "pw_", "dw_"
#: the attribute giving the expansion channels the scratch holds (CHANNEL_BLOCK when absent)
BLOCK = "block"
#: qconv2d attributes with one entry per output channel (sliced with the channels)
PER_CHANNEL_KEYS = ("w_scales", "mult", "shift")


def fuse_attrs(pw: Mapping[str, Any], dw: Mapping[str, Any]) -> dict:
    """The fused node's attributes from the pointwise and the depthwise qconv2d's."""
    return prefix_attrs({PW: pw, DW: dw})


def split_attrs(a: Mapping[str, Any]) -> tuple[dict, dict]:
    """(pointwise attrs, depthwise attrs) of a fused node: the inverse of `fuse_attrs`."""
    pw, dw = unprefix_attrs(a, PW, DW)
    return pw, dw


def block_of(a: Mapping[str, Any], c: int) -> int:
    """The expansion channels a fused node's scratch holds: its BLOCK attribute (CHANNEL_BLOCK
    when absent), at most the c channels of the expansion."""
    return min(count_attr(a, BLOCK, CHANNEL_BLOCK, PW_DW_OP), c)


def _channel_slice(a: Mapping[str, Any], lo: int, hi: int) -> dict:
    """qconv2d attrs for output channels lo..hi-1 of the layer `a` describes."""
    return {k: (tuple(v[lo:hi]) if k in PER_CHANNEL_KEYS else v) for k, v in a.items()}


def _infer(ts, a):
    x, w1, b1, w2, b2 = ts
    pw, dw = split_attrs(a)
    if int(pw["groups"]) != 1 or pw.get("float_out"):
        raise ValueError(f"qconv2d_pw_dw: the first conv must be dense (groups 1) with an int8 output, "
                         f"got groups={pw['groups']}, float_out={pw.get('float_out')}")
    (t,) = qconv_infer([x, w1, b1], pw)
    c = t.shape[1]
    if int(dw["groups"]) != c or w2.shape[0] != c or dw.get("float_out"):
        raise ValueError(f"qconv2d_pw_dw: the second conv must be depthwise over the {c} channels with an "
                         f"int8 output, got weight {w2}, groups={dw['groups']}, float_out={dw.get('float_out')}")
    (y,) = qconv_infer([t, w2, b2], dw)
    n, _, h, w = t.shape
    return [y, TensorType((n, block_of(a, c), h, w), "int8")]


def qconv2d_pw_dw_ref(x, w1, b1, w2, b2, a) -> tuple[np.ndarray, np.ndarray]:
    """(y, scratch): y = depthwise(pointwise(x)) computed block by block through the one
    block buffer `scratch` (returned holding the last block)."""
    pw, dw = split_attrs(a)
    c = w1.shape[0]
    size = block_of(a, c)
    y: Optional[np.ndarray] = None
    scratch: Optional[np.ndarray] = None
    for lo in range(0, c, size):
        hi = min(lo + size, c)
        block = qconv2d_ref(x, w1[lo:hi], b1[lo:hi], _channel_slice(pw, lo, hi))
        out = qconv2d_ref(block, w2[lo:hi], b2[lo:hi], {**_channel_slice(dw, lo, hi), "groups": hi - lo})
        if y is None or scratch is None:  # the first block: both None
            y = np.empty((out.shape[0], c) + out.shape[2:], dtype=np.int8)
            scratch = np.zeros((block.shape[0], size) + block.shape[2:], dtype=np.int8)
        y[:, lo:hi] = out
        scratch[:, :hi - lo] = block
    assert y is not None and scratch is not None, "a layer has at least one channel"
    return y, scratch


def _cost(node) -> Cost:
    x, w1, _, w2, _ = node.inputs
    y, scratch = node.outputs
    t_numel = scratch.type.numel // scratch.shape[1] * w1.shape[0]
    macs = t_numel * int(np.prod(w1.shape[1:])) + y.type.numel * int(np.prod(w2.shape[1:]))
    return Cost(macs, sum(v.type.nbytes for v in node.inputs) + y.type.nbytes)


register(OpDef(PW_DW_OP, _infer, lambda xs, a: list(qconv2d_pw_dw_ref(xs[0], xs[1], xs[2], xs[3], xs[4], a)),
               cost=_cost, num_inputs=(5, 5), stream_operands=(0,)))

__all__ = ["BLOCK", "CHANNEL_BLOCK", "PW_DW_OP", "block_of", "fuse_attrs", "qconv2d_pw_dw_ref", "split_attrs"]
