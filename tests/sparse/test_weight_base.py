"""Which bias update the weight gains of a contribution table are measured over (issue 31):
the bias depth with the largest gain only when that gain is measured, not noise. On the
BasicMotions GRU (10 held-out cases) the recurrent bias "gained" one case (+10 points,
standard error 10-15), every weight piece measured over it lost (the GRU's input weights
-50 points), and update="auto" chose the recurrent bias alone: 0.30 top-1 on the test
split, where the input weights over the classifier alone (+30 held out) reach 0.85."""
import numpy as np
import pytest

import edgetrain as et
from edgetrain.sparse import FineTune, analyze_contributions, scheme_accuracy
from edgetrain.sparse.contribution import SIGNIFICANCE, best_bias_depth, paired_stderr

from .nets import task, tiny_net

FAST = FineTune(epochs=1, batch=8, lr=0.05, momentum=0.9, seed=0)


def test_a_bias_depth_won_by_chance_is_not_the_base():
    # the GRU's table: one of 10 held-out cases more for the recurrent bias, one fewer for all biases
    ref = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 0], bool)
    one_more, one_fewer = ref.copy(), ref.copy()
    one_more[6], one_fewer[0] = True, False
    stderr = {1: paired_stderr(one_more, ref), 51: paired_stderr(one_fewer, ref)}
    gains = {1: 0.1, 51: -0.1}
    assert stderr[1] == pytest.approx(0.1)
    assert max(gains, key=lambda k: (gains[k], -k)) == 1  # the old rule: the largest gain, noise or not
    assert best_bias_depth(gains, stderr) == 0  # now: the classifier alone


def test_a_measured_bias_gain_is_the_base():
    assert best_bias_depth({4: 0.05, 8: 0.08, 12: 0.08}, {4: 0.01, 8: 0.01, 12: 0.01}) == 8  # ties: fewer layers
    assert best_bias_depth({4: 0.05, 8: 0.08}, {4: 0.01, 8: 0.05}) == 4  # 8's gain is within its noise
    assert best_bias_depth({4: -0.02, 8: -0.01}, {4: 0.0, 8: 0.0}) == 0  # every depth loses
    assert best_bias_depth({4: 0.0}, {4: 0.0}) == 0
    assert best_bias_depth({}, {}) == 0
    assert best_bias_depth({4: 0.03}, {4: 0.03 / SIGNIFICANCE}) == 0  # at the floor is not above it
    assert best_bias_depth({4: 0.03}, {4: 0.03 / SIGNIFICANCE}, significance=1.0) == 4


def test_few_held_out_cases_measure_weights_over_the_classifier():
    """With 6 held-out images a bias depth must win 4 of them outright to count (a paired
    standard error of >= 0.18 per gain): the analysis measures weight gains over the base it
    states, and each equals the top-1 of that scheme minus its base's."""
    model, train, test = tiny_net(), task(96, seed=1), task(6, seed=3)
    table = analyze_contributions(model, train, test, layers=[7], ratios=[1.0], bias_ks=[1, 4], config=FAST)
    stderr = dict(zip((1, 4), table.meta["bias_stderr"]))
    assert all(se > 0 or table.bias_gains[k] == 0 for k, se in stderr.items())
    assert table.weight_base == best_bias_depth(table.bias_gains, stderr)
    on_base = table.base_accuracy + table.bias_gains.get(table.weight_base, 0.0)
    acc = scheme_accuracy(model, et.Sparse(bias_last=table.weight_base, weights={7: 1.0}), train, test, config=FAST)
    assert acc == pytest.approx(on_base + table.weight_gains[7, 1.0])
