"""Contribution analysis: the trainer trains exactly the channels compile() trains, caching
the frozen bottom changes nothing, tables round-trip through JSON."""
import json
import warnings

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.app.demo import pretrained_digitnet
from edgetrain.sparse import (ContributionError, ContributionTable, FineTune, FineTuneError, analyze_contributions,
                              scheme_accuracies, scheme_accuracy, scheme_layers)
from edgetrain.sparse.contribution import as_table, best_bias_depth
from edgetrain.sparse.finetune import FineTuner

from ..models.tiny_training_file import ASSETS
from .nets import SIZE, task, tiny_net

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

FAST = FineTune(epochs=1, batch=8, lr=0.05, momentum=0.9, seed=0)
SCHEME = et.Sparse(bias_last=3, weights={2: 0.5, 3: 0.25, 6: 1.0, 7: 0.125})


@pytest.fixture(scope="module")
def data():
    return task(96, seed=1), task(64, seed=2)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_scheme_layers_resolve_as_compile(quantize):
    model = tiny_net()
    x = torch.from_numpy(task(2)[0])
    prog = et.compile(model, (x,), update=SCHEME, quantize=quantize)
    assert scheme_layers(model, (x,), quantize).resolve(SCHEME) == prog.trainable
    assert prog.scheme == SCHEME


def test_scheme_layers_use_the_folded_weights_for_int8():
    """DigitNet has batch norm: int8 picks channels by the folded weights' norms, as compile."""
    model = pretrained_digitnet()
    x = torch.zeros(2, 1, 28, 28)
    scheme = et.Sparse(bias_last=2, weights={1: 0.25, 2: 0.25, 3: 0.5})
    sl = scheme_layers(model, (x,), "int8")
    assert sl.folded
    assert sl.resolve(scheme) == et.compile(model, (x,), update=scheme, quantize="int8").trainable


def test_only_selected_channels_change(data):
    model = tiny_net()
    trainable = scheme_layers(model, (torch.from_numpy(data[0][0][:1]),), "int8").resolve(SCHEME)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    tuner = FineTuner(model, *data, FAST)
    _, trained = tuner.trained(trainable)
    assert set(trained) == set(trainable)
    for name, sel in trainable.items():
        changed = (trained[name] != before[name])
        if sel is None:
            assert changed.any(), name
            continue
        other = [d for d in range(changed.ndim) if d != sel.dim]
        per_channel = changed.any(dim=tuple(other)) if other else changed
        assert set(torch.nonzero(per_channel).flatten().tolist()) <= set(sel.index), name
        assert per_channel[list(sel.index)].any(), name
    # neither the caller's model nor the tuner's starting weights moved
    assert all(torch.equal(p, before[k]) for k, p in model.named_parameters())
    assert all(torch.equal(p, before[k]) for k, p in tuner.model.named_parameters())


def test_feature_cache_gives_the_same_training(data):
    model = tiny_net()
    sl = scheme_layers(model, (torch.from_numpy(data[0][0][:1]),), "int8")
    runs = {"deep": sl.resolve(et.Sparse(weights={5: 0.5})), "top": sl.resolve(et.Sparse(bias_last=1)),
            "all": sl.resolve(et.BiasOnly())}
    cached, plain = {}, {}
    FineTuner(model, *data, FAST).accuracies(runs, keep=cached)
    FineTuner(model, *data, FAST, cache_features=False).accuracies(runs, keep=plain)
    for key in runs:
        assert cached[key][0] == plain[key][0]
        for name in cached[key][1]:
            torch.testing.assert_close(cached[key][1][name], plain[key][1][name], rtol=1e-5, atol=1e-6)


def test_cuts_skip_residual_blocks(data):
    tuner = FineTuner(tiny_net(), *data, FAST)
    cuts = tuner.cuts
    inside = cuts.cut_below(["block2.depthwise.weight"])
    assert inside == cuts.cut_below(["block2.pointwise1.bias"])  # the block's input: the residual crosses
    x = torch.from_numpy(data[1][0][:5])
    with torch.no_grad():
        two_parts = cuts.segment(inside, None)(cuts.segment(-1, inside)(x))
        torch.testing.assert_close(two_parts, tuner.model(x))


def test_analysis_table_and_json(data, tmp_path):
    model = tiny_net()
    table = analyze_contributions(model, *data, name="tiny", layers=[5, 7], ratios=[0.5, 1], bias_ks=[1, 4],
                                  config=FAST, meta={"dataset": "quadrants"})
    sl = scheme_layers(model, (torch.zeros(1, 3, SIZE, SIZE),))
    assert table.layers == tuple(layer.weight for layer in sl.dense[:-1])
    assert set(table.bias_gains) == {1, 4} and set(table.weight_gains) == {(5, 0.5), (5, 1.0), (7, 0.5), (7, 1.0)}
    assert 0 <= table.base_accuracy <= 1 and table.meta["dataset"] == "quadrants" and table.meta["train_images"] == 96
    assert 0 <= table.stderr < 0.2  # paired over 64 test images
    # weight gains are over the bias-only update with the largest gain (the paper's definition)
    # when that gain clears the noise, else over the classifier alone
    assert table.weight_base == best_bias_depth(table.bias_gains, dict(zip((1, 4), table.meta["bias_stderr"])))
    on_biases = table.base_accuracy + table.bias_gains.get(table.weight_base, 0.0)
    acc = scheme_accuracy(model, et.Sparse(bias_last=table.weight_base, weights={7: 1.0}), *data, config=FAST)
    assert acc == pytest.approx(on_biases + table.weight_gains[7, 1.0])
    assert ContributionTable.from_json(table.to_json()) == table
    path = table.save(tmp_path / "sub" / "t.json")
    assert as_table(str(path)) == table and json.loads(path.read_text())["model"] == "tiny"
    assert [d for d, _ in table.top(2)] == [d for d, _ in sorted(
        [(f"bias last {k}", g) for k, g in table.bias_gains.items()]
        + [(f"layer {i} weights x{r:g}", g) for (i, r), g in table.weight_gains.items()], key=lambda t: -t[1])[:2]]


