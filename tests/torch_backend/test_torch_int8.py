"""torch.compile(model, backend="edgetrain", options={"quantize": "int8"}): the graph runs as
edgetrain's int8 program (the one edgetrain.compile(..., quantize="int8") builds), its
backward is edgetrain's int8 backward, and the float parameters get the straight-through
gradients of their integer images, so an unchanged PyTorch loop trains the device's model."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import edgetrain as et
from edgetrain.ops import verify
from edgetrain.torch_backend import last_programs

INT8 = {"quantize": "int8"}


class BlockNet(nn.Module):
    """conv + batch norm (eval) + relu, a residual block whose conv has no bias, a strided
    conv, global mean, a linear head. Not a zoo model."""

    def __init__(self, classes=4):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        h = F.relu(h + self.conv(h))
        h = F.relu(self.down(h))
        return self.head(h.mean((2, 3)))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # Dynamo falls back to eager after 8 recompiles of one forward


def _model(seed=0):
    torch.manual_seed(seed)
    model = BlockNet().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.2, 0.2)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.2, 0.2)
    return model


def _data(n, seed=0):
    """Four classes told apart by which colour channel is brightest, plus noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.5 * torch.randn(n, 3, 8, 8, generator=g)
    for c in range(3):
        x[y == c, c] += 1.0
    return x, y


def test_forward_and_gradients_are_the_int8_programs():
    model = _model()
    x, y = _data(4)
    prog = et.compile(copy.deepcopy(model), (x,), quantize="int8")  # calibrated on the same batch
    out = torch.compile(model, backend="edgetrain", options=INT8)(x)
    assert np.array_equal(out.detach().numpy(), prog.predict(x.numpy()))  # bit for bit

    F.cross_entropy(out, y).backward()
    rec = last_programs()[-1]
    assert rec.quantize == "int8" and rec.runs == {"forward": 1, "backward": 1}
    verify(rec.step)
    ref = prog.gradients(x.numpy(), y.numpy())  # d loss / d w_int, d loss / d b_int
    params = dict(model.named_parameters())
    for name, m in rec.int8.maps.items():
        chan = (-1,) + (1,) * (ref[name].ndim - 1)
        want = ref[name] * (m.w_factor / m.w_scales).reshape(chan)  # d loss / d W through w_int
        np.testing.assert_allclose(params[name].grad.numpy(), want, rtol=1e-4, atol=1e-7, err_msg=name)
        if m.bias_param:
            want = ref[m.bias] * m.bias_factor / m.acc_scales
            np.testing.assert_allclose(params[m.bias_param].grad.numpy(), want, rtol=1e-4, atol=1e-7,
                                       err_msg=m.bias_param)
    assert rec.int8.maps["stem.weight"].bias_param == "bn.bias"  # the folded bias trains beta
    assert model.bn.weight.grad is None  # gamma is folded into the weight the device trains


def test_an_unchanged_loop_learns_and_keeps_its_scales():
    model = _model(1)
    cmodel = torch.compile(model, backend="edgetrain", options=INT8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = _data(16 * 12 + 5, seed=1)
    losses = []
    for epoch in range(2):
        for i in range(0, len(x), 16):  # the last batch of each epoch has 5 samples
            opt.zero_grad()
            loss = F.cross_entropy(cmodel(x[i:i + 16]), y[i:i + 16])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:3])
    progs = [r for r in last_programs() if r.quantize == "int8"][-2:]
    assert {r.int8.forward.input(r.int8.data[0]).shape[0] for r in progs} == {16, 5}
    assert progs[0].int8.fixed is progs[1].int8.fixed  # one set of scales for both batch sizes
    assert progs[0].int8.q.layers["head.weight"].x == progs[1].int8.q.layers["head.weight"].x
    xt, yt = _data(64, seed=2)
    with torch.no_grad():
        acc = (cmodel(xt).argmax(1) == yt).float().mean().item()
    assert acc > 0.6


def test_update_schemes_and_frozen_parameters():
    model = _model()
    x, y = _data(4)
    F.cross_entropy(torch.compile(model, backend="edgetrain", options={**INT8, "update": "bias"})(x), y).backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == {"bn.bias", "conv.bias", "down.bias", "head.bias"}

    model = _model()
    model.head.weight.requires_grad_(False)
    F.cross_entropy(torch.compile(model, backend="edgetrain", options={**INT8, "update": "last:2"})(x), y).backward()
    rec = last_programs()[-1]
    assert set(rec.trainable) == {"down.weight", "down.bias", "head.bias"}
    assert model.head.weight.grad is None and model.stem.weight.grad is None


