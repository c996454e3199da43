"""bench/sensors.py chooses each side's fine-tuning lr by that side's own training: edgetrain's
int8 program by its int8 fine-tune, PyTorch float32 by its own, each scored on the held-out
cases (ties: the smaller lr). Small synthetic series, so no data set is needed."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.sparse.finetune import FineTune, FineTuner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import sensors  # noqa: E402

GRID, EPOCHS, SEED = (0.001, 0.3), 2, 0


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    y = np.arange(18) % 3
    x = (rng.normal(size=(18, 2, 32)) + y[:, None, None]).astype(np.float32)
    torch.manual_seed(0)
    model = sensors.SensorCNN(2, 3, width=4).eval()
    return model, (x[:12], y[:12]), (x[12:], y[12:])


def test_each_side_takes_its_own_best_lr(case):
    model, fit, val = case
    calib = [fit[0][i:i + 1] for i in range(4)]
    scheme = et.Sparse()
    got = sensors.choose_lrs(model, scheme, fit, val, GRID, EPOCHS, SEED, calib)
    assert set(got) == {"edgetrain", "torch", "headroom"} and got["headroom"][0] == 1
    for lr, scores in (got["edgetrain"], got["torch"]):
        assert set(scores) == set(GRID) and all(0.0 <= s <= 1.0 for s in scores.values())
        assert lr == min(l for l in GRID if scores[l] == max(scores.values()))  # the best, ties: the smaller
    # each score is that side's own fine-tune at that lr
    for lr in GRID:
        prog = et.compile(model, (torch.from_numpy(fit[0][:1]),), update=scheme, quantize="int8",
                          optimizer=et.SGD(lr=lr, qas=True, seed=SEED), calibration=calib)
        rng = np.random.default_rng(SEED)
        for _ in range(EPOCHS):
            for i in rng.permutation(len(fit[1])):
                prog.step(fit[0][i:i + 1], fit[1][i:i + 1])
        assert got["edgetrain"][1][lr] == sensors.top1(prog.predict, *val)
        peer = FineTuner(model, fit, val, FineTune(epochs=EPOCHS, batch=1, lr=lr, momentum=0.0, seed=SEED))
        assert got["torch"][1][lr] == peer.accuracy(dict(prog.trainable))


def test_the_int8_side_chooses_its_headroom_with_its_lr(case):
    """Each (lr, headroom) score is the int8 program's own fine-tune with that headroom; the choice
    is the best, ties to the smaller headroom and then the smaller lr."""
    model, fit, val = case
    calib = [fit[0][i:i + 1] for i in range(4)]
    scheme = et.Sparse()
    heads = (1, 16)
    got = sensors.choose_lrs(model, scheme, fit, val, GRID, EPOCHS, SEED, calib, heads)
    h, grid = got["headroom"]
    assert set(grid) == {(lr, hh) for lr in GRID for hh in heads}
    best = max(grid.values())
    assert (got["edgetrain"][0], h) == min((k for k in grid if grid[k] == best), key=lambda k: (k[1], k[0]))
    assert got["edgetrain"][1] == {lr: grid[lr, h] for lr in GRID}
    prog = sensors.int8_finetune(model, scheme, *fit, GRID[-1], 16, EPOCHS, SEED, calib)
    assert grid[GRID[-1], 16] == sensors.top1(prog.predict, *val)
    assert prog.quant_layers["classifier.weight"].w_scales != \
        sensors.int8_finetune(model, scheme, *fit, GRID[-1], 1, 0, SEED, calib).quant_layers["classifier.weight"].w_scales
