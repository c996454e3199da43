"""The per-output-channel float32 factors of the int8 backward and updates (`et_fscale`), stored
as a fit to a table the firmware holds anyway instead of as tables of their own.

A trained int8 layer of O channels needs, per channel, its weight scale w_scale[c] (the input
gradient), x_scale * w_scale[c] (the weight and bias gradients), w_scale[c]^-2 and
(x_scale * w_scale[c])^-2 (QAS, the update's gradient factors): four float32 tables, computed
in float64 by the compiler and rounded to float32 once, 16 bytes a channel beside the forward's
requantization multiplier and shift (mult[c] * 2^(shift[c] - 31) = x_scale * w_scale[c] /
y_scale to 31 bits: quantize/convert.py), which the forward reads anyway. On a Cortex-M they
were a third of the constant tables (mbv2's 49 KB scheme: 44 of 80 KB).

`fscale_decls` stores a factor table v as an et_fscale {base, mult, shift, fix, k, inv_sq,
fix_bits, shift0}: b[c] is the layer's float32 mult[c] * 2^shift[c] (exact: a power-of-two scaling of
mult rounded to float32), or, for a layer without them (a float-output classifier), its weight
scales base[c]; v[c] is the float32 k * b[c] (or k / (b[c] * b[c])) moved by fix[c] units in
the last place, a signed field of 2, 4 or 8 bits (the fewest that hold the table's fixes;
mostly -1, 0 or 1), packed. The C (`et_fscale_at`, et_int8_scales.h) computes the same float32
operations and adds fix[c] to the bit pattern: the result is v[c]'s bits, checked here, channel
by channel, by computing it exactly as C does (numpy float32 arithmetic and int32 -> float32
conversion round to nearest as the C builds do: -ffp-contract=off, no fast-math). The mult and
shift tables are the forward's own (conv_params' literals: backends/c/constpool.py keeps one
copy). A table no fit reproduces (a difference beyond int8, a zero, negative or subnormal
value) is stored whole: {table, 0, 0, 0, 1.0f, 0, 0}, read as 1.0f * v[c] = v[c]. A quarter
byte a channel instead of four; the cost is a conversion and a multiply or two (and a divide
for the squares) per channel and call (the 1x1 input gradient computes its scales once per
block of 64 output channels and image: et_qconv_grad_input_1x1).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ....ops.qfused import split_attrs as split_pw_dw
from .int8_params import c_floats, c_ints, requant_decls

#: the largest correction a fit may need, in units in the last place (an 8-bit field)
MAX_FIX = 127
#: the widths of a packed fix field, narrowest first (a byte holds whole fields)
FIX_BITS = (2, 4, 8)
#: the smallest positive normal float32: below it a C build might flush to zero
FLT_MIN = np.float32(np.finfo(np.float32).tiny)
#: a requantization shift's bound (et_qconv_p: -31..30): 2^shift is a normal float32 (et_pow2f)
MAX_SHIFT = 31


@dataclass(frozen=True, eq=False)
class Base:
    """A per-channel table a factor may be fitted to: the float32 values b[c] the C computes
    from it, and how it is declared (its arrays, as conv_params or the input gradient writes
    them, so the constant pool shares them)."""

    values: np.ndarray
    mult: Optional[tuple] = None  # the forward's requantization multipliers (int32) ...
    shift: Optional[tuple] = None  # ... and shifts (int8): b[c] = float32(mult[c]) * 2^shift[c]
    scales: Optional[tuple] = None  # else the float32 weight scales: b[c] = scales[c]

    def decls(self, ctx, name: str) -> tuple[list[str], str, int]:
        """(declarations, the et_fscale fields base, mult, shift, and its shift0)."""
        if self.mult is not None:
            decls, fields, shift0 = requant_decls(name, self.mult, self.shift)
            return decls, f"0, {fields}", shift0
        return [c_floats(ctx, name + "_b", self.scales)], f"{name}_b, 0, 0", 0


def _requant_base(a) -> Optional[Base]:
    """The base of a layer's requantization multipliers (None for a float-output layer or one
    whose multiplier is zero or out of the float32 range)."""
    if a.get("float_out") or "mult" not in a:
        return None
    mult = np.asarray(a["mult"], dtype=np.int64)
    shift = np.asarray(a["shift"], dtype=np.int64)
    if np.any(mult <= 0) or np.any(np.abs(shift) > MAX_SHIFT):
        return None
    with np.errstate(all="ignore"):
        b = mult.astype(np.float32) * np.ldexp(np.float32(1), shift.astype(np.int32)).astype(np.float32)
    if not _usable(b):
        return None
    return Base(b.astype(np.float32), mult=tuple(int(m) for m in a["mult"]), shift=tuple(int(x) for x in a["shift"]))


#: graph -> (its forward layers' attributes, their bases), kept while the graph lives: every
#: kernel of a program being emitted asks for them
_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _of_graph(graph) -> tuple[list, list]:
    """(forward layers, bases) of `graph`, computed once per graph."""
    got = _LAYERS.get(graph)
    if got is not None:
        return got
    layers = []
    for n in graph.nodes:
        if n.op == "qconv2d_pw_dw":
            layers += split_pw_dw(n.attrs)
        elif n.op == "qstream":
            layers += [b.attrs for b in n.attrs["body"].nodes if b.op == "qconv2d"]
        elif n.op == "qconv2d":
            layers.append(dict(n.attrs))
    scaled = [dict(n.attrs) for n in graph.nodes if "w_scales" in n.attrs]  # input gradients too
    got = _LAYERS[graph] = (layers, _layer_bases(layers + scaled))
    return got


def forward_layers(graph) -> list[dict]:
    """The attributes of every int8 convolution of `graph`'s forward (qconv2d, the fused
    pointwise+depthwise and row-streamed forms), in node order."""
    return _of_graph(graph)[0]


def layer_bases(graph) -> list[Base]:
    """The bases a factor table of `graph` may be fitted to, each once, in node order: every
    layer's requantization multipliers (forward convolutions, the fused pointwise+depthwise and
    row-streamed forms), then every layer's float32 weight scales (input gradients too)."""
    return _of_graph(graph)[1]


