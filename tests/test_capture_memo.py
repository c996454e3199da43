"""The suite's memo of torch.export (tests/capture_memo.py): a model built anew the same way is
not exported again and its capture holds its own parameters, and a model that
differs in what the fingerprint can see, or holds what it cannot, is exported afresh."""
import numpy as np
import pytest
import torch
from torch import nn

from edgetrain.frontend import capture
from tests import capture_memo


class Scaled(nn.Module):
    def __init__(self, scale: float = 2.0, seed: int = 0):
        super().__init__()
        self.conv, self.bn, self.scale = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), scale
        self.bn.running_mean.copy_(torch.arange(4.0))
        torch.manual_seed(seed)
        self.conv.weight.data.normal_()

    def forward(self, x):
        return self.bn(self.conv(x)).flatten(1) * self.scale


X = (torch.randn(1, 3, 6, 6),)


@pytest.fixture
def counted(monkeypatch):
    """The real exports the memo lets through, counted, with a memo of its own."""
    monkeypatch.setattr(capture_memo, "_memo", capture_memo.OrderedDict())
    monkeypatch.setattr(capture_memo, "enabled", True)
    calls = []
    real = capture_memo.exported

    def exported(model, args, export):
        return real(model, args, lambda m, a: calls.append(type(m).__name__) or export(m, a))

    monkeypatch.setattr(capture_memo, "exported", exported)
    return calls


def _same(a, b):
    assert [(n.op, n.attrs) for n in a.graph.nodes] == [(n.op, n.attrs) for n in b.graph.nodes]


def test_a_model_built_again_is_not_exported_again_and_keeps_its_own_tensors(counted):
    model = Scaled(seed=1)
    first, second = capture(Scaled(seed=0), X), capture(model, X)
    assert counted == ["Scaled"]
    _same(first, second)
    for k, v in model.state_dict().items():
        got = second.params.get(k, second.buffers.get(k))
        if got is not None:
            np.testing.assert_array_equal(got, v.numpy(), err_msg=k)
    assert not np.array_equal(first.params["conv.weight"], second.params["conv.weight"])


def test_other_buffer_values_export_afresh(counted):
    changed = Scaled()
    changed.bn.running_mean.add_(1.0)
    capture(Scaled(), X)
    capture(changed, X)
    assert counted == ["Scaled", "Scaled"]


def test_what_the_fingerprint_sees_exports_afresh(counted):
    capture(Scaled(), X)
    capture(Scaled(scale=3.0), X)  # an attribute
    capture(Scaled(), (torch.randn(2, 3, 6, 6),))  # the input's shape
    frozen = Scaled()
    frozen.conv.weight.requires_grad_(False)
    capture(frozen, X)
    assert len(counted) == 4


def test_what_the_fingerprint_cannot_see_is_refused():
    class Local(nn.Module):  # its forward may read the test's locals
        def forward(self, x):
            return x.flatten(1)

    hooked = Scaled()
    hooked.register_forward_hook(lambda m, i, o: o * 2)
    with_function = Scaled()
    with_function.act = torch.relu
    for model in (Local(), hooked, with_function):
        with pytest.raises(capture_memo.Unmemoizable):
            capture_memo.fingerprint(model, X)


@pytest.mark.fresh_capture
def test_the_marker_exports_every_time(counted):
    capture(Scaled(), X)
    capture(Scaled(), X)
    assert counted == ["Scaled", "Scaled"]
