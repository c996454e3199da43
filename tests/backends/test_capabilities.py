"""The per-backend capability table (backends/capabilities.py): complete (every op of the op
table runs on every backend, the Cortex-M firmware lacking only what needs a file system),
written in docs/backends.md as it is, and read by the compiler: a program with an op its
backend lacks is refused at compile time (exit 2 in the CLI), naming the op and the model
line, before any C is written or built."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends import capabilities as caps
from edgetrain.backends.c import host
from edgetrain.backends.c.kernels import KERNELS
from edgetrain.frontend.capture import UnsupportedOpError
from edgetrain.ops import OPS
from tests.cli.conftest import cli  # noqa: F401  (the in-process `edgetrain` fixture)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends.md"

MODEL_SOURCE = '''
import torch
from torch import nn


class PoolNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        h = self.pool(torch.relu(self.conv(x)))
        return self.fc(torch.sigmoid(h).flatten(1))


def build():
    return PoolNet()
'''


def test_every_op_runs_on_every_backend():
    table = caps.capabilities()
    assert table["reference"].ops == frozenset(OPS)
    assert table["c"].lacks == {}, f"ops without a C kernel: {sorted(table['c'].lacks)}"
    assert table["c"].ops == frozenset(OPS)
    assert dict(table["cortex-m"].lacks) == caps.CORTEX_M_LACKS
    assert set(KERNELS) <= set(OPS), f"kernels for ops the op table lacks: {sorted(set(KERNELS) - set(OPS))}"


def test_docs_list_the_table_as_it_is():
    text = DOCS.read_text()
    assert caps.capability_markdown() in text, "docs/backends.md is out of date: run scripts/gen_backends_doc.py"


@pytest.fixture
def pool_model(tmp_path, monkeypatch):
    path = tmp_path / "poolnet.py"
    path.write_text(MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    mod = importlib.import_module("poolnet")
    yield path, mod.build().eval()


@pytest.fixture
def no_max_pool_kernel(monkeypatch):
    """The C backend as if it had no max pooling kernel; building anything fails the test."""
    monkeypatch.delitem(KERNELS, "max_pool2d", raising=False)
    monkeypatch.delitem(KERNELS, "max_pool2d_grad", raising=False)

    def no_build(*a, **k):
        raise AssertionError("C was built for a program the backend cannot run")

    monkeypatch.setattr(host, "build_library", no_build)
    monkeypatch.setattr(host, "find_cc", no_build)


def test_missing_kernel_is_refused_at_compile_time(pool_model, no_max_pool_kernel, tmp_path):
    path, model = pool_model
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(UnsupportedOpError) as err:
        et.compile(model, (x,), backend="c")
    msg = str(err.value)
    assert "'max_pool2d'" in msg and "'max_pool2d_grad'" in msg
    assert f"{path}:14: h = self.pool(torch.relu(self.conv(x)))" in msg  # the model's line, not torch's
    assert "sigmoid" not in msg  # only what is missing
    prog = et.compile(model, (x,))  # the reference runs it
    for target in ("host", "cortex-m4"):
        out = tmp_path / target
        with pytest.raises(UnsupportedOpError, match="max_pool2d"):
            prog.emit_c(out, target=target)
        assert not out.exists()


def test_cli_compile_refuses_with_exit_2_before_writing(cli, pool_model, no_max_pool_kernel, tmp_path):
    path, _ = pool_model
    out = tmp_path / "fw"
    code, _, err = cli("compile", f"{path}:build", "--input", "1x3x8x8", "--target", "cortex-m4", "-o", str(out))
    assert code == 2, err
    assert "max_pool2d" in err and f"{path}:14" in err
    assert not out.exists()


def test_float64_program_is_refused_on_c():
    model = nn.Sequential(nn.Linear(4, 3)).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    with pytest.raises(UnsupportedOpError, match="float64.*float32"):
        et.compile(model, (x,), backend="c")


def test_page_ops_are_the_hosts_only():
    assert caps.backend_of_target("cortex-m7") == "cortex-m" and caps.backend_of_target("host") == "c"
    m = caps.capabilities()["cortex-m"]
    assert "page_out" not in m.ops and "file system" in m.lacks["page_out"]


def test_origin_of_backward_and_quantized_ops():
    src = {"max_pool2d": ("m.py:3",), "conv2d": ("m.py:1", "m.py:2")}
    assert caps.origin_of("max_pool2d_grad", src) == ("m.py:3",)
    assert caps.origin_of("qconv2d_grad_weight", src) == ("m.py:1", "m.py:2")
    assert caps.origin_of("sgd_update", src) == ()
