"""The C declarations the int8 emitters share (kernels/int8.py, kernels/int8_grad.py): integer
and float arrays as `static const` literals, a layer's `et_qconv_p` with its per-channel
requantization or output scales, an int8 weight read whole or split (`et_w8`), and the block
that scopes a layer's constants. Kept apart so the forward and the backward emitters share
them without importing each other.
"""
from __future__ import annotations

import numpy as np

from ....ir import Value
from ....ops.qconv import out_scales
from ..layout import CBackendError

#: C element type name of the int32 per-channel multipliers
I32 = "int32_t"
#: the name suffixes of a layer's per-channel requantization arrays: int32 multipliers, int8 shifts
#: (backends/c/firmware_flash.py counts the flash they take by these names)
MULT, SHIFT = "_m", "_s"
#: et_qconv_p's scalar fields are int16 (runtime/et_int8.h: 56 bytes of flash a layer, not 96)
INT16_MIN, INT16_MAX = -2 ** 15, 2 ** 15 - 1
#: the zero points and clamp bounds of et_qconv_p, in its order
QUANT_KEYS = ("x_zero", "y_zero", "qmin", "qmax")


# --- literals -------------------------------------------------------------------------------
def c_ints(ctype: str, name: str, values) -> str:
    """`static const ctype name[]` of the integers `values` (INT32_MIN spelt so C reads it)."""
    vals = [int(v) for v in values]
    body = ", ".join("(-2147483647-1)" if v == -2 ** 31 else str(v) for v in vals) or "0"
    return f"static const {ctype} {name}[{max(len(vals), 1)}] = {{{body}}};"


def c_floats(ctx, name: str, values) -> str:
    """`static const float name[]` of `values` (ctx.c_float's exact literals)."""
    body = ", ".join(ctx.c_float(v) for v in values) or "0.0f"
    return f"static const float {name}[{max(len(list(values)), 1)}] = {{{body}}};"


def c_int(v: int) -> str:
    """an int32 literal (INT32_MIN as an expression)."""
    return "(-2147483647-1)" if int(v) == -2 ** 31 else str(int(v))


def numel(shape) -> int:
    """the element count of `shape`."""
    return int(np.prod(shape, dtype=np.int64))


# --- operands -------------------------------------------------------------------------------
def weight_decl(ctx, v: Value, name: str) -> list[str]:
    """Declarations of `et_w8 name` reading the int8 OIHW weight `v` (whole or split)."""
    st = ctx.state_of(v)
    if st is None or st.kind != "split":
        return [f"const et_w8 {name} = {{(const int8_t *){ctx.ptr(v)}, 0, 0, 0, 0, 0, 0}};"]
    ref = ctx.weight(v)
    sel = ref.sel
    size = v.shape[sel.dim]
    pos = {c: k for k, c in enumerate(sel.index)}
    rest = [c for c in range(size) if c not in pos]
    rpos = {c: k for k, c in enumerate(rest)}
    cmap = [pos[c] if c in pos else -rpos[c] - 1 for c in range(size)]
    return [c_ints("int16_t", name + "_map", cmap),
            f"const et_w8 {name} = {{0, (const int8_t *){ref.sram}, (const int8_t *){ref.flash}, {name}_map, "
            f"{sel.dim}, {len(pos)}, {len(rest)}}};"]


def whole_rows(ptr: str, shape) -> str:
    """the `et_rows8` of a whole NCHW int8 tensor at `ptr`."""
    n, c, h, w = shape
    return f"et_whole8({ptr}, {c}, {h}, {w})"


#: a packed word's multiplier bits (its bit 30 set and bit 31 clear in every packed multiplier) and the
#: shift's offset from the layer's least, in the top bits (runtime/et_int8_core.h's et_rq_mult_at)
PACK_MULT_BITS, PACK_SHIFT_SPAN = 30, 3


