"""Which kernel paths a program needs, told to the runtime headers before model.c includes them.

A microcontroller's runtime is compiled into the program (model.c includes the headers), so a
kernel's paths for shapes the program never has cost flash and nothing else. The int8 depthwise
convolution of the Cortex-M DSP build (runtime/et_int8_dw.h) has paths for 3x3, 5x5, 7x7 and
other kernels, each inlined several times; `definitions` names the shapes of the program's
depthwise layers (ET_DW_KERNELS), read from their `et_qconv_p` descriptors in model.c's text
(kernels/int8_params.conv_params writes every one as a constant table: constpool.DECL), and the header compiles the paths of those
only. A layer whose shape the set lacks takes the general convolution (et_qconv_dw_ok), so a
wrong set would cost time, never results. The set is guarded by `#ifndef`: a build may pass its
own (-DET_DW_KERNELS=...). Targets without the DSP extension ignore it.
"""
from __future__ import annotations

from .constpool import DECL

#: runtime/et_int8_dw.h's ET_DW_K3, ET_DW_K5, ET_DW_K7 and ET_DW_KOTHER
DW_K3, DW_K5, DW_K7, DW_KOTHER = 1, 2, 4, 8


def dw_kernel(kh: int, kw: int) -> int:
    """A depthwise kernel's bit (et_int8_dw.h's et_dw_kernel)."""
    if kh != kw:
        return DW_KOTHER
    return {3: DW_K3, 5: DW_K5, 7: DW_K7}.get(kh, DW_KOTHER)


def dw_kernels(c_text: str) -> int:
    """The bits of the depthwise layers' kernels (cg == 1, as et_qconv_dw_ok) among the descriptors of `c_text`."""
    bits = 0
    for ctype, _, _, init in DECL.findall(c_text):
        if ctype != "et_qconv_p":
            continue
        fields = init.strip("{}").split(",")  # n, c, h, w, o, cg, kh, kw, ... (et_int8_core.h's order)
        cg, kh, kw = int(fields[5]), int(fields[6]), int(fields[7])
        if cg == 1:
            bits |= dw_kernel(kh, kw)
    return bits


def _names(bits: int) -> str:
    names = [n for b, n in ((DW_K3, "3x3"), (DW_K5, "5x5"), (DW_K7, "7x7"), (DW_KOTHER, "other")) if bits & b]
    return ", ".join(names) or "none"


def definitions(c_text: str) -> list[str]:
    """model.c's lines naming the kernel paths the program's code `c_text` needs."""
    bits = dw_kernels(c_text)
    return ["#ifndef ET_DW_KERNELS /* the depthwise kernels the layers have (backends/c/kernel_select.py): "
            f"{_names(bits)} */",
            f"#define ET_DW_KERNELS {bits}",
            "#endif"]
