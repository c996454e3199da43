"""Gradients of compiled programs equal torch.autograd's, for every update scheme."""
import numpy as np
import pytest
import torch

import edgetrain as et
from tests.core.models import MixedOps, SEMobile
from tests.helpers import check_gradients, rel_err

SCHEMES = [et.Full(), et.BiasOnly(), et.LastK(2), et.Sparse(bias_last=3, weights={1: 0.5, 2: 1.0, 3: 0.25})]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("update", SCHEMES, ids=lambda s: type(s).__name__)
def test_se_mobile(update, dtype):
    torch.manual_seed(0)
    model = SEMobile().to(dtype)
    x = torch.randn(2, 3, 24, 24, dtype=dtype)
    y = torch.tensor([1, 6])
    prog = et.compile(model, (x,), update=update)
    check_gradients(prog, model, x, y, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("update", [et.Full(), et.BiasOnly(), et.LastK(1)], ids=lambda s: type(s).__name__)
def test_mixed_ops(update, dtype):
    torch.manual_seed(0)
    model = MixedOps().to(dtype)
    ids = torch.randint(0, 20, (3, 6))
    y = torch.tensor([0, 4, 2])
    prog = et.compile(model, (ids,), update=update)
    check_gradients(prog, model, ids, y, dtype)


def test_mse_loss_and_numpy_inputs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    x, t = np.random.default_rng(0).normal(size=(5, 4)), np.random.default_rng(1).normal(size=(5, 3))
    prog = et.compile(model, (x,), loss="mse")
    check_gradients(prog, model, torch.from_numpy(x), torch.from_numpy(t), torch.float64, loss="mse")


def test_frozen_parameters_are_not_trained():
    model = SEMobile().double()
    model.stem[0].weight.requires_grad_(False)
    prog = et.compile(model, (torch.randn(1, 3, 16, 16, dtype=torch.float64),))
    assert "stem.0.weight" not in prog.trainable and "stem.1.weight" in prog.trainable


def test_sparse_channels_are_largest_norm_first():
    model = SEMobile().double()
    prog = et.compile(model, (torch.randn(1, 3, 16, 16, dtype=torch.float64),),
                      update=et.Sparse(weights={3: 0.5}))
    w = model.se2.weight.detach().numpy()  # conv 3 in forward order: stem, dw, se1, se2
    sel = prog.trainable["se2.weight"]
    norms = np.sqrt((w ** 2).sum(axis=(0, 2, 3)))
    assert sel.dim == 1 and set(sel.index) == set(np.argsort(-norms)[:2].tolist())


def test_vector_jacobian_product_from_cotangents():
    """build_backward started from the outputs' cotangents (no loss): torch.autograd's VJP."""
    from edgetrain.autodiff import build_backward
    from edgetrain.interpreter import run_graph
    from edgetrain.frontend import capture
    from edgetrain.ir import Role, TensorType, new_value

    torch.manual_seed(0)
    model = SEMobile().double().eval()
    x = torch.randn(2, 3, 24, 24, dtype=torch.float64)
    cap = capture(model, (x,))
    g = cap.graph
    out = g.outputs[0]
    t = new_value(TensorType(out.shape, out.dtype), "cotangent")
    params = dict(model.named_parameters())
    joint = build_backward(g.with_inputs({t: Role.TANGENT}), None, {n: None for n in params},
                           {g.output_names[0]: "cotangent"})
    ct = torch.randn(out.shape, dtype=torch.float64)
    feeds = {n: p.detach().numpy() for n, p in params.items()}
    feeds.update({n: b.numpy() for n, b in model.named_buffers()})
    feeds.update({cap.inputs[0]: x.numpy(), "cotangent": ct.numpy()})
    got, _ = run_graph(joint, {v.name: feeds[v.name] for v in joint.inputs})
    model(x).backward(ct)
    for n, p in params.items():
        assert rel_err(got[f"grad:{n}"], p.grad) < 1e-7, n
    with pytest.raises(ValueError, match="the cotangent c of output output is f64\\[1\\], not \\(2, 7\\)"):
        build_backward(g.with_inputs({new_value(TensorType((1,), "float64"), "c"): Role.TANGENT}), None,
                       {n: None for n in params}, {g.output_names[0]: "c"})