def test_weight_gains_over_a_given_bias_depth(data):
    model = tiny_net()
    table = analyze_contributions(model, *data, layers=[7], ratios=[1.0], bias_ks=[1], weight_base=0, config=FAST)
    assert table.weight_base == 0
    acc = scheme_accuracy(model, et.Sparse(weights={7: 1.0}), *data, config=FAST)
    assert acc == pytest.approx(table.base_accuracy + table.weight_gains[7, 1.0])
    table = analyze_contributions(model, *data, layers=[7], ratios=[1.0], bias_ks=[1], weight_base=3, config=FAST)
    on_biases = scheme_accuracy(model, et.Sparse(bias_last=3), *data, config=FAST)
    acc = scheme_accuracy(model, et.Sparse(bias_last=3, weights={7: 1.0}), *data, config=FAST)
    assert (table.weight_base, set(table.bias_gains)) == (3, {1})
    assert acc == pytest.approx(on_biases + table.weight_gains[7, 1.0])
    assert ContributionTable.from_json(table.to_json()).weight_base == 3


def test_analysis_is_deterministic(data):
    kw = dict(layers=[6], ratios=[1.0], bias_ks=[2], config=FAST)
    a, b = (analyze_contributions(tiny_net(), *data, **kw) for _ in range(2))
    assert (a.base_accuracy, a.bias_gains, a.weight_gains) == (b.base_accuracy, b.bias_gains, b.weight_gains)
    assert {k: v for k, v in a.meta.items() if k != "seconds"} == {k: v for k, v in b.meta.items() if k != "seconds"}


def test_scheme_accuracies_of_whole_schemes(data):
    acc = scheme_accuracies(tiny_net(), {"bias": et.BiasOnly(), "last2": et.LastK(2), "full": et.Full()}, *data,
                            config=FAST)
    assert set(acc) == {"bias", "last2", "full"} and all(0 <= v <= 1 for v in acc.values())


def test_bad_inputs_are_named(data, tmp_path):
    with pytest.raises(ContributionError, match="layers Sparse can name"):
        analyze_contributions(tiny_net(), *data, layers=[8], config=FAST)
    with pytest.raises(ContributionError, match="weight_base"):
        analyze_contributions(tiny_net(), *data, layers=[7], weight_base=99, config=FAST)
    with pytest.raises(ContributionError, match="ratios"):
        analyze_contributions(tiny_net(), *data, layers=[7], ratios=[2.0], config=FAST)
    with pytest.raises(FineTuneError, match="labels must be integers"):
        FineTuner(tiny_net(), data[0], (data[1][0], data[1][1].astype(np.float32)))
    with pytest.raises(FineTuneError, match="epochs"):
        FineTune(epochs=0)
    with pytest.raises(ContributionError, match="no contribution table"):
        ContributionTable.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ContributionError, match="not a contribution table"):
        ContributionTable.load(tmp_path / "bad.json")
    with pytest.raises(ContributionError, match="out of range"):
        ContributionTable("m", ("a.weight",), 0.5, {2: 0.1}, {})
    with pytest.raises(ContributionError, match="measured on a model with 1 layers"):
        ContributionTable("m", ("a.weight",), 0.5, {1: 0.1}, {}).check_layers(["b.weight", "c.weight"])


def test_folded_biases_need_a_folded_float_model():
    """int8 schemes of a batch-norm model train folded biases the float model lacks."""
    model = pretrained_digitnet()
    x = np.zeros((8, 1, 28, 28), np.float32)
    y = np.zeros(8, np.int64)
    with pytest.raises(FineTuneError, match="fold batch norm"):
        scheme_accuracy(model, et.Sparse(bias_last=1), (x, y), (x, y), config=FAST)


@pytest.mark.skipif(not (ASSETS / "mbv2-w0.35.pkl").exists(),
                    reason="the paper's int8 models live in ../shared/assets/tiny-training")
def test_paper_model_channels_match_compile_and_cut_between_blocks():
    model = et.models.from_tiny_training(ASSETS / "mbv2-w0.35.pkl", num_classes=10)
    x = torch.zeros(1, 3, 128, 128)
    scheme = et.Sparse(bias_last=25, weights={27: 1, 30: 1, 42: 0.125, 45: 0.5, 48: 1})
    sl = scheme_layers(model, (x,), "int8")
    assert sl.n_sparse_layers == 51
    assert sl.resolve(scheme) == et.compile(model, (x,), update=scheme, quantize="int8").trainable
    tuner = FineTuner(model, (np.zeros((8, 3, 128, 128), np.float32), np.zeros(8, np.int64)),
                      (np.zeros((2, 3, 128, 128), np.float32), np.zeros(2, np.int64)), FAST)
    cut = tuner.cuts.cut_below(["blocks.14.depthwise.conv.weight"])
    assert tuner.cuts.nodes[cut].name.startswith("blocks_13_pointwise2")  # block 14 is residual: its input
