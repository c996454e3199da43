"""Capture in one trace (frontend/capture.py `_one_trace`): torch's aot-dispatch export with the
decomposition table's composite-implicit entries in force gives the program of the public path
(`torch.export.export` then `run_decompositions`), the same IR to the letter, and is taken only
where it does: a graph that still holds an op of the table's Python decompositions, or a failure,
falls back to the public path."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.ir.printer import format_graph

capture_module = importlib.import_module("edgetrain.frontend.capture")

pytestmark = pytest.mark.fresh_capture  # each capture exports: the memo would hand back the first path's program


def _snapshot(c) -> tuple:
    arrays = lambda d: {k: (v.shape, v.dtype, v.tobytes()) for k, v in d.items()}  # noqa: E731
    return (format_graph(c.graph), arrays(c.params), c.frozen_params, arrays(c.buffers), c.inputs, c.source)


def _capture(model, args, monkeypatch, one_trace: bool):
    """(snapshot of the capture, whether the public path ran)"""
    ran = []
    two = capture_module._two_traces
    monkeypatch.setattr(capture_module, "ONE_TRACE", one_trace)
    monkeypatch.setattr(capture_module, "_two_traces", lambda *a: ran.append(1) or two(*a))
    return _snapshot(capture_module.capture(model, args)), bool(ran)


class _Sensor(torch.nn.Module):
    """A 1-D convolution, batch norm, a mean over time and a linear head: no Python decomposition on
    its path (adaptive_avg_pool1d would leave squeeze.dim)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 8, 5, padding=2)
        self.bn = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean(-1))


def _zoo(name):
    return et.models.get(name, num_classes=10).eval(), (et.models.example_input(name, batch=1, seed=0),)


# (model, whether one trace gives the program): bert-tiny's attention leaves transpose.int and
# _unsafe_view, which only the public path's second trace decomposes
CASES = {"mbv2-w0.35": (lambda: _zoo("mbv2-w0.35"), True),
         "ad-autoencoder": (lambda: _zoo("ad-autoencoder"), True),
         "sensor-cnn": (lambda: (_Sensor().eval(), (torch.randn(2, 3, 32),)), True),
         "bert-tiny": (lambda: _zoo("bert-tiny"), False)}


@pytest.mark.parametrize("name", list(CASES))
def test_one_trace_gives_the_public_paths_ir(name, monkeypatch):
    make, one = CASES[name]
    torch.manual_seed(0)
    model, args = make()
    public, ran = _capture(model, args, monkeypatch, one_trace=False)
    assert ran
    fast, ran = _capture(model, args, monkeypatch, one_trace=True)
    assert ran is not one  # one trace where it gives the program, else the public path
    assert fast == public


def test_a_failing_one_trace_falls_back(monkeypatch):
    model, args = _Sensor().eval(), (torch.randn(2, 3, 32),)
    want, _ = _capture(model, args, monkeypatch, one_trace=False)
    real = torch.export._trace._export

    def fails_without_pre_dispatch(*a, pre_dispatch=False, **k):  # the public path's export passes True
        if not pre_dispatch:
            raise RuntimeError("not traceable this way")
        return real(*a, pre_dispatch=pre_dispatch, **k)

    monkeypatch.setattr(torch.export._trace, "_export", fails_without_pre_dispatch)
    got, ran = _capture(model, args, monkeypatch, one_trace=True)
    assert ran and got == want


def test_a_model_neither_path_captures_is_one_capture_error(monkeypatch):
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # control flow on a value: no trace takes it

    monkeypatch.setattr(capture_module, "ONE_TRACE", True)
    with pytest.raises(et.CaptureError, match="torch.export could not capture DataDependent"):
        capture_module.capture(DataDependent(), (torch.ones(2, 3),))


def test_the_one_trace_program_trains_as_torch():
    """A step of the one-trace capture against torch.autograd: the gradients of a float model."""
    torch.manual_seed(0)
    model, x = _Sensor(), torch.randn(4, 3, 32)
    y = np.array([0, 1, 2, 3])
    prog = et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.0))
    grads = prog.gradients(x.numpy(), y)
    model.eval()
    torch.nn.functional.cross_entropy(model(x), torch.as_tensor(y)).backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-5)
