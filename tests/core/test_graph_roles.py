"""Compiled programs' graphs carry the role of every input: the passes that add an input give
it (capture: data, parameters, frozen buffers; attach_loss: label; insert_updates: optimizer
state owned by its parameter, step; batchnorm="train": running statistics; a paging schedule:
the page store), and what lives in RAM is derived from them."""
from __future__ import annotations

import functools

import torch
from torch import nn

import edgetrain as et
from edgetrain.devices import get_device
from edgetrain.ir import Role, ram_inputs
from edgetrain.ops import verify
from edgetrain.passes.updates import momentum_name
from edgetrain.remat.build import build_problem
from tests.remat.test_apply import hand_schedule, mixed

SPARSE = et.Sparse(bias_last=4, weights={0: 0.5, 2: 0.25, 5: 1.0})  # as tests/backends/test_matrix.py
MOMENTUM = et.SGD(lr=0.01, momentum=0.9)


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _by_name(g) -> dict:
    return {v.name: r for v, r in zip(g.inputs, g.roles)}


def _check_optimizer_state(prog) -> None:
    """One optimizer-state input per trained parameter, owned by that parameter's input."""
    g = prog.train_graph
    owned = {g.owner(m).name: m.name for m in g.inputs_with(Role.OPTIMIZER_STATE)}
    assert owned == {p: momentum_name(p) for p in prog.trainable}
    assert all(g.role(g.input(p)) is Role.PARAMETER for p in prog.trainable)


@functools.lru_cache(maxsize=None)
def _mcunet(quantize=None, update=SPARSE):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 48, 48)
    kw = dict(quantize="int8", calibration=[x]) if quantize else {}
    return et.compile(et.models.get("mcunet-5fps", num_classes=10).eval(), (x,), update=update,
                      optimizer=MOMENTUM, **kw)


def test_float_program_with_momentum():
    torch.manual_seed(0)
    prog = et.compile(ConvBn().eval(), (torch.randn(2, 3, 6, 6),), optimizer=MOMENTUM)
    roles = _by_name(prog.train_graph)
    assert roles["input:0"] is Role.DATA and roles["label"] is Role.LABEL
    for p in ("conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"):
        assert roles[p] is Role.PARAMETER, p
    assert roles["bn.running_mean"] is Role.FROZEN and roles["bn.running_var"] is Role.FROZEN
    assert Role.STEP not in roles.values(), "float updates take no step count"
    _check_optimizer_state(prog)
    assert ram_inputs(prog.train_graph) == {"input:0", "label"}
    assert Role.LABEL not in prog.forward_graph.roles
    assert Role.OPTIMIZER_STATE not in prog.grad_graph.roles and prog.grad_graph.the_input(Role.LABEL)
    assert "captured" in prog.stages and _by_name(prog.stages["captured"])["bn.running_mean"] is Role.FROZEN
    for g in (*prog.stages.values(), prog.train_graph, prog.grad_graph, prog.forward_graph):
        verify(g)


def test_batch_statistics_are_running_statistics():
    torch.manual_seed(0)
    prog = et.compile(ConvBn(), (torch.randn(2, 3, 6, 6),), batchnorm="train")
    roles = _by_name(prog.train_graph)
    assert roles["bn.running_mean"] is Role.RUNNING_STAT and roles["bn.running_var"] is Role.RUNNING_STAT
    assert roles["bn.num_batches_tracked"] is Role.RUNNING_STAT
    assert prog.memory.trainable_bytes > 0


def test_sparse_float_zoo_program():
    prog = _mcunet()
    g = prog.train_graph
    assert any(sel is not None for sel in prog.trainable.values()), "the scheme trains some channels only"
    _check_optimizer_state(prog)
    assert g.inputs_with(Role.DATA) == (g.input("input:0"),)
    frozen = {v.name for v in g.inputs_with(Role.PARAMETER)} - set(prog.trainable)
    assert frozen, "parameters the scheme leaves untrained are still parameters"
    assert prog.memory.optimizer_bytes == sum(v.type.nbytes for v in g.inputs_with(Role.OPTIMIZER_STATE))


def test_sparse_int8_zoo_program():
    prog = _mcunet("int8")
    g = prog.train_graph
    data = g.inputs_with(Role.DATA)
    assert [v.name for v in data] == list(prog.graph_inputs) and all(v.dtype == "int8" for v in data)
    assert prog.input_transform.roles == (Role.DATA,), "the float image feeds the input transform"
    step = g.the_input(Role.STEP)
    assert step is not None and step.name == "step", "int8 updates count steps"
    _check_optimizer_state(prog)
    assert ram_inputs(g) == {*prog.graph_inputs, "label", "step"}


def test_paged_schedule_adds_the_page_store():
    prog = _mcunet(update=et.Full())
    sched = hand_schedule(build_problem(prog, get_device("a72")), mixed)  # no solver: the same schedule every run
    assert sched.page_out
    paged = prog.apply(sched)
    g = verify(paged.train_graph)
    store = g.the_input(Role.PAGE_STORE)
    assert store is not None and store.name == paged.page_store.name
    assert store.name not in ram_inputs(g)
    assert paged.memory.frozen_bytes == prog.memory.frozen_bytes, "the page store is neither RAM nor flash"
    assert g.roles[:-1] == prog.train_graph.roles
    assert paged.grad_graph.the_input(Role.LABEL) is not None
