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
#: 2^52: every double of this magnitude or more is an integer (its own floor)
_INTEGRAL = "4503599627370496.0"
# floor without libm: truncate, one less for a negative non-integer; NaN, +-inf and large values as they are
register("floor")(elementwise_kernel(1, lambda n, c, t: (
    f"(x0 != x0 || x0 >= {_INTEGRAL} || x0 <= -{_INTEGRAL}) ? x0 : "
    "((double)(long long)x0 > x0 ? (double)(long long)x0 - 1.0 : (double)(long long)x0)")))
# pointwise gradients g * f'(x), x the saved forward input
register("elu_grad")(elementwise_kernel(2, lambda n, c, t: f"x0 * et_elu_grad(x1, {_args(n, c, ELU_DEFAULTS)})"))
register("leaky_relu_grad")(elementwise_kernel(2, lambda n, c, t: f"x1 > 0 ? x0 : x0 * {_slope(n, c)}"))
register("softplus_grad")(elementwise_kernel(
    2, lambda n, c, t: f"x0 * et_softplus_grad(x1, {_args(n, c, SOFTPLUS_DEFAULTS)})"))
register("abs_grad")(elementwise_kernel(2, lambda n, c, t: "x0 * et_sign(x1)"))
