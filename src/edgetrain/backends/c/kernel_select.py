"""Which kernel paths a program needs, told to the runtime headers before model.c includes them.

A microcontroller's runtime is compiled into the program (model.c includes the headers), so a
kernel's paths for shapes the program never has cost flash and nothing else. The int8 depthwise
convolution of the Cortex-M DSP build (runtime/et_int8_dw.h) has paths for 3x3, 5x5, 7x7 and
other kernels, each inlined several times; `definitions` names the shapes of the program's
depthwise layers (ET_DW_KERNELS), read from their `et_qconv_p` descriptors in model.c's text
(kernels/int8_params.conv_params writes every one as a constant table: constpool.DECL), and the header compiles the paths of those
only. A layer whose shape the set lacks takes the general convolution (et_qconv_dw_ok), so a
wrong set would cost time, never results. Likewise ET_DW_PLANES names the (kernel, stride) pairs of
the 3x3, 5x5 and 7x7 depthwise layers, whose whole-plane loops (et_dw3_plane_s1 ... et_dw7_plane_s2)
are compiled for those pairs only (a layer of another pair takes the rows), and ET_GEMM_WINDOWS_WIDE
says whether a dense convolution (not a pointwise plane) may take et_gemm_windows_wide
(runtime/et_int8_gemm.h): not when every one is a 3x3 over 3 channels (ET_K_RGB3's inputs) with a
multiple of 4 output columns, which et_gemm_windows_quads computes whole; 0 sends the others to the
general path. Each is guarded by `#ifndef`: a build may pass its own (-DET_DW_KERNELS=...). Targets
without the DSP extension ignore them. ET_DWG_SCATTER, on every target, says whether a depthwise layer
is too large for the float backward's gather form of its input gradient (runtime/et_int8_grad.h's
et_qconv_dw_grad_input_fs): only then is the scatter form compiled. Unlike the others it has no slower
path to fall back on, so it is set from every depthwise descriptor of model.c (the input gradient's
descriptor has the forward layer's geometry), never from a guess about which layers train.
"""
from __future__ import annotations

from .constpool import DECL

#: runtime/et_int8_dw.h's ET_DW_K3, ET_DW_K5, ET_DW_K7 and ET_DW_KOTHER
DW_K3, DW_K5, DW_K7, DW_KOTHER = 1, 2, 4, 8
#: runtime/et_int8_dw.h's plane bits: ET_DW_P<k>S<s> = 1 << PLANE_BIT[(k, s)]
PLANE_BIT = {(3, 1): 0, (3, 2): 1, (5, 1): 2, (5, 2): 3, (7, 1): 4, (7, 2): 5}
#: runtime/et_int8_dsp.h's ET_K_RGB3 (3 x 3 x 3 inputs padded to words) and the inputs it is padded from
K_RGB3, RGB3_INPUTS = 28, (27, 28)


#: runtime/et_int8_grad.h's ET_DWG_MAX (the gather form's largest plane side) and ET_DWG_TAPS (its largest
#: kernel), and the largest output side it takes (its positions are int8_t)
DWG_MAX, DWG_TAPS, DWG_OUT_MAX = 64, 49, 127


def dw_kernel(kh: int, kw: int) -> int:
    """A depthwise kernel's bit (et_int8_dw.h's et_dw_kernel)."""
    if kh != kw:
        return DW_KOTHER
    return {3: DW_K3, 5: DW_K5, 7: DW_K7}.get(kh, DW_KOTHER)


def _convs(c_text: str):
    """The fields of each et_qconv_p descriptor of `c_text` (et_int8_core.h's order: n, c, h, w, o, cg, kh,
    kw, ho, wo, sh, sw, ph, pw, dh, dw, groups, ...) as a dict of those names."""
    names = ("n", "c", "h", "w", "o", "cg", "kh", "kw", "ho", "wo", "sh", "sw", "ph", "pw", "dh", "dw", "groups")
    for ctype, _, _, init in DECL.findall(c_text):
        if ctype == "et_qconv_p":
            yield dict(zip(names, (int(f) for f in init.strip("{}").split(",")[:len(names)])))


