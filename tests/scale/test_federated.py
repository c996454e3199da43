"""Federated averaging on hand-made values (the rounding rule), the trained-tensor API of a
compiled int8 program, the bytes a client sends, and the seeded data splits (seconds)."""
import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.federated import (dirichlet_partition, fed_average, iid_partition, model_bytes, parse_partition,
                                 partition, requantize, update_bytes)
from edgetrain.models.digitnet import pretrained_digitnet
from edgetrain.runtime.trained import TrainedTensor

INT8 = (-127, 127)


def int8_tensor(values, scale, zero=0, rng=INT8, dtype=np.int8):
    v = np.asarray(values, dtype=dtype)
    s = np.asarray(scale, dtype=np.float64).reshape((-1,) + (1,) * (v.ndim - 1))
    return TrainedTensor("t", v, scale=s, zero=zero, range=rng)


def test_int8_average_rounds_half_to_even_per_channel():
    # row 0 on scale 0.5, row 1 on 0.25 (powers of two: the real values are exact in float64)
    layout = {"w": int8_tensor(np.zeros((2, 2)), [0.5, 0.25])}
    a = {"w": np.array([[1, 2], [127, -127]], np.int8)}
    b = {"w": np.array([[2, 3], [126, -127]], np.int8)}
    out = fed_average(layout, [(2, a), (2, b)])["w"]
    # means 1.5 -> 2, 2.5 -> 2, 126.5 -> 126 (ties to even), -127 stays
    assert out.dtype == np.int8
    assert out.tolist() == [[2, 2], [126, -127]]


def test_weights_are_sample_counts():
    layout = {"w": int8_tensor(np.zeros((1, 1)), [0.5])}
    out = fed_average(layout, [(1, {"w": np.array([[0]], np.int8)}), (3, {"w": np.array([[8]], np.int8)})])
    assert out["w"].tolist() == [[6]]  # (1 * 0 + 3 * 8) / 4


def test_zero_point_and_clamp():
    t = int8_tensor([0], [0.5], zero=3)
    out = fed_average({"z": t}, [(1, {"z": np.array([5], np.int8)}), (1, {"z": np.array([8], np.int8)})])
    assert out["z"].tolist() == [7]  # reals 1.0 and 2.5 -> 1.75 -> 3.5 steps -> 4 (even) + zero 3
    clamp = int8_tensor([0, 0], [0.5])
    assert requantize(np.array([100.0, -100.0]), clamp).tolist() == [127, -127]  # the update's int8 range


def test_int32_bias_and_float_tensors():
    bias = int8_tensor([0, 0], [0.001, 0.002], rng=(-(2 ** 24), 2 ** 24), dtype=np.int32)
    flt = TrainedTensor("f", np.zeros(2, np.float32))
    ups = [(1, {"b": np.array([1000, -3], np.int32), "f": np.array([0.1, 0.2], np.float32)}),
           (3, {"b": np.array([1000, -5], np.int32), "f": np.array([0.3, 0.4], np.float32)})]
    out = fed_average({"b": bias, "f": flt}, ups)
    assert out["b"].dtype == np.int32 and out["b"].tolist() == [1000, -4]  # -4.5 -> -4
    want = (0.25 * np.array([0.1, 0.2], np.float32).astype(np.float64)
            + 0.75 * np.array([0.3, 0.4], np.float32).astype(np.float64)).astype(np.float32)
    assert out["f"].dtype == np.float32 and np.array_equal(out["f"], want)


def test_bad_updates_are_refused():
    layout = {"w": int8_tensor(np.zeros((1, 2)), [0.5])}
    good = {"w": np.zeros((1, 2), np.int8)}
    with pytest.raises(ValueError, match="int16"):
        fed_average(layout, [(1, good), (1, {"w": np.zeros((1, 2), np.int16)})])
    with pytest.raises(ValueError, match="lacks"):
        fed_average(layout, [(1, {})])
    with pytest.raises(ValueError, match="positive"):
        fed_average(layout, [(0, good)])
    with pytest.raises(ValueError, match="no client"):
        fed_average(layout, [])


# --- the trained tensors of a compiled program ---------------------------------------------------
SCHEME = et.Sparse(bias_last=2, weights={1: 0.5, 2: 1})


@pytest.fixture(scope="module")
def prog():
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    return et.compile(pretrained_digitnet(), (torch.from_numpy(x),), update=SCHEME, quantize="int8",
                      optimizer=et.SGD(lr=0.01), calibration=[x])


