"""Shared test helpers: gradient comparison against torch.autograd."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

#: relative-error tolerances of the issue: float64 runs and float32 runs
TOL = {torch.float64: 1e-4, torch.float32: 1e-3}


def torch_grads(model, x, y, loss="cross_entropy"):
    model.eval()
    model.zero_grad(set_to_none=True)
    out = model(*x) if isinstance(x, tuple) else model(x)
    lv = F.cross_entropy(out, y) if loss == "cross_entropy" else F.mse_loss(out, y)
    lv.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, float(lv.detach())


def rel_err(ours: np.ndarray, ref: torch.Tensor) -> float:
    ref = ref.detach().numpy()
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-12))


def check_gradients(prog, model, x, y, dtype, loss="cross_entropy", ref=None):
    """Our gradients equal torch's for every trained parameter (selected channels only for a
    partially trained weight, whose other channels must be zero). `ref`: torch's gradients of
    every parameter of `model` at (x, y), where the caller has them already (torch_grads)."""
    ours = prog.gradients(x, y)
    if ref is None:
        ref, _ = torch_grads(model, x, y, loss)
    assert set(ours) == set(prog.trainable)
    for name, sel in prog.trainable.items():
        g, r = ours[name], ref[name]
        if sel is not None:
            idx = [slice(None)] * g.ndim
            idx[sel.dim] = list(sel.index)
            rest = np.ones(g.shape[sel.dim], bool)
            rest[list(sel.index)] = False
            other = [slice(None)] * g.ndim
            other[sel.dim] = rest
            assert not g[tuple(other)].any(), f"{name}: untrained channels must have zero gradient"
            g, r = g[tuple(idx)], r[tuple(idx)]
        assert rel_err(g, r) <= TOL[dtype], f"{name}: relative error {rel_err(g, r):.2e}"
    return ours


def assert_close_to_largest(got, want, tol, what=""):
    """The largest difference is at most `tol` times the largest |want| (1e-6 at least)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    err = np.abs(got - want).max()
    assert err <= tol * max(np.abs(want).max(), 1e-6), f"{what}: max error {err:.3g} of {np.abs(want).max():.3g}"