def dw_kernels(c_text: str) -> int:
    """The bits of the depthwise layers' kernels (cg == 1, as et_qconv_dw_ok) among the descriptors of `c_text`."""
    bits = 0
    for p in _convs(c_text):
        if p["cg"] == 1:
            bits |= dw_kernel(p["kh"], p["kw"])
    return bits


def dw_planes(c_text: str) -> int:
    """The plane bits (PLANE_BIT) of the depthwise layers' square 3x3, 5x5 and 7x7 kernels at stride 1 or 2."""
    bits = 0
    for p in _convs(c_text):
        if p["cg"] == 1 and p["kh"] == p["kw"] and (p["kh"], p["sw"]) in PLANE_BIT:
            bits |= 1 << PLANE_BIT[(p["kh"], p["sw"])]
    return bits


def gemm_windows_wide(c_text: str) -> int:
    """1 if a convolution that is neither depthwise nor a pointwise plane (1x1, no padding, stride 1 across)
    may take et_gemm_windows_wide: any but a 3x3 over 3 channels whose output rows are whole quads."""
    for p in _convs(c_text):
        plane = p["kh"] == p["kw"] == 1 and p["ph"] == p["pw"] == 0 and p["sw"] == 1
        if p["cg"] > 1 and not plane and not (p["cg"] * p["kh"] * p["kw"] in RGB3_INPUTS and p["wo"] % 4 == 0):
            return 1
    return 0


def dwg_scatter(c_text: str) -> int:
    """1 if a depthwise layer (cg == 1) among the descriptors of `c_text` is too large for the input gradient's
    gather form (et_qconv_dw_grad_input_fs): a plane side over DWG_MAX, over DWG_TAPS taps, or an output side
    over DWG_OUT_MAX."""
    for p in _convs(c_text):
        if p["cg"] == 1 and (p["h"] > DWG_MAX or p["w"] > DWG_MAX or p["kh"] * p["kw"] > DWG_TAPS
                             or p["ho"] > DWG_OUT_MAX or p["wo"] > DWG_OUT_MAX):
            return 1
    return 0


def _names(bits: int) -> str:
    names = [n for b, n in ((DW_K3, "3x3"), (DW_K5, "5x5"), (DW_K7, "7x7"), (DW_KOTHER, "other")) if bits & b]
    return ", ".join(names) or "none"


def _plane_names(bits: int) -> str:
    return ", ".join(f"{k}x{k} s{s}" for (k, s), b in PLANE_BIT.items() if bits >> b & 1) or "none"


def definitions(c_text: str) -> list[str]:
    """model.c's lines naming the kernel paths the program's code `c_text` needs."""
    bits, planes, wide, scatter = dw_kernels(c_text), dw_planes(c_text), gemm_windows_wide(c_text), dwg_scatter(c_text)
    return ["#ifndef ET_DW_KERNELS /* the depthwise kernels the layers have (backends/c/kernel_select.py): "
            f"{_names(bits)} */",
            f"#define ET_DW_KERNELS {bits}",
            "#endif",
            f"#ifndef ET_DW_PLANES /* their whole-plane loops by kernel and stride: {_plane_names(planes)} */",
            f"#define ET_DW_PLANES {planes}",
            "#endif",
            "#ifndef ET_GEMM_WINDOWS_WIDE /* a dense convolution other than a 3x3 over 3 channels in quads: "
            f"{'yes' if wide else 'no'} */",
            f"#define ET_GEMM_WINDOWS_WIDE {wide}",
            "#endif",
            "#ifndef ET_DWG_SCATTER /* a depthwise layer too large for the input gradient's gather form: "
            f"{'yes' if scatter else 'no'} */",
            f"#define ET_DWG_SCATTER {scatter}",
            "#endif"]