def test_budget_is_checked_on_the_int8_plan():
    model = _model()
    x, y = _data(8)
    F.cross_entropy(torch.compile(copy.deepcopy(model), backend="edgetrain")(x), y).backward()
    float_peak = last_programs()[-1].memory.peak_bytes
    F.cross_entropy(torch.compile(copy.deepcopy(model), backend="edgetrain", options=INT8)(x), y).backward()
    int8_peak = last_programs()[-1].memory.peak_bytes
    assert int8_peak < float_peak
    budget = (int8_peak + float_peak) // 2
    with pytest.raises(et.BudgetError, match="smallest budget that fits"):
        torch.compile(copy.deepcopy(model), backend="edgetrain", options={"budget": budget})(x)
    out = torch.compile(copy.deepcopy(model), backend="edgetrain", options={**INT8, "budget": budget})(x)
    assert out.shape == (8, 4)
    with pytest.raises(et.BudgetError, match="int8 training step needs"):
        torch.compile(copy.deepcopy(model), backend="edgetrain", options={**INT8, "budget": int8_peak - 1})(x)


def test_calibration_option_sets_the_scales():
    model = _model()
    x, _ = _data(4)
    wide = 4 * _data(4, seed=5)[0]
    torch.compile(copy.deepcopy(model), backend="edgetrain", options=INT8)(x)
    own = last_programs()[-1].int8.q.layers["stem.weight"].x.scale
    torch.compile(copy.deepcopy(model), backend="edgetrain", options={**INT8, "calibration": [wide]})(x)
    assert last_programs()[-1].int8.q.layers["stem.weight"].x.scale > 2 * own
    with pytest.raises(ValueError, match="calibration.*holds a str"):
        torch.compile(model, backend="edgetrain", options={**INT8, "calibration": ["x"]})(x)


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = F.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h)


def test_graph_break_before_a_trained_layer_is_explained():
    model = Broken()
    x = torch.randn(2, 6)
    with pytest.raises(et.CaptureError, match="graph break before a trained layer"):
        torch.compile(model, backend="edgetrain", options=INT8)(x).sum().backward()
    assert all(p.grad is None for p in model.parameters())
    with torch.no_grad():  # without gradients both graphs run
        assert torch.compile(model, backend="edgetrain", options=INT8)(x).shape == (2, 3)


def test_zoo_mobilenet_v2():
    """MobileNetV2-w0.35 (depthwise convs, ReLU6, residual adds): the same int8 forward as
    et.compile's, and a sparse update's gradients reach exactly its trained parameters."""
    from edgetrain.app.usermodel import load_model

    model = load_model("mbv2-w0.35", num_classes=10)
    x, y = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)), torch.tensor([1, 7])
    prog = et.compile(copy.deepcopy(model), (x,), quantize="int8")
    out = torch.compile(model, backend="edgetrain", options={**INT8, "update": "last:4"})(x)
    assert np.array_equal(out.detach().numpy(), prog.predict(x.numpy()))
    F.cross_entropy(out, y).backward()
    rec = last_programs()[-1]
    sources = {rec.int8.source(n) for n in rec.trainable}
    assert len(rec.trainable) == 8 and "classifier.weight" in sources and "blocks.16.depthwise.1.bias" in sources
    assert {n for n, p in model.named_parameters() if p.grad is not None} == sources


def test_published_scales_of_a_pre_quantized_model():
    """The paper's int8 MobileNetV2 (../shared/assets) with options["specs"]: its published
    scales and weights, the same forward as et.compile's (which reads them itself)."""
    from edgetrain.models import from_tiny_training

    from ..models.tiny_training_file import ASSETS

    path = ASSETS / "mbv2-w0.35.pkl"
    if not path.is_file():
        pytest.skip(f"{path} is absent: the paper's int8 models come with ../shared/assets")
    model = from_tiny_training(path, num_classes=10)
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    prog = et.compile(model, (x,), quantize="int8")
    out = torch.compile(model, backend="edgetrain", options={**INT8, "specs": model, "update": "last:2"})(x)
    assert np.array_equal(out.detach().numpy(), prog.predict(x.numpy()))
    rec = last_programs()[-1]
    spec = model.edgetrain_int8_spec
    layer = next(w for w in spec if w in rec.int8.q.layers)
    assert rec.int8.q.layers[layer].x == spec[layer].x  # published, not calibrated
    F.cross_entropy(out, torch.tensor([3])).backward()
    assert model.classifier.weight.grad is not None
    with pytest.raises(ValueError, match="carries no published int8 parameters"):
        torch.compile(nn.Linear(3, 2), backend="edgetrain", options={**INT8, "specs": nn.Linear(3, 2)})(
            torch.randn(1, 3))
