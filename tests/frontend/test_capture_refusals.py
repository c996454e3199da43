"""Ops the IR cannot express are refused at capture by name, with the model line
(UnsupportedOpError, exit 2 in the CLI), from every converter module."""
import pytest
import torch
from torch import nn

from edgetrain.frontend import capture
from edgetrain.frontend.capture import UnsupportedOpError


class NegativeNorm(nn.Module):
    def forward(self, x):
        return torch.linalg.vector_norm(x, ord=-2, dim=1)


class Strided(nn.Module):
    def forward(self, x):
        return x.as_strided((2, 2), (1, 2), 40)  # reads past its input's storage


@pytest.mark.parametrize("model,op", [(NegativeNorm(), "linalg_vector_norm"), (Strided(), "as_strided")])
def test_refused_by_name_with_the_model_line(model, op):
    with pytest.raises(UnsupportedOpError, match=op) as err:
        capture(model, (torch.randn(2, 3),))
    assert "test_capture_refusals.py" in str(err.value)
