"""Fuzzing the command line's inputs and the capture (hypothesis): whatever comes in, the answer
is a result or one of our clear errors (exit code 2 or 3), never a traceback."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import edgetrain as et
from edgetrain.config import parse_bytes
from edgetrain.data import DataError
from edgetrain.data.folder import decode_image, load_folder
from edgetrain.app.usermodel import InputSpecError, ModelLoadError, load_model, parse_input, parse_model_spec

from .conftest import INPUT

FAST = settings(max_examples=150, deadline=None, derandomize=True)
SLOW = settings(max_examples=10, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

shape_text = st.lists(st.integers(0, 300).map(str), min_size=1, max_size=5).map("x".join)
input_text = st.one_of(
    st.text(max_size=30),
    st.tuples(shape_text, st.sampled_from(["", ":float32", ":int64", ":int32", ":float64", ":int64:7", ":", "::"]))
    .map("".join))


@FAST
@given(input_text)
def test_fuzz_input_spec(text):
    try:
        spec = parse_input(text)
    except InputSpecError as err:
        assert "--input" in str(err)
        return
    assert all(d >= 1 for d in spec.shape) and parse_input(str(spec)) == spec


@FAST
@given(st.one_of(st.text(max_size=20),
                 st.tuples(st.floats(allow_nan=True, allow_infinity=True).map(str),
                           st.sampled_from(["", "B", "KB", "kib", "M", "GB", "TB", "x"])).map("".join),
                 st.integers(-10, 10**12), st.floats(allow_nan=True), st.booleans()))
def test_fuzz_byte_sizes(value):
    try:
        n = parse_bytes(value, "--sram")
    except ValueError as err:
        assert "--sram" in str(err)
        return
    assert isinstance(n, int) and n > 0


@FAST
@given(st.one_of(st.text(max_size=40), st.text(max_size=20).map(lambda s: s + ".py"),
                 st.tuples(st.text(max_size=10), st.text(max_size=10)).map(lambda t: f"{t[0]}.py:{t[1]}")))
def test_fuzz_model_spec(text):
    try:
        spec = parse_model_spec(text)
    except ModelLoadError as err:
        assert str(err)
        return
    assert spec.is_file or spec.name in et.models.names()


python_ish = st.lists(st.sampled_from(["def build(", "):", "\n", "    ", "return ", "nn.Linear(2, 3)", "import torch",
                                       "from torch import nn", "1/0", "(", "]", "lambda: 0", "class build:", "pass",
                                       "raise", " ", "x", "=", "build = None", "\t", '"', "#"]),
                      max_size=25).map("".join)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200), python_ish.map(str.encode)))
def test_fuzz_model_files(tmp_path, data):
    path = tmp_path / "fuzzed.py"
    path.write_bytes(data)
    try:
        model = load_model(f"{path}:build")
    except ModelLoadError as err:
        assert str(path) in str(err)
        return
    assert isinstance(model, nn.Module)


def _png(side: int, seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300),
                 st.tuples(st.integers(1, 40), st.integers(0, 9), st.integers(0, 400), st.binary(max_size=8))
                 .map(lambda t: (lambda b: b[:t[2]] + t[3] + b[t[2] + len(t[3]):])(_png(t[0], t[1])))),
       st.sampled_from([".png", ".jpg", ".bmp", ".gif"]))
def test_fuzz_image_files(tmp_path, data, suffix):
    """Random bytes and damaged PNGs: decoded to the model's size, or a DataError naming the file."""
    path = tmp_path / f"img{suffix}"
    path.write_bytes(data)
    try:
        a = decode_image(path, (3, 8, 8))
    except DataError as err:
        assert str(path) in str(err)
        return
    assert a.shape == (8, 8, 3) and a.dtype == np.uint8


