"""More pointwise activations and functions (elu, leaky_relu, softplus, log1p, sin, cos, abs) and their gradients."""
