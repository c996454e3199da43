"""Fine-tunes as independent pieces: a piece computes what the in-process trainer computes,
bit for bit, whatever order pieces come in; a contribution analysis saved to a results file
is taken from it on a rerun, and a file of another job is refused."""
import warnings

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.scale import ScaleError
from edgetrain.sparse import FineTune, analyze_contributions, scheme_accuracies, scheme_layers
from edgetrain.sparse.finetune import FineTuner
from edgetrain.sparse.pieces import correct_of, piece_key, release, tune_job, tune_piece

from .nets import FAST, GRID, Counting, task, tiny_net

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)



@pytest.fixture(scope="module")
def data():
    return task(96, seed=1), task(64, seed=2)


def test_pieces_in_any_order_equal_the_trainer(data):
    """Features reached from a lower cached cut or from the images are the same bits."""
    model = tiny_net()
    sl = scheme_layers(model, (torch.from_numpy(data[0][0][:1]),), "int8")
    schemes = [et.Sparse(bias_last=2), et.Sparse(weights={6: 1.0}), et.Sparse(weights={2: 0.5}),
               et.Sparse(bias_last=1, weights={5: 0.25}), et.Sparse(weights={0: 1.0})]
    runs = {i: sl.resolve(s) for i, s in enumerate(schemes)}
    kept = {}
    FineTuner(model, *data, FAST).accuracies(runs, keep=kept)
    job = tune_job(model, *data, FAST)
    try:
        for i in [1, 3, 0, 2, 4, 1]:  # down and up the cuts, and one run twice
            out = tune_piece(job, runs[i])
            assert out["top1"] == kept[i][0]
            assert np.array_equal(correct_of(out, len(data[1][1])), kept[i][2])
    finally:
        release()
    assert len({piece_key(t) for t in runs.values()}) == len(runs)


def test_a_rerun_takes_the_analysis_from_its_results_file(data, tmp_path):
    path = tmp_path / "contrib.jsonl"
    first, again = Counting(), Counting()
    table = analyze_contributions(tiny_net(), *data, **GRID, executor=first, results=path)
    assert len(first.ran) == 1 + 2 + 3 * 2  # base, two bias depths, three layers at two ratios
    labels = []
    rerun = analyze_contributions(tiny_net(), *data, **GRID, executor=again, results=path,
                                  progress=lambda label, top1: labels.append(label))
    assert again.ran == [] and len(labels) == 9
    plain = analyze_contributions(tiny_net(), *data, **GRID)
    for t in (rerun, plain):
        assert (t.base_accuracy, t.bias_gains, t.weight_gains, t.stderr, t.weight_base) == \
            (table.base_accuracy, table.bias_gains, table.weight_gains, table.stderr, table.weight_base)
    # other settings are another job: its results would differ, so the file is refused
    with pytest.raises(ScaleError, match="another job"):
        analyze_contributions(tiny_net(), *data, **{**GRID, "config": FineTune(epochs=1, batch=8, lr=0.01)},
                              results=path)
    # scheme accuracies share the pieces: the schemes the analysis trained are not trained again
    schemes = {"bias": et.Sparse(bias_last=2), "new": et.Sparse(weights={6: 0.25})}
    counted = Counting()
    acc = scheme_accuracies(tiny_net(), schemes, *data, config=FAST, executor=counted, results=path)
    assert len(counted.ran) == 1
    assert acc == scheme_accuracies(tiny_net(), schemes, *data, config=FAST)
