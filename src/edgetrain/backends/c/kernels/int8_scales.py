"""The per-output-channel float32 factors of the int8 backward and updates (`et_fscale`), stored
as a fit to the layer's weight scales where one holds, instead of as a table of their own.

A trained int8 layer of O channels needs, besides its weight scales w_scale[c] (the input
gradient's WS), up to three more float32 factors per channel: x_scale * w_scale[c] (the weight
and bias gradients), w_scale[c]^-2 and (x_scale * w_scale[c])^-2 (QAS, the update's gradient
factors). They are computed in float64 by the compiler and rounded to float32 once, so in C
they are not exactly k * w or k / (w * w) in float32 arithmetic: a rounding or two apart. On a
Cortex-M they were 4 bytes a channel each, repeated for every trained layer (mbv2's 49 KB
scheme: 31 KB of such tables beside 12 KB of weight scales).

`fscale_decls` stores a factor table v as {base, fix, k, inv_sq, fix_bits}: base the layer's
weight scales (the table the input gradient reads anyway: backends/c/constpool.py keeps one
copy), k a float32 constant, and fix[c] the difference, in units in the last place, between
v[c] and the float32 k * base[c] (or k / (base[c] * base[c])), a signed field of 2, 4 or 8
bits (the fewest that hold the table's fixes; mostly -1, 0 or 1), packed. The C
(`et_fscale_at`, et_int8.h) computes the same float32 operations and adds fix[c] to the bit
pattern: the result is v[c]'s bits, checked here, channel by channel, by computing it exactly
as C does (numpy float32 arithmetic is IEEE single precision, as the C builds are:
-ffp-contract=off, no fast-math). A table no fit reproduces (no weight scales of its length in
the graph, a difference beyond int8, a zero, negative or subnormal value) is stored whole:
{table, 0, 1.0f, 0, 0}, read as 1.0f * v[c] = v[c]. A quarter byte a channel instead of four,
none when every fix is zero; the cost is a multiply (and a divide for the squares) per channel
and call.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ....ops.qfused import split_attrs as split_pw_dw
from .int8_params import c_floats, c_ints

#: the largest correction a fit may need, in units in the last place (an 8-bit field)
MAX_FIX = 127
#: the widths of a packed fix field, narrowest first (a byte holds whole fields)
FIX_BITS = (2, 4, 8)
#: the smallest positive normal float32: below it a C build might flush to zero
FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def weight_scale_tables(graph) -> list[tuple[float, ...]]:
    """Every layer's float32 weight scales in `graph` (forward convolutions, the fused
    pointwise+depthwise and row-streamed forms, input gradients), each once, in node order:
    the bases a factor table may be fitted to."""
    out, seen = [], set()

    def add(attrs):
        ws = attrs.get("w_scales")
        if ws is not None and tuple(ws) not in seen:
            seen.add(tuple(ws))
            out.append(tuple(ws))

    for n in graph.nodes:
        if n.op == "qconv2d_pw_dw":
            for a in split_pw_dw(n.attrs):
                add(a)
        elif n.op == "qstream":
            for b in n.attrs["body"].nodes:
                add(b.attrs)
        else:
            add(n.attrs)
    return out


def _computed(base: np.ndarray, k: np.float32, inv_sq: bool) -> np.ndarray:
    """float32 k * base or k / (base * base), rounded as the C computes it."""
    with np.errstate(all="ignore"):
        return (k / (base * base) if inv_sq else k * base).astype(np.float32)


def _usable(v: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(v)) and np.all(v >= FLT_MIN))


def fit(values, base) -> Optional[tuple[np.float32, bool, np.ndarray]]:
    """(k, inv_sq, fix) with bits(values) = bits(k * base or k / base^2) + fix exactly, |fix| <=
    MAX_FIX, or None when neither form fits."""
    v = np.asarray(values, dtype=np.float32)
    b = np.asarray(base, dtype=np.float32)
    if v.shape != b.shape or v.size == 0 or not _usable(v) or not _usable(b):
        return None
    best, best_key = None, None
    for inv_sq in (False, True):
        ratio = v.astype(np.float64) * b.astype(np.float64) ** 2 if inv_sq else v.astype(np.float64) / b
        k0 = np.float32(np.median(ratio))
        for k in (k0, np.nextafter(k0, np.float32(0)), np.nextafter(k0, np.float32(np.inf))):
            got = _computed(b, k, inv_sq)
            if not np.isfinite(k) or not _usable(got):
                continue
            fix = v.view(np.int32).astype(np.int64) - got.view(np.int32).astype(np.int64)
            if np.abs(fix).max() > MAX_FIX:
                continue
            rebuilt = (got.view(np.int32) + fix.astype(np.int32)).view(np.float32)
            if not np.array_equal(rebuilt.view(np.int32), v.view(np.int32)):  # the C's result, bit for bit
                continue
            key = (fix_bits(fix), np.count_nonzero(fix), inv_sq)  # the fewest bytes, then the fewest fixes
            if best_key is None or key < best_key:
                best, best_key = (k, inv_sq, fix), key
    return best


def fix_bits(fix) -> int:
    """The narrowest field of FIX_BITS holding every fix (0 when all are zero)."""
    lo, hi = int(np.min(fix)), int(np.max(fix))
    if lo == hi == 0:
        return 0
    return next(w for w in FIX_BITS if -(1 << (w - 1)) <= lo and hi < 1 << (w - 1))


def pack_fix(fix, bits: int) -> list[int]:
    """The fixes as `bits`-bit two's complement fields, field c at bit c * bits of the bytes."""
    out = [0] * ((len(fix) * bits + 7) // 8)
    for c, f in enumerate(fix):
        at = c * bits
        out[at // 8] |= (int(f) & ((1 << bits) - 1)) << (at % 8)
    return out


def fscale_decls(ctx, name: str, values, bases) -> list[str]:
    """`static const et_fscale name` (and its tables) reading the float32 `values` per channel:
    fitted to the first of `bases` (weight_scale_tables) that fits, else stored whole."""
    v = np.asarray(values, dtype=np.float32)
    for base in bases:
        if len(base) != len(v):
            continue
        got = fit(v, base)
        if got is None:
            continue
        k, inv_sq, fix = got
        bits = fix_bits(fix)
        lines = [c_floats(ctx, name + "_b", base)]
        if bits:
            lines.append(c_ints("uint8_t", name + "_f", pack_fix(fix, bits)))
        return lines + [f"static const et_fscale {name} = {{{name}_b, {name + '_f' if bits else '0'}, "
                        f"{ctx.c_float(k)}, {int(inv_sq)}, {bits}}};"]
    return [c_floats(ctx, name + "_t", v), f"static const et_fscale {name} = {{{name}_t, 0, 1.0f, 0, 0}};"]
