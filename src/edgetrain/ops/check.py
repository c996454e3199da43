"""check: a model's run-time condition on its data as an op (issue 31: torch._check and
torch.export's run-time asserts, frontend/aten_dynamic.py; BART's "All examples must have the
same number of <eos> tokens.").

check(x, ok; message) is x itself (a view: its output shares x's storage) when the scalar `ok`
(bool or integer) is true (nonzero). When `ok` is false (0) the reference stops with
`RunTimeCheckError(message)`, a ValueError as the one PyTorch raises; the C kernel
(backends/c/kernels/check.py) reports the message through ET_ERROR_HOOK, keeps the first one
for `et_check_error()` (the host runner raises the same RunTimeCheckError with it) and, for a
float x, fills x with NaN, so that a training step's loss is non-finite and the step keeps the
trained state (the checked step's guard, the weight banks).

The capture puts the checks on the model's output (one after another, in the order the model
makes them), so nothing can remove them: the output is computed through them. Not
differentiable in `ok`; x's gradient passes through unchanged. Zero multiply-accumulates. No
int8 rule: in an int8 program it runs on the dequantized float output (quantize/convert.py's
"float" kind); its C kernel takes any dtype of x all the same (it only reads `ok`).
"""
from __future__ import annotations

import numpy as np

from .base import Cost, OpDef, register

CHECK = "check"
#: the dtypes of a check's condition
OK_DTYPES = ("bool", "int8", "int32", "int64")


class RunTimeCheckError(ValueError):
    """A run-time check of the model failed on this input (the message says which, and where
    in the model it comes from)."""


def _infer(ts, a):
    x, ok = ts
    if ok.dtype not in OK_DTYPES or ok.numel != 1:
        raise ValueError(f"check: the condition must be one bool or integer, got {ok}")
    if not isinstance(a.get("message"), str) or not a["message"]:
        raise ValueError(f"check: attr message must be a non-empty string, got {a.get('message')!r}")
    return [x]


def _ref(xs, a):
    if not np.asarray(xs[1]).reshape(()).item():
        raise RunTimeCheckError(a["message"])
    return [xs[0]]


def _vjp(e, node, grads, needs):
    return [grads[0], None]


register(OpDef(CHECK, _infer, _ref, _vjp, cost=lambda n: Cost(0, n.inputs[1].type.nbytes), shares=((0, 0),),
               num_inputs=(2, 2)))
