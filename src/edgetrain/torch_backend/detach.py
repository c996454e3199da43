"""x.detach() under torch.compile: AOTAutograd traces the forward under torch.no_grad, where a detach
means nothing, and functionalization drops it, so edgetrain's autodiff of that graph would let the
gradient through. `replace_detaches` swaps every detach of Dynamo's graph (which edgetrain owns) for
`torch.ops.edgetrain.stop_gradient`, an opaque op (its value is x) that AOTAutograd keeps whole and
that translate.py turns into the IR's `detach` (ops/shape.py), as et.compile's capture does with
aten.detach."""
from __future__ import annotations

import torch

from ..frontend.converters import CONVERTERS, aten


@torch.library.custom_op("edgetrain::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """x's values, without a gradient (a custom op cannot return its input itself: a copy)."""
    return x.detach().clone()


@stop_gradient.register_fake
def _(x):
    return torch.empty_like(x)


# where PyTorch itself runs the graph (a fallback): no gradient to x, as detach
stop_gradient.register_autograd(lambda ctx, grad: None, setup_context=lambda ctx, inputs, output: None)


# translated as et.compile's capture translates aten.detach: the IR's detach
CONVERTERS[torch.ops.edgetrain.stop_gradient.default] = CONVERTERS[aten.detach.default]

#: how Dynamo's graph calls a detach: the method, or the function
_DETACH_FUNCTIONS = (torch.detach, torch.Tensor.detach)


def _is_detach(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "detach") or \
        (node.op == "call_function" and node.target in _DETACH_FUNCTIONS)


def replace_detaches(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with each detach of a tensor calling stop_gradient instead."""
    changed = False
    for node in gm.graph.nodes:
        if _is_detach(node):
            node.op, node.target = "call_function", torch.ops.edgetrain.stop_gradient.default
            changed = True
    if changed:
        gm.recompile()
    return gm
