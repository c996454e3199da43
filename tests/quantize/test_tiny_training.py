"""The paper's int8 ImageNet-pretrained models (../shared/assets/tiny-training) run through
`compile(..., quantize="int8")` with exactly their published integers and scales."""
from __future__ import annotations

import io
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.data import DataError, load_imagenet_samples
from edgetrain.data.imagenet_samples import center_crop
from edgetrain.app.demo import MBV2_SPARSE_99KB
from edgetrain.models import from_tiny_training
from edgetrain.models.tiny_training import ModelFileError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from tiny_training_file import ASSETS, convs_in_order, load  # noqa: E402

MODELS = ("mbv2-w0.35", "mcunet-5fps", "proxyless-w0.3")
RES = 128
#: resize the shorter side to RES / 0.875, then crop the centre RES x RES (ImageNet evaluation)
RESIZE = 146
BATCH = 4


def model_path(name: str) -> Path:
    path = ASSETS / f"{name}.pkl"
    if not path.is_file():
        pytest.skip(f"{path} is absent: the paper's int8 models come with ../shared/assets")
    return path


@pytest.fixture(scope="module")
def imagenet():
    try:
        images, labels = load_imagenet_samples(RESIZE)
    except DataError as err:
        pytest.skip(str(err))
    x = center_crop(images, RES).transpose(0, 3, 1, 2).astype(np.float32)
    return x, labels


def compile_pretrained(name, num_classes=1000, update=None):
    model = from_tiny_training(model_path(name), num_classes=num_classes)
    x = torch.zeros(BATCH, 3, RES, RES)
    return model, et.compile(model, (x,), update=update or et.LastK(1), quantize="int8",
                             optimizer=et.SGD(lr=0.01, momentum=0.0))


def _producer_source(g):
    producer = {o: n for n in g.nodes for o in n.outputs}

    def source(v):
        while v in producer:
            v = producer[v].inputs[0]
        return v.name
    return source


@pytest.mark.parametrize("name", MODELS)
def test_published_int8_model_classifies_imagenet_samples(name, imagenet):
    x, labels = imagenet
    model, prog = compile_pretrained(name)
    logits = prog.predict(x)
    top5 = np.argsort(-logits, axis=1)[:, :5]
    assert np.mean([labels[i] in top5[i] for i in range(len(labels))]) >= 0.9
    # the float module computes the same up to rounding
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    assert (ref.argmax(1) == logits.argmax(1)).mean() >= 0.8


@pytest.mark.parametrize("name", MODELS)
def test_int8_program_holds_exactly_the_published_integers_and_scales(name):
    model, prog = compile_pretrained(name)
    d = load(name)
    convs = convs_in_order(d)
    g = prog.forward_graph
    source = _producer_source(g)
    qconvs = [n for n in g.nodes if n.op == "qconv2d"]
    assert len(qconvs) == len(convs) + 1  # and the classifier
    for n, spec in zip(qconvs, convs + [d["classifier"]]):
        p = spec["params"]
        w = prog.state[source(n.inputs[1])]
        assert np.array_equal(w.reshape(np.shape(p["weight"])), np.asarray(p["weight"]).astype(np.int8))
        assert np.array_equal(prog.state[source(n.inputs[2])], np.asarray(p["bias"]).astype(np.int32))
        np.testing.assert_allclose(n.attrs["w_scales"], p["w_scales"], rtol=1e-6)
        assert n.attrs["x_zero"] == p["x_zero"]
        np.testing.assert_allclose(n.attrs["x_scale"], p["x_scale"], rtol=1e-6)
        if not n.attrs["float_out"]:  # the 1000-way classifier gives float logits
            assert n.attrs["y_zero"] == p["y_zero"]
            np.testing.assert_allclose(n.attrs["y_scale"], p["y_scale"], rtol=1e-6)
    residuals = [b["residual"]["params"] for b in d["blocks"] if b["residual"] is not None]
    adds = [n for n in g.nodes if n.op == "qadd"]
    assert len(adds) == len(residuals)
    for n, r in zip(adds, residuals):
        assert n.attrs["y_zero"] == r["y_zero"]
        np.testing.assert_allclose(n.attrs["y_scale"], r["y_scale"], rtol=1e-6)


def test_downstream_classifier_trains_with_the_papers_sparse_scheme_and_exports():
    name = "mbv2-w0.35"
    model, prog = compile_pretrained(name, num_classes=10, update=et.Sparse(**MBV2_SPARSE_99KB))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (BATCH, 3, RES, RES)).astype(np.float32)
    y = np.arange(BATCH) % 10
    assert "classifier.weight" in prog.trainable
    assert sum(1 for p in prog.trainable if p.endswith("weight")) == len(MBV2_SPARSE_99KB["weights"]) + 1
    start = {k: v.copy() for k, v in prog.state.items()}
    losses = [prog.step(x, y) for _ in range(3)]
    assert losses[-1] < losses[0]
    frozen = [k for k in prog.state if k not in prog.trainable and not k.startswith("momentum:")]
    assert all(np.array_equal(prog.state[k], start[k]) for k in frozen)
    model.load_state_dict(prog.state_dict())
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    ours = prog.predict(x)
    assert np.abs(ours - ref).max() < 0.1 * np.abs(ref).max() + 0.05


def test_model_file_errors_are_clear(tmp_path):
    with pytest.raises(ModelFileError, match="no model file"):
        from_tiny_training(tmp_path / "missing.pkl")
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ModelFileError, match="cannot read"):
        from_tiny_training(bad)
    evil = tmp_path / "evil.pkl"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"first_conv": io.BytesIO(b"")}))
    with pytest.raises(ModelFileError, match="not allowed"):
        from_tiny_training(evil)
    with pytest.raises(ValueError, match="num_classes"):
        from_tiny_training(evil, num_classes=0)
