"""The C backend: a compiled training program as portable C (one static arena, weights as
arrays, constant-shape kernels), built and run on the host or as microcontroller firmware.

    emit_c(prog, out_dir, target="host", samples=())   # write the project
    et.compile(model, (x,), ..., backend="c")             # a Program run by the host build
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from ...devices.targets import FIRMWARE_TARGETS, TARGETS as _REGISTRY
from .layout import CBackendError

#: the emit targets, from the target registry (devices/targets.py); the firmware ones are
#: built by backends/c/cortexm.py
CORTEX_M_TARGETS = FIRMWARE_TARGETS
TARGETS = tuple(_REGISTRY)


def emit_c(prog, out_dir, target: str = "host", samples: Iterable = (), embed_weights: Optional[bool] = None) -> Path:
    """Write `prog` as a C project into `out_dir` and return its path. target="host": model.c,
    model.h, runtime headers, Makefile (`make`: libmodel.so; with samples `make run` trains on
    them); "cortex-m4"/"cortex-m7": a firmware project (cortexm.py). embed_weights (default
    True) compiles the initial weights in as array initializers (frozen ones `const`).
    A program with an op the target lacks is refused (UnsupportedOpError) before anything is
    written (backends/capabilities.py)."""
    from ..capabilities import backend_of_target, check_program

    if target not in TARGETS:
        raise CBackendError(f"target={target!r}: use one of {TARGETS}")
    check_program(prog, backend_of_target(target))
    if target == "host":
        from .project import write_project

        return write_project(prog, out_dir, target, samples, embed_weights)
    if target in CORTEX_M_TARGETS:
        from .cortexm import emit_firmware

        return emit_firmware(prog, out_dir, target, samples)
    raise CBackendError(f"target={target!r}: use one of {TARGETS}")


__all__ = ["CBackendError", "emit_c", "CORTEX_M_TARGETS", "TARGETS"]
