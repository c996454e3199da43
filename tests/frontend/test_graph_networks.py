"""A graph network's message passing as PyTorch code writes it without a graph library: messages
read from the source nodes (advanced indexing), summed per target node with scatter_add and the
in-degrees counted with index_add (frontend/aten_select.py: x + gather_grad(src, index), whose
gradient is a gather). Float64 gradients equal torch.autograd's, the C backend's float32 ones the
reference's, torch.compile's loop eager's losses, and a Cortex-M4 firmware (QEMU) prints the host
build's losses."""
from __future__ import annotations

import torch
from torch import nn

from tests.frontend.model_checks import (c_gradients_equal_the_reference, compiled_loop_gives_eager_losses,
                                         firmware_prints_host_losses, float64_gradients_equal_autograd)

CLASSES = 5
#: a directed graph of 6 nodes (sources, targets): a ring and four chords; node 4 has two in-edges
EDGES = ([0, 1, 2, 3, 4, 5, 0, 2, 4, 1], [1, 2, 3, 4, 5, 0, 3, 5, 1, 4])


class MessagePassing(nn.Module):
    """two rounds of mean aggregation of transformed neighbour features (a GCN / GraphSAGE layer),
    node classification"""

    def __init__(self):
        super().__init__()
        self.embed, self.message, self.update = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(16, 8)
        self.fc = nn.Linear(8, CLASSES)
        self.register_buffer("src", torch.tensor(EDGES[0]))
        self.register_buffer("dst", torch.tensor(EDGES[1]))

    def _round(self, h):
        msg = self.message(h)[self.src]
        total = torch.zeros(h.shape[0], msg.shape[1], dtype=h.dtype).scatter_add(
            0, self.dst[:, None].expand(-1, msg.shape[1]), msg)
        degree = torch.zeros(h.shape[0], dtype=h.dtype).index_add(0, self.dst, torch.ones(len(EDGES[0]), dtype=h.dtype))
        return torch.relu(self.update(torch.cat([h, total / degree[:, None].clamp(min=1)], 1)))

    def forward(self, x):  # x: (nodes, 4)
        h = torch.relu(self.embed(x))
        return self.fc(self._round(self._round(h)))


def _model_and_input():
    torch.manual_seed(0)
    return MessagePassing().eval(), torch.randn(6, 4, generator=torch.Generator().manual_seed(1))


def _labels(x):
    return torch.arange(x.shape[0]) % CLASSES


def test_float64_gradients_equal_autograd():
    model, x = _model_and_input()
    float64_gradients_equal_autograd(model, x, _labels(x), {"gather_grad"})


def test_c_backend_gradients_equal_the_reference():
    model, x = _model_and_input()
    c_gradients_equal_the_reference(model, x, _labels(x))


def test_torch_compile_training_loop_gives_eager_losses():
    model, x = _model_and_input()
    compiled_loop_gives_eager_losses(model, [(x + 0.1 * k, _labels(x)) for k in range(3)], {"gather_grad"})


def test_on_cortex_m_print_the_host_builds_losses(tmp_path):
    model, x = _model_and_input()
    firmware_prints_host_losses(model, x, CLASSES, tmp_path, {"gather_grad"})
