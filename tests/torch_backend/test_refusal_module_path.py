"""A refusal under torch.compile names the submodule beside the model line, as et.compile's
does (issue 34 item 11): one line that calls an nn.Sequential covers all its layers."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import edgetrain as et


class Cum(nn.Module):
    def forward(self, x):
        return torch.cummax(x, dim=1).values


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(12, 5), Cum())

    def forward(self, x):
        return self.features(x)


def test_refusal_under_torch_compile_names_the_submodule():
    torch._dynamo.reset()
    with pytest.raises(et.UnsupportedOpError,
                       match=r"aten\.cummax.*test_refusal_module_path\.py:\d+: \[features\.1: Cum\] return torch\.cummax"):
        torch.compile(Net(), backend="edgetrain")(torch.randn(2, 12))


def test_the_same_refusal_under_et_compile_reads_alike():
    with pytest.raises(et.UnsupportedOpError, match=r"test_refusal_module_path\.py:\d+: \[features\.1: Cum\]"):
        et.compile(Net(), (torch.randn(2, 12),))