def packable(mult, shift) -> bool:
    """Whether a layer's requantization packs into a word a channel: every multiplier in [2^30, 2^31) and
    its shifts within PACK_SHIFT_SPAN of the least."""
    m, s = np.asarray(mult, dtype=np.int64), np.asarray(shift, dtype=np.int64)
    return (len(m) > 0 and bool(np.all((m >= 1 << PACK_MULT_BITS) & (m < 1 << (PACK_MULT_BITS + 1))))
            and int(s.max() - s.min()) <= PACK_SHIFT_SPAN)


def pack_requant(mult, shift) -> tuple[list[int], int]:
    """(the packed words as int32 values, shift0) of a packable layer: the multiplier's low 30 bits and the
    shift less shift0, the layer's least, in the top two."""
    shift0 = min(int(v) for v in shift)
    words = [(int(m) & ((1 << PACK_MULT_BITS) - 1)) | ((int(v) - shift0) << PACK_MULT_BITS) for m, v in zip(mult, shift)]
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words], shift0


def unpack_requant(words, shift0: int) -> tuple[list[int], list[int]]:
    """(multipliers, shifts) of packed words: et_rq_mult_at and et_rq_shift_at in Python."""
    u = [int(w) & 0xFFFFFFFF for w in words]
    return ([(w & ((1 << PACK_MULT_BITS) - 1)) | (1 << PACK_MULT_BITS) for w in u],
            [shift0 + (w >> PACK_MULT_BITS) for w in u])


def requant_decls(name: str, mult, shift) -> tuple[list[str], str, int]:
    """The per-channel requantization arrays: `name_m` (int32 multipliers) and `name_s` (int8 shifts), or,
    for a packable layer, `name_m` alone (the packed words; runtime/et_int8_core.h's et_rq_mult_at): (their
    declarations, "name_m, name_s" or "name_m, 0" for the struct fields that point at them, shift0)."""
    if packable(mult, shift):
        words, shift0 = pack_requant(mult, shift)
        return [c_ints(I32, name + MULT, words)], f"{name}{MULT}, 0", shift0
    return [c_ints(I32, name + MULT, mult), c_ints("int8_t", name + SHIFT, shift)], f"{name}{MULT}, {name}{SHIFT}", 0


def conv_params(ctx, name: str, x_shape, w_shape, y_shape, a, groups=None, out_channels=None) -> list[str]:
    """`static const et_qconv_p name` (+ its per-channel arrays) for a qconv2d-like layer."""
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    ho, wo = y_shape[2:]
    s, p, d = a["stride"], a["padding"], a["dilation"]
    g = int(a["groups"] if groups is None else groups)
    lines = []
    q = "0, 0, 0, 0"  # shift0, mult, shift, out_scale
    if "mult" in a and not a.get("float_out"):
        decls, fields, shift0 = requant_decls(name, a["mult"], a["shift"])
        lines += decls
        q = f"{shift0}, {fields}, 0"
    elif a.get("float_out"):
        lines.append(c_floats(ctx, name + "_os", out_scales(a)))
        q = f"0, 0, 0, {name}_os"
    quant = ", ".join(c_int(a.get(k, 0)) for k in QUANT_KEYS)
    fields = (n, c, h, w, o, cg, kh, kw, ho, wo, *s, *p, *d, g) + tuple(int(a.get(k, 0)) for k in QUANT_KEYS)
    if any(not INT16_MIN <= int(f) <= INT16_MAX for f in fields):
        raise CBackendError(f"{name}: a convolution's sizes and zero points must fit et_qconv_p's int16 fields, "
                            f"got {fields}")
    lines.append(f"static const et_qconv_p {name} = {{{n}, {c}, {h}, {w}, {o}, {cg}, {kh}, {kw}, {ho}, {wo}, "
                 f"{s[0]}, {s[1]}, {p[0]}, {p[1]}, {d[0]}, {d[1]}, {g}, {quant}, {q}}};")
    return lines


def block(lines) -> str:
    """`lines` as one C block (its constants scoped to the layer)."""
    return "{\n" + "\n".join("    " + ln for ln in lines) + "\n}"
