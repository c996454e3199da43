"""`edgetrain inspect` names the submodule of each op beside its model line: every layer of an
nn.Sequential comes from the one line that calls it (issue 34, item 11), and refusals name it too.
A line that names its module itself (`return self.fc(x)`) is left as it is."""
from __future__ import annotations

import re

import pytest
import torch

import edgetrain as et
from edgetrain.app.cli import main

MODEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        return torch.relu(self.conv(x)) + x


class Cummax(nn.Module):
    def forward(self, x):
        return torch.cummax(x, 1).values


class Net(nn.Module):
    def __init__(self, odd=False):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), Block(4), nn.Conv2d(4, 6, 1))
        self.tail = nn.Sequential(Cummax()) if odd else nn.Identity()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        x = self.features(x)
        x = self.tail(x.mean((2, 3)))
        return self.fc(x)


def build(odd=False):
    return Net(odd)
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "seqnet.py"
    path.write_text(MODEL)
    return path


def run(capsys, *argv):
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_names_each_layer_of_a_sequential(capsys, model_file):
    code, out, err = run(capsys, "inspect", f"{model_file}:build", "--input", "1x3x8x8")
    assert code == 0, err
    ops = [line for line in out.splitlines() if re.match(r"\s+\d+: %", line)]
    convs = [line for line in ops if " = conv2d(" in line]
    assert len(convs) == 3
    # the place, the submodule, then the line: each conv tells which layer of the Sequential it is
    assert re.search(r"seqnet\.py:\d+: \[features\.0: Conv2d\] x = self\.features\(x\)$", convs[0])
    assert convs[1].endswith("[features.2.conv: Conv2d] return torch.relu(self.conv(x)) + x")
    assert convs[2].endswith("[features.3: Conv2d] x = self.features(x)")
    relu = next(line for line in ops if " = relu(" in line)
    assert relu.endswith("[features.1: ReLU] x = self.features(x)")
    # an op of the model's own forward names no module
    mean = next(line for line in ops if " = mean(" in line)
    assert mean.endswith("# " + re.search(r"# (\S+seqnet\.py:\d+): x = self\.tail", out).group(1)
                          + ": x = self.tail(x.mean((2, 3)))")
    assert "[" not in mean.split("# ", 1)[1]
    # a line that names the module itself is left as it is
    fc = next(line for line in ops if " = linear(" in line)
    assert re.search(r"seqnet\.py:\d+: return self\.fc\(x\)$", fc) and "[" not in fc.split("# ", 1)[1]


def test_program_and_refusals_carry_the_module_path(model_file):
    import importlib.util

    spec = importlib.util.spec_from_file_location("seqnet", model_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(2, 3, 8, 8)
    prog = et.compile(mod.build(), (x,))
    conv = prog.op_sources["conv2d"]
    assert [re.search(r"\[([^\]]+)\]", line).group(1) for line in conv] == [
        "features.0: Conv2d", "features.2.conv: Conv2d", "features.3: Conv2d"]
    with pytest.raises(et.UnsupportedOpError, match=r"unsupported op aten\.cummax\.default \(at .*seqnet\.py:\d+: "
                                                    r"\[tail\.0: Cummax\] return torch\.cummax\(x, 1\)\.values\)"):
        et.compile(mod.build(odd=True), (x,))
