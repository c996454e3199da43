"""torch.compile(model, backend="edgetrain", options={"backend": "c"}): the forward graph and
the training step (edgetrain's backward) run as generated C (backends/c/graph_lib.py, the
float32 kernels et.compile's C programs use), with eager PyTorch's losses, gradients and
batch norm statistics in an unchanged loop."""
import copy

import pytest
import torch
import torch.nn.functional as F

from edgetrain.torch_backend import last_programs
from tests.torch_backend.test_torch_compile import ResidualNet, _pair
from tests.torch_backend.loops import train_loop
from tests.torch_backend.test_torch_compile_autodiff import Attention, TrainBN, _batches, _mobile

C = {"backend": "c"}
TOL = 1e-4  # float32 over three SGD steps with momentum; the C kernels sum in another order than torch's


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()


def _err(a, b) -> float:
    return float((a - b).abs().max() / max(b.abs().max(), 1.0))


@pytest.mark.parametrize("make", ["residual", "mobile", "train_bn", "attention"])
def test_c_runs_the_loop_with_eagers_numbers(make):
    if make == "residual":
        model, _ = _pair(ResidualNet)
        batches = _batches((2, 3, 8, 8), dtype=torch.float32)
    elif make == "mobile":
        model = _mobile(torch.float32)
        batches = _batches((4, 3, 6, 6), dtype=torch.float32)
    elif make == "attention":  # causal: the mask is a constant input of the C function
        torch.manual_seed(3)
        model = Attention(causal=True)
        batches = _batches((2, 5, 8), classes=3, dtype=torch.float32)
    else:
        torch.manual_seed(2)
        model = TrainBN().train()
        batches = _batches((4, 3, 6, 6), classes=4, dtype=torch.float32)
    ref = copy.deepcopy(model)
    losses, grads = train_loop(model, torch.compile(model, backend="edgetrain", options=C), batches)
    ref_losses, ref_grads = train_loop(ref, ref, batches)
    assert losses == pytest.approx(ref_losses, rel=TOL)
    worst = 0.0
    for ours, theirs in zip(grads, ref_grads):
        for name in theirs:
            worst = max(worst, _err(ours[name], theirs[name]))
    for k, want in ref.state_dict().items():  # parameters after the steps, running statistics
        got = model.state_dict()[k]
        if k.endswith("num_batches_tracked"):
            assert int(got) == int(want), k
        else:
            worst = max(worst, _err(got, want))
    assert worst <= TOL, worst
    rec = last_programs()[-1]
    assert rec.backend == "c" and rec.runs == {"forward": 3, "backward": 3}
    with torch.no_grad():  # the forward alone, as C
        model.eval()
        ref.eval()
        x = batches[0][0]
        torch.testing.assert_close(torch.compile(model, backend="edgetrain", options=C)(x), ref(x),
                                   rtol=TOL, atol=1e-5)
    assert last_programs()[-1].backend == "c" and last_programs()[-1].step is None


def test_c_option_is_checked():
    lin = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"options\['backend'\]='cuda'"):
        torch.compile(lin, backend="edgetrain", options={"backend": "cuda"})(torch.randn(1, 3))
    with pytest.raises(ValueError, match="runs float graphs"):
        torch.compile(lin, backend="edgetrain", options={"backend": "c", "quantize": "int8"})(torch.randn(1, 3))
    with pytest.raises(Exception, match="float32"):  # the C kernels are float32
        F.cross_entropy(torch.compile(lin.double(), backend="edgetrain", options=C)(torch.randn(2, 3).double()),
                        torch.tensor([0, 1])).backward()