def test_fuzzed_folder_through_the_cli(cli, model_file, tmp_path):
    """A folder of random bytes and damaged images: `edgetrain train` lists every unreadable one
    and writes nothing; with --skip-bad-images it trains on the rest."""
    rng = np.random.default_rng(0)
    root = tmp_path / "d"
    bad = []
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(4):
            (root / c / f"good{i}.png").write_bytes(_png(10, i))
            raw = rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8).tobytes()
            (root / c / f"bad{i}.jpg").write_bytes(raw)
            bad.append(root / c / f"bad{i}.jpg")
    code, _, err = cli("train", f"{model_file}:build", "--input", INPUT, "--data", root, "-o", tmp_path / "run")
    assert code == 2 and "Traceback" not in err and "8 of 16 images" in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(DataError):
        load_folder(root, (3, 16, 16))
    assert len(load_folder(root, (3, 16, 16), skip_bad=True)) == 8


@SLOW
@given(inputs=st.lists(st.one_of(st.sampled_from([INPUT, INPUT, "2x3x16x16", "1x3x8x8", "1x3x16", "1x4x16x16",
                                                   "1x3x16x16:int64", "1x3x9x7"]), input_text), min_size=0, max_size=2),
       sram=st.one_of(st.none(), st.sampled_from(["1", "2KB", "64KB", "1MB", "-3KB", "0", "1e3", "KB", "9" * 30])),
       update=st.sampled_from(["full", "bias", "last:1", "last:3", "last:0", "auto", "sparse", "LAST:2"]),
       arg=st.one_of(st.none(), st.sampled_from(["width=4", "width=0", "width=-1", "width='x'", "nonsense",
                                                  "num_classes=2", "depth=3", "width=1e9"])))
def test_fuzz_compile_options(cli, model_file, tmp_path_factory, inputs, sram, update, arg):
    out = tmp_path_factory.mktemp("fuzz") / "out"
    argv = ["compile", f"{model_file}:build", "--target", "host", "--no-plot", "-o", out, "--update", update]
    for t in inputs:
        argv += [f"--input={t}"]
    if sram is not None:
        argv += [f"--sram={sram}"]
    if arg is not None:
        argv += ["--model-arg", arg]
    code, _, err = cli(*argv)
    assert code in (0, 2, 3), err
    assert "Traceback" not in err and "internal error" not in err, err
    if code:
        assert err.strip() and not out.exists()


LAYERS = st.sampled_from(["conv", "dwconv", "bn", "relu", "relu6", "avgpool", "maxpool", "add_self", "sigmoid",
                          "hardswish", "gelu", "dropout", "flip", "cumsum"])


def _build(names, seed):
    torch.manual_seed(seed)
    layers, c = [], 4
    for n in names:
        if n == "conv":
            layers.append(nn.Conv2d(c, 6, 3, padding=1))
            c = 6
        elif n == "dwconv":
            layers.append(nn.Conv2d(c, c, 3, padding=1, groups=c))
        elif n == "bn":
            bn = nn.BatchNorm2d(c)
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
            layers.append(bn)
        elif n in ("relu", "relu6", "sigmoid", "hardswish", "gelu"):
            layers.append({"relu": nn.ReLU, "relu6": nn.ReLU6, "sigmoid": nn.Sigmoid, "hardswish": nn.Hardswish,
                           "gelu": nn.GELU}[n]())
        elif n == "avgpool":
            layers.append(nn.AvgPool2d(2, 1))
        elif n == "maxpool":
            layers.append(nn.MaxPool2d(2, 1))
        elif n == "dropout":
            layers.append(nn.Dropout(0.3))
        else:
            layers.append(_Lambda(n))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 3)).eval()


class _Lambda(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        if self.kind == "add_self":
            return x + x * 0.5
        if self.kind == "flip":
            return torch.flip(x, (3,))
        return torch.cumsum(x, 1)


@SLOW
@given(names=st.lists(LAYERS, max_size=5), seed=st.integers(0, 100))
def test_fuzz_capture(names, seed):
    """Random small models: compiled programs predict what torch computes, or capture says
    which op it cannot take (a CaptureError, a ValueError), naming the model's line."""
    model = _build(names, seed)
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(seed))
    try:
        prog = et.compile(model, (x,), update=et.LastK(1))
    except et.CaptureError as err:
        assert "unsupported op" in str(err) or "cannot" in str(err), err
        return
    with torch.no_grad():
        np.testing.assert_allclose(prog.predict(x), model(x).numpy(), rtol=1e-4, atol=1e-5)
    loss = prog.step(x, torch.tensor([1]))
    assert np.isfinite(loss)
