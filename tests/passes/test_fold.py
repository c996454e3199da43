"""fold_batchnorm on small hand-built graphs: an eval-mode batch norm right after a
convolution is merged into the convolution's weight and bias; the folded graph verifies and
computes what the graph computed before (float64); a batch norm that cannot be folded stays."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, Role, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.passes.fold import FoldedNorm, fold_batchnorm

GEO = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
EPS = 1e-5


def _arrays(rng, conv_bias=True, affine=True):
    a = {"conv.weight": rng.standard_normal((4, 3, 3, 3)), "bn.running_mean": rng.standard_normal(4) * 0.2,
         "bn.running_var": rng.uniform(0.5, 2.0, 4)}
    if conv_bias:
        a["conv.bias"] = rng.standard_normal(4) * 0.1
    if affine:
        a["bn.weight"], a["bn.bias"] = rng.uniform(0.5, 1.5, 4), rng.standard_normal(4) * 0.1
    return a


def conv_bn_graph(arrays, extra_reader=False):
    """x -> conv2d -> batch_norm -> relu -> output (and, with extra_reader, the conv's output
    also read by a second node and returned)."""
    x = new_value(TensorType((2, 3, 5, 5), "float64"), "x")
    params = {k: new_value(TensorType(v.shape, "float64"), k) for k, v in arrays.items()}
    e = Emitter()
    conv_in = [params["conv.weight"]] + ([params["conv.bias"]] if "conv.bias" in params else [])
    y = e.emit("conv2d", x, *conv_in, **GEO)
    norm_in = [params["bn.running_mean"], params["bn.running_var"]]
    if "bn.weight" in params:
        norm_in += [params["bn.weight"], params["bn.bias"]]
    z = e.emit("relu", e.emit("batch_norm", y, *norm_in, eps=EPS))
    outs, names = [z], ["output"]
    if extra_reader:
        outs.append(e.emit("neg", y))
        names.append("raw")
    return Graph((x, *params.values()), tuple(e.nodes), tuple(outs), tuple(names))


def _run(g, arrays, x):
    return run_graph(g, {"x": x, **{k: v.copy() for k, v in arrays.items()}})[0]


@pytest.mark.parametrize("conv_bias", [True, False], ids=["conv_bias", "no_conv_bias"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_a_batch_norm_after_a_conv_folds_into_it(conv_bias, affine):
    rng = np.random.default_rng(0)
    arrays = _arrays(rng, conv_bias, affine)
    g = verify(conv_bn_graph(arrays))
    x = rng.standard_normal((2, 3, 5, 5))
    folded, new_arrays, folds = fold_batchnorm(g, arrays)
    verify(folded)
    assert [n.op for n in folded.nodes] == ["conv2d", "relu"]
    assert len(folded.nodes[0].inputs) == 3  # the conv now has a bias: the norm's shift
    assert set(new_arrays) == {"conv.weight", "conv.bias"}  # the norm's tensors are gone
    assert {v.name for v in folded.inputs} == {"x", "conv.weight", "conv.bias"}
    assert folds == [FoldedNorm("conv.weight", "conv.bias", "conv.bias" if conv_bias else None, "bn.running_mean",
                                "bn.running_var", "bn.weight" if affine else None, "bn.bias" if affine else None,
                                EPS)]
    assert arrays["conv.weight"] is not new_arrays["conv.weight"]  # the caller's arrays are left as they were
    np.testing.assert_allclose(_run(folded, new_arrays, x)["output"], _run(g, arrays, x)["output"],
                               rtol=1e-12, atol=1e-12)


def test_a_new_bias_name_does_not_clash():
    rng = np.random.default_rng(1)
    arrays = _arrays(rng, conv_bias=False)
    arrays["conv.bias"] = np.zeros(2)  # a tensor of that name exists, unrelated to the conv
    g = conv_bn_graph({k: v for k, v in arrays.items() if k != "conv.bias"})
    g = g.with_inputs({new_value(TensorType((2,), "float64"), "conv.bias"): Role.FROZEN})
    folded, _, (fold,) = fold_batchnorm(g, arrays)
    assert fold.bias == "conv.bias_folded" and fold.conv_bias is None
    verify(folded)


def test_a_conv_output_read_twice_is_not_folded():
    rng = np.random.default_rng(2)
    arrays = _arrays(rng)
    g = verify(conv_bn_graph(arrays, extra_reader=True))
    folded, new_arrays, folds = fold_batchnorm(g, arrays)
    assert folds == [] and [n.op for n in folded.nodes] == [n.op for n in g.nodes]
    assert set(new_arrays) == set(arrays)


def test_statistics_that_are_not_constants_are_not_folded():
    """A batch norm whose statistics are not bound in `arrays` (e.g. fed at run time) stays."""
    rng = np.random.default_rng(3)
    arrays = _arrays(rng)
    g = conv_bn_graph(arrays)
    bound = {k: v for k, v in arrays.items() if k != "bn.running_var"}
    folded, new_arrays, folds = fold_batchnorm(g, bound)
    assert folds == [] and "batch_norm" in [n.op for n in folded.nodes]
    verify(folded)
    assert set(new_arrays) == set(bound)
