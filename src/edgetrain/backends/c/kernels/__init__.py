"""The C kernels: the registry (registry.py), the context every emitter gets (context.py) and the
kernel families, imported here so that the registry is full.

A kernel emitter is `fn(node, ctx) -> str`: a C block `{ ... }` computing the node's outputs
from its inputs (calling the inline functions of a runtime header with constant shapes).
Register one per op name with `@register("op")`. By default a state tensor stored split
(trained on some channels only) is gathered into a full-layout buffer before the kernel
runs and `ctx.ptr` points at that buffer; `split_aware=True` kernels read `ctx.weight(v)`
and handle the two parts themselves.
"""
from __future__ import annotations

from . import (check, float32, float32_bn, float32_conv_nd, float32_fused, float32_groupnorm,  # noqa: F401
               float32_lmloss, float32_nn, float32_pointwise, float32_qweights, float32_reduce, float32_resample,
               float32_select, float32_shape, int8, int8_pointwise, int8_resample, int8_transposed, integer,
               page)  # (they register)
from .context import EmitContext, WeightRef
from .registry import KERNELS, Kernel, KernelFn, kernel_for, register

__all__ = ["KERNELS", "EmitContext", "Kernel", "KernelFn", "WeightRef", "kernel_for", "register"]