def test_trained_tensors_real_values_are_the_exported_weights(prog):
    tt = prog.trained_tensors()
    assert list(tt) == list(prog.trainable)
    sd = prog.state_dict()
    # features.1.0 trains half its (depthwise) output channels
    t = tt["features.1.0.weight"]
    assert t.values.shape == (8, 1, 3, 3) and t.values.dtype == np.int8 and t.range == INT8
    for name in ("features.1.0.weight", "features.2.0.weight", "classifier.weight", "classifier.bias"):
        full = sd[name].numpy()
        np.testing.assert_allclose(tt[name].real(), full[tt[name].selection(full.ndim)], rtol=1e-6, atol=1e-9)


def test_load_trained_writes_only_the_trained_part(prog):
    p = prog.replace()  # a copy with its own state
    before = {k: np.array(v) for k, v in p.state.items()}
    t = p.trained_tensors()["features.1.0.weight"]
    p.load_trained({"features.1.0.weight": np.full_like(t.values, 5)})
    w = p.state["features.1.0.weight"]
    assert (w[list(t.index)] == 5).all()
    rest = [i for i in range(w.shape[0]) if i not in t.index]
    assert np.array_equal(w[rest], before["features.1.0.weight"][rest])
    assert all(np.array_equal(p.state[k], v) for k, v in before.items() if k != "features.1.0.weight")
    with pytest.raises(ValueError, match="trains int8"):
        p.load_trained({"features.1.0.weight": np.zeros((16, 1, 3, 3), np.int8)})
    with pytest.raises(ValueError, match="not a tensor this program trains"):
        p.load_trained({"features.0.0.weight": np.zeros((16, 1, 3, 3), np.int8)})


def test_bytes_sent_per_round_by_hand(prog):
    # trained parts: 8 of 16 depthwise 3x3 filters (int8), the 32x16 1x1 conv, the 10x1568
    # classifier, and int32 biases of the classifier and the two convolutions before it
    sent = 8 * 9 + 32 * 16 + 10 * 1568 + 4 * (10 + 32 + 32)
    assert update_bytes(prog.trained_tensors()) == sent
    weights = 16 * 9 + 16 * 9 + 32 * 16 + 32 * 9 + 32 * 32 + 10 * 1568
    biases = 4 * (16 + 16 + 32 + 32 + 32 + 10)
    assert model_bytes(prog) == weights + biases


# --- splits ---------------------------------------------------------------------------------------
LABELS = np.random.default_rng(1).integers(0, 10, 500)


def _disjoint_cover(shards, n):
    allidx = np.concatenate(shards)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))
    assert all(np.array_equal(s, np.sort(s)) for s in shards)


def test_iid_split_is_seeded_disjoint_and_even():
    shards = iid_partition(500, 7, seed=3)
    _disjoint_cover(shards, 500)
    assert {len(s) for s in shards} <= {71, 72}
    assert all(np.array_equal(a, b) for a, b in zip(shards, iid_partition(500, 7, seed=3)))
    assert not all(np.array_equal(a, b) for a, b in zip(shards, iid_partition(500, 7, seed=4)))


def test_dirichlet_split_is_seeded_disjoint_and_skewed():
    skewed = dirichlet_partition(LABELS, 10, 0.1, seed=0)
    _disjoint_cover(skewed, 500)
    assert all(len(s) >= 1 for s in skewed)
    assert all(np.array_equal(a, b) for a, b in zip(skewed, dirichlet_partition(LABELS, 10, 0.1, seed=0)))
    flat = dirichlet_partition(LABELS, 10, 1000.0, seed=0)
    _disjoint_cover(flat, 500)

    def top_share(shards):  # mean share of a shard's largest class
        return np.mean([np.bincount(LABELS[s], minlength=10).max() / len(s) for s in shards])

    assert top_share(flat) < 0.3 < 0.5 < top_share(skewed)


def test_partition_text_and_bad_input():
    assert parse_partition("iid") == ("iid", 0.0)
    assert parse_partition("dirichlet:0.5") == ("dirichlet", 0.5)
    for bad in ("dirichlet", "dirichlet:0", "dirichlet:-1", "dirichlet:x", "zipf:2"):
        with pytest.raises(ValueError, match="iid or dirichlet:ALPHA"):
            parse_partition(bad)
    with pytest.raises(ValueError, match="cannot be split"):
        partition("iid", LABELS[:3], 5)
    _disjoint_cover(partition("dirichlet:0.5", LABELS, 4, seed=2), 500)
