"""Contribution analysis of a model with fewer than BIAS_STEP (4) layers measures its bias
gains (issue 34, item 12: the default depths 4, 8, ... left them out without a word)."""
import warnings

import pytest
import torch
from torch import nn

from edgetrain.sparse import FineTune, analyze_contributions
from edgetrain.sparse.contribution import BIAS_STEP, best_bias_depth

from .nets import CLASSES, task

FAST = FineTune(epochs=1, batch=8, lr=0.05, momentum=0.9, seed=0)


def small_net(seed: int = 0) -> nn.Module:
    """Two convolutions and a classifier: two layers Sparse can name."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, 2, 1), nn.ReLU(), nn.Conv2d(4, 8, 3, 2, 1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES)).eval()


@pytest.fixture(scope="module")
def data():
    return task(48, seed=1), task(32, seed=2)


def test_default_bias_depths():
    from edgetrain.sparse.contribution import default_bias_ks

    assert default_bias_ks(51, 20) == tuple(range(BIAS_STEP, 41, BIAS_STEP))  # mbv2: unchanged
    assert default_bias_ks(8, 8) == (4, 8)
    assert default_bias_ks(2, 2) == (1, 2)  # fewer layers than one step: every depth
    assert default_bias_ks(3, 3) == (1, 2, 3)
    assert default_bias_ks(10, 1) == (1, 2)  # one layer analysed: depths up to 2
    assert default_bias_ks(5, 0) == ()


def test_a_two_layer_model_gets_its_bias_gains(data):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        table = analyze_contributions(small_net(), *data, name="small", ratios=[1.0], config=FAST)
    assert len(table.layers) == 2
    assert set(table.bias_gains) == {1, 2}
    assert table.meta["bias_ks"] == [1, 2] and "bias_gains" not in table.meta
    assert set(table.weight_gains) == {(0, 1.0), (1, 1.0)}
    # over the better bias depth when its gain clears the noise, else over the classifier alone
    assert table.weight_base == best_bias_depth(table.bias_gains, dict(zip((1, 2), table.meta["bias_stderr"])))


def test_no_bias_depth_is_said(data):
    with pytest.warns(UserWarning, match="measures no bias gains"):
        table = analyze_contributions(small_net(), *data, layers=(), config=FAST)
    assert table.bias_gains == {} and table.meta["bias_gains"].startswith("none measured")
