"""Loading a user's model file and reading --input: every mistake gives a clear error naming
the file and line."""
from __future__ import annotations

import pytest
import torch

from edgetrain.app.usermodel import (InputSpec, InputSpecError, ModelLoadError, check_forward, example_inputs,
                                 load_model, parse_input, parse_model_args, parse_model_spec)

from .conftest import INPUT


def test_parse_input():
    assert parse_input("1x3x128x128") == InputSpec((1, 3, 128, 128))
    assert parse_input(" 2X16 ") == InputSpec((2, 16))
    assert parse_input("1x128:int64") == InputSpec((1, 128), "int64")
    assert parse_input("1x128:int64:30522") == InputSpec((1, 128), "int64", 30522)
    assert str(parse_input("1x128:int64:30522")) == "1x128:int64:30522"
    x, t = example_inputs([parse_input("2x3"), parse_input("2x5:int64:7")])
    assert x.dtype == torch.float32 and x.shape == (2, 3)
    assert t.dtype == torch.int64 and int(t.max()) < 7
    assert torch.equal(example_inputs([parse_input("2x3")])[0], x)  # deterministic


@pytest.mark.parametrize("text,msg", [
    ("", "write the shape"), ("1x", "write the shape"), ("1x3x-2", "write the shape"), ("1x0x3", "at least 1"),
    ("1x3:float64", "dtype 'float64'"), ("1x3:int64:0", "upper bound"), ("1x3::4", "dtype ''"),
    ("100000x100000x100", "more than"), ("1x3:float32:5", "integer inputs"), ("3.5", "write the shape"),
])
def test_parse_input_errors(text, msg):
    with pytest.raises(InputSpecError, match=msg):
        parse_input(text)


def test_model_specs(model_file, tmp_path):
    spec = parse_model_spec(f"{model_file}:build")
    assert spec.is_file and spec.path == model_file.resolve() and spec.name == "build"
    assert not parse_model_spec("mbv2-w0.35").is_file
    with pytest.raises(ModelLoadError, match=r"name the function .*callables in petnet.py: PetNet, build"):
        parse_model_spec(str(model_file))
    with pytest.raises(ModelLoadError, match="neither"):
        parse_model_spec("resnet19")
    with pytest.raises(ModelLoadError, match="not a Python name"):
        parse_model_spec(f"{model_file}:12x")
    m = load_model(f"{model_file}:build", {"width": 4}, num_classes=5)
    assert isinstance(m, torch.nn.Module) and not m.training and m.head.out_features == 5 and m.stem.out_channels == 4
    # seeded: the same weights every time
    again = load_model(f"{model_file}:build", {"width": 4}, num_classes=5)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), again.state_dict().values()))
    assert parse_model_args(["width=8", "act=relu", "sizes=(1, 2)"]) == {"width": 8, "act": "relu", "sizes": (1, 2)}
    with pytest.raises(ModelLoadError, match="NAME=VALUE"):
        parse_model_args(["8"])


BAD_FILES = {
    "syntax.py": ("import torch\ndef build(:\n    pass\n", r"syntax.py:2:\d+: syntax error"),
    "indent.py": ("def build():\nreturn 1\n", r"indent.py:2:\d+: syntax error: expected an indented block"),
    "importfail.py": ("import torch\nimport no_such_module_xyz\n",
                      r"importing model file .*importfail.py raised ModuleNotFoundError: .*no_such_module_xyz.* at "
                      r".*importfail.py:2"),
    "raises.py": ("def build():\n    width = 3\n    raise ValueError(f'width {width} must be even')\n",
                  r"calling build\(\) raised ValueError: width 3 must be even at .*raises.py:3"),
    "notmodule.py": ("def build():\n    return 42\n", r"returned an object of type int, not a torch.nn.Module"),
    "missing.py": ("def make():\n    pass\n", r"defines no 'build'; it defines make"),
    "notcallable.py": ("build = 3\n", r"build is a int, not a function"),
    "exits.py": ("import sys\nsys.exit(3)\n", r"raised SystemExit"),
    "binary.py": (b"\xff\xfe\x00garbage", r"not UTF-8 text"),
    "nulls.py": ("x = 1\x00\n", r"cannot be compiled|syntax error"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_malformed_model_files(tmp_path, name):
    text, msg = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = path.read_bytes()
    with pytest.raises(ModelLoadError, match=msg):
        load_model(f"{path}:build")
    assert path.read_bytes() == before  # the file is only read


def test_wrong_input_shape(model_file):
    model = load_model(f"{model_file}:build")
    check_forward(model, example_inputs([parse_input(INPUT)]), "petnet", "cross_entropy")
    with pytest.raises(InputSpecError, match=r"does not accept input 1x5x16x16: RuntimeError: .*channels.* at "
                                             r".*petnet.py:\d+: x = torch.relu\(self.bn\(self.stem\(x\)\)\)"):
        check_forward(model, example_inputs([parse_input("1x5x16x16")]), "petnet")
    with pytest.raises(InputSpecError, match=r"does not accept input 1x3x16x16, 1x4: TypeError"):
        check_forward(model, example_inputs([parse_input(INPUT), parse_input("1x4")]), "petnet")


def test_tutorial_model_loads_exported_weights(tmp_path):
    """docs/examples/digits.py (the tutorial's model): `--model-arg weights=FILE` restores what
    `edgetrain export` wrote."""
    from pathlib import Path

    from safetensors.torch import save_file

    spec = f"{Path(__file__).resolve().parents[2] / 'docs' / 'examples' / 'digits.py'}:build"
    fresh = load_model(spec)
    trained = {k: v + 0.5 for k, v in fresh.state_dict().items() if v.is_floating_point()}
    save_file(trained, str(tmp_path / "w.safetensors"))
    loaded = load_model(spec, parse_model_args([f"weights={tmp_path / 'w.safetensors'}"]))
    for k, v in trained.items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert not loaded.training
