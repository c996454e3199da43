"""Float kernels of ops/pointwise.py: runtime/et_float_pointwise.h. Elementwise loops with constant
bounds computing each element in double (float32 and float64 values), as kernels/float32_nn.py's
activations; the attrs are C double constants."""
from __future__ import annotations

from ....ops.pointwise import ELU_DEFAULTS, LEAKY_RELU_DEFAULT_SLOPE, SOFTPLUS_DEFAULTS
from .float32_nn import elementwise_kernel
from .registry import register


def _args(node, ctx, defaults) -> str:
    """The node's attrs named in `defaults` (in their order) as C double arguments."""
    return ", ".join(ctx.c_double(node.attrs.get(k, v)) for k, v in defaults.items())


def _slope(node, ctx) -> str:
    return ctx.c_double(node.attrs.get("negative_slope", LEAKY_RELU_DEFAULT_SLOPE))


register("elu")(elementwise_kernel(1, lambda n, c, t: f"et_elu(x0, {_args(n, c, ELU_DEFAULTS)})"))
register("leaky_relu")(elementwise_kernel(1, lambda n, c, t: f"x0 > 0 ? x0 : x0 * {_slope(n, c)}"))
register("softplus")(elementwise_kernel(1, lambda n, c, t: f"et_softplus(x0, {_args(n, c, SOFTPLUS_DEFAULTS)})"))
register("log1p")(elementwise_kernel(1, lambda n, c, t: "et_log1p(x0)"))
register("expm1")(elementwise_kernel(1, lambda n, c, t: "et_expm1(x0)"))
register("sin")(elementwise_kernel(1, lambda n, c, t: "et_sin(x0)"))
register("cos")(elementwise_kernel(1, lambda n, c, t: "et_cos(x0)"))
register("abs")(elementwise_kernel(1, lambda n, c, t: "et_fabs(x0)"))
register("erf")(elementwise_kernel(1, lambda n, c, t: "et_erf(x0)"))
# (a NaN is neither: 0, as torch's sign)
register("sign")(elementwise_kernel(1, lambda n, c, t: "x0 > 0 ? 1.0 : (x0 < 0 ? -1.0 : 0.0)"))
# rounding to integers without libm (runtime/et_float_pointwise.h)
for _op, _fn in (("floor", "et_floor"), ("ceil", "et_ceil"), ("trunc", "et_trunc"), ("round", "et_round_even")):
    register(_op)(elementwise_kernel(1, (lambda fn: lambda n, c, t: f"{fn}(x0)")(_fn)))
# pointwise gradients g * f'(x), x the saved forward input
register("elu_grad")(elementwise_kernel(2, lambda n, c, t: f"x0 * et_elu_grad(x1, {_args(n, c, ELU_DEFAULTS)})"))
register("leaky_relu_grad")(elementwise_kernel(2, lambda n, c, t: f"x1 > 0 ? x0 : x0 * {_slope(n, c)}"))
register("softplus_grad")(elementwise_kernel(
    2, lambda n, c, t: f"x0 * et_softplus_grad(x1, {_args(n, c, SOFTPLUS_DEFAULTS)})"))
register("abs_grad")(elementwise_kernel(2, lambda n, c, t: "x0 * et_sign(x1)"))