def _layer_bases(layers) -> list[Base]:
    requant, scales, seen = [], [], set()
    for a in (a for a in layers if "w_scales" in a):
        base = _requant_base(a)
        if base is not None and (base.mult, base.shift) not in seen:
            seen.add((base.mult, base.shift))
            requant.append(base)
        ws = tuple(a["w_scales"])
        if ws not in seen:
            seen.add(ws)
            scales.append(Base(np.asarray(ws, dtype=np.float32), scales=ws))
    return requant + scales


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


def fscale_decls(ctx, name: str, values, bases: list[Base]) -> list[str]:
    """`static const et_fscale name` (and its tables) reading the float32 `values` per channel:
    fitted to the first of `bases` (layer_bases) that fits, else stored whole."""
    v = np.asarray(values, dtype=np.float32)
    for base in bases:
        if len(base.values) != len(v):
            continue
        got = fit(v, base.values)
        if got is None:
            continue
        k, inv_sq, fix = got
        bits = fix_bits(fix)
        lines, fields, shift0 = base.decls(ctx, name)
        if bits:
            lines.append(c_ints("uint8_t", name + "_f", pack_fix(fix, bits)))
        return lines + [f"static const et_fscale {name} = {{{fields}, {name + '_f' if bits else '0'}, "
                        f"{ctx.c_float(k)}, {int(inv_sq)}, {bits}, {shift0}}};"]
    return [c_floats(ctx, name + "_t", v), f"static const et_fscale {name} = {{{name}_t, 0, 0, 0, 1.0f, 0, 0}};"]
