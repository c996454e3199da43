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


def weight_arg(ctx, v: Value, name: str) -> tuple[list[str], str, str]:
    """How a kernel with a whole-weight form (the C function's name + "_w", which takes the weights'
    pointer and builds the `et_w8` itself) reads the int8 weight `v`: (declarations, the name's
    suffix, the argument). A weight stored whole is passed as its pointer, with no `et_w8` built at
    the call (13-14 bytes of Cortex-M code less a call, net of the forms: 8e3e1cf on the paper's three
    models); a split one as `&name` (weight_decl)."""
    st = ctx.state_of(v)
    if st is None or st.kind != "split":
        return [], "_w", f"(const int8_t *){ctx.ptr(v)}"
    return weight_decl(ctx, v, name), "", f"&{name}"


def whole_rows(ptr: str, shape) -> str:
    """the `et_rows8` of a whole NCHW int8 tensor at `ptr`."""
    n, c, h, w = shape
    return f"et_whole8({ptr}, {c}, {h}, {w})"


#: a packed word: the multiplier's low PACK_MULT_BITS bits (its bit 30 is set and bit 31 clear in every packed
#: multiplier) and, in the top two, the shift less the layer's shift0 (0, 1 or 2) or PACK_ESCAPE: the channel's
#: shift is then in an escape word, (channel << 8) | (shift & 0xFF), stored before the first channel's word
#: (runtime/et_int8_core.h's et_rq_mult_at, et_rq_shift_at)
PACK_MULT_BITS, PACK_ESCAPE = 30, 3
#: the channels an escape word can name (its top 24 bits, bit 31 clear)
PACK_MAX_CHANNELS = 1 << 23


def _pack_plan(mult, shift):
    """(shift0, the escaped channels) of a layer whose requantization packs, else None: every multiplier in
    [2^30, 2^31), shift0 the least of the three consecutive shifts that cover the most channels (the
    lowest such), and the packed words with their escape words fewer bytes than the two arrays (4 bytes a
    channel and an escape each, against 5 a channel)."""
    m, s = np.asarray(mult, dtype=np.int64), np.asarray(shift, dtype=np.int64)
    if (len(m) == 0 or len(m) > PACK_MAX_CHANNELS
            or not np.all((m >= 1 << PACK_MULT_BITS) & (m < 1 << (PACK_MULT_BITS + 1)))):
        return None
    lows = np.unique(s)
    covered = [int(np.sum((s >= lo) & (s < lo + PACK_ESCAPE))) for lo in lows]
    shift0 = int(lows[int(np.argmax(covered))])  # the first (lowest) of the largest
    escaped = [c for c, v in enumerate(s.tolist()) if not shift0 <= v < shift0 + PACK_ESCAPE]
    if 4 * (len(s) + len(escaped)) >= 5 * len(s):
        return None
    return shift0, escaped


def packable(mult, shift) -> bool:
    """Whether a layer's requantization packs into a word a channel (and an escape word for each channel
    whose shift lies outside the layer's three commonest consecutive ones): see _pack_plan."""
    return _pack_plan(mult, shift) is not None


def _i32(w: int) -> int:
    return w - (1 << 32) if w >= 1 << 31 else w


def pack_requant(mult, shift) -> tuple[list[int], int, int]:
    """(the words as int32 values, shift0, the escape words' count) of a packable layer: the escape words,
    last channel first, then a word a channel, the multiplier's low 30 bits and, in the top two, its
    shift less shift0 or PACK_ESCAPE. The C's mult points at the first channel's word (escapes past the
    array's start)."""
    plan = _pack_plan(mult, shift)
    if plan is None:
        raise ValueError("this layer's requantization does not pack (see packable)")
    return _pack_words(mult, shift, *plan)


def _pack_words(mult, shift, shift0: int, escaped: list[int]) -> tuple[list[int], int, int]:
    """pack_requant's result for the layer's plan (_pack_plan)."""
    low = (1 << PACK_MULT_BITS) - 1
    esc = set(escaped)
    words = [(int(m) & low) | ((PACK_ESCAPE if c in esc else int(v) - shift0) << PACK_MULT_BITS)
             for c, (m, v) in enumerate(zip(mult, shift))]
    escapes = [(c << 8) | (int(shift[c]) & 0xFF) for c in reversed(escaped)]
    return [_i32(w) for w in escapes + words], shift0, len(escapes)


def unpack_requant(words, shift0: int, escapes: int = 0) -> tuple[list[int], list[int]]:
    """(multipliers, shifts) of packed words (escape words first): et_rq_mult_at and et_rq_shift_at in
    Python."""
    esc = {(int(w) & 0xFFFFFFFF) >> 8: ((int(w) & 0xFF) ^ 0x80) - 0x80 for w in words[:escapes]}
    u = [int(w) & 0xFFFFFFFF for w in words[escapes:]]
    top = [w >> PACK_MULT_BITS for w in u]
    return ([(w & ((1 << PACK_MULT_BITS) - 1)) | (1 << PACK_MULT_BITS) for w in u],
            [esc[c] if t == PACK_ESCAPE else shift0 + t for c, t in enumerate(top)])


def requant_decls(name: str, mult, shift) -> tuple[list[str], str, int]:
    """The per-channel requantization arrays: `name_m` (int32 multipliers) and `name_s` (int8 shifts), or,
    for a packable layer, `name_m` alone (its escape words, then the packed words: runtime/et_int8_core.h's
    et_rq_mult_at): (their declarations, "name_m, name_s" or "name_m + escapes, 0" for the struct fields
    that point at them, shift0)."""
    plan = _pack_plan(mult, shift)  # planned once: packable's and pack_requant's test
    if plan is not None:
        words, shift0, escapes = _pack_words(mult, shift, *plan)
        at = f"{name}{MULT} + {escapes}" if escapes else f"{name}{MULT}"
        return [c_ints(I32, name + MULT, words)], f"{at}, 0", shift0
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
