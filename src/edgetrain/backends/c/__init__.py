"""The C backend: a compiled training program as portable C (one static arena, weights as
arrays, constant-shape kernels), built and run on the host or as microcontroller firmware.

    from edgetrain.backends.c.export import emit_c
    emit_c(prog, out_dir, target="host", samples=())   # write the project
    et.compile(model, (x,), ..., backend="c")             # a Program run by the host build
"""
from __future__ import annotations

from ...devices.targets import FIRMWARE_TARGETS, TARGETS as _REGISTRY
from .layout import CBackendError

#: the emit targets, from the target registry (devices/targets.py); the firmware ones
#: (Cortex-M and RISC-V) are built by backends/c/cortexm.py
CORTEX_M_TARGETS = tuple(name for name in FIRMWARE_TARGETS if _REGISTRY[name].backend == "cortex-m")
TARGETS = tuple(_REGISTRY)

__all__ = ["CBackendError", "CORTEX_M_TARGETS", "FIRMWARE_TARGETS", "TARGETS"]
