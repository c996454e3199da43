"""The kernel registry of the C backend: op name -> its C emitter. The kernel family modules
register into it with `@register("op")`; the package's __init__ imports every family, so the
registry is full whenever any part of kernels/ is imported."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ....ir import Node
from ..layout import CBackendError

if TYPE_CHECKING:
    from .context import EmitContext

KernelFn = Callable[[Node, "EmitContext"], str]


@dataclass(frozen=True)
class Kernel:
    """A registered emitter; `split_aware` ones handle split weights themselves (ctx.weight)."""

    fn: KernelFn
    split_aware: bool = False


KERNELS: dict[str, Kernel] = {}


def register(op: str, split_aware: bool = False):
    """Decorator: register `fn(node, ctx) -> str` as the C kernel of `op` (once per op)."""
    def deco(fn: KernelFn) -> KernelFn:
        if op in KERNELS:
            raise ValueError(f"C kernel for {op!r} registered twice")
        KERNELS[op] = Kernel(fn, split_aware)
        return fn
    return deco


def kernel_for(node: Node) -> Kernel:
    """The registered kernel of `node`'s op (CBackendError naming the supported ops otherwise)."""
    k = KERNELS.get(node.op)
    if k is None:
        raise CBackendError(f"the C backend has no kernel for op {node.op!r} "
                            f"(inputs {[str(v.type) for v in node.inputs]}); supported: {sorted(KERNELS)}")
    return k
