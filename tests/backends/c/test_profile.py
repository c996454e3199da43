"""CRunner.node_seconds: the clocks a host library built with host.PROFILE_FLAG keeps per node
(bench/step_speed.py --profile reads them)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import CBackendError
from edgetrain.backends.c.graph_lib import FAST_CFLAGS
from edgetrain.backends.c.host import PROFILE_FLAG, to_c_program


def _program(flags):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    ref = et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.01, momentum=0.9))
    return ref, to_c_program(ref, FAST_CFLAGS + (PROFILE_FLAG,)) if flags else to_c_program(ref, FAST_CFLAGS), x


def test_node_seconds_add_up_within_the_steps_and_leave_the_numbers_alone():
    ref, c, x = _program(True)
    xin, y = np.ascontiguousarray(x.numpy()), np.array([1, 3], dtype=np.int64)
    nodes = c.runner.c_layout.graphs["train"].graph.nodes
    start = c.runner.node_seconds("train")
    assert start.shape == (len(nodes),) and start.dtype == np.float64
    assert not start.any()  # nothing ran yet
    losses = [c.runner.raw_step(xin, y) for _ in range(3)]
    got = c.runner.node_seconds("train")
    assert (got >= 0).all() and got.sum() > 0
    assert not c.runner.node_seconds("forward").any()  # the steps ran the training graph only
    conv = [i for i, n in enumerate(nodes) if n.op == "conv2d"]
    assert conv and all(got[i] > 0 for i in conv)
    # the clocks only add up: a copy taken earlier stays as it was, and the next reading is not smaller
    kept = got.copy()
    losses.append(c.runner.raw_step(xin, y))
    assert np.array_equal(got, kept) and (c.runner.node_seconds("train") >= got).all()
    # the profiled build computes what the plain build computes: the same losses and state, bit for bit
    _, plain, _ = _program(False)
    assert [plain.runner.raw_step(xin, y) for _ in range(4)] == losses
    assert plain.step(x.numpy(), y) == c.step(x.numpy(), y)
    for k in plain.state:
        assert np.array_equal(plain.state[k], c.state[k]), k
    # the predict graph has clocks of its own
    c.predict(x.numpy())
    assert c.runner.node_seconds("forward").sum() > 0


def test_node_seconds_refuse_a_library_without_the_clocks_and_an_unknown_graph():
    _, plain, _ = _program(False)
    with pytest.raises(CBackendError, match="without -DET_PROFILE"):
        plain.runner.node_seconds()
    _, c, _ = _program(True)
    with pytest.raises(CBackendError, match="graph='backward'"):
        c.runner.node_seconds("backward")
