"""A weight read by two layers (an embedding tied to the output head, as GPT-2 ties wte to
lm_head) under quantize="int8": the head stays a float layer on the one shared tensor (an
int8 copy would split the tie), the other layers are int8, and training updates the shared
tensor with both layers' gradients."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import edgetrain as et


class TiedLM(nn.Module):
    def __init__(self, vocab=12, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.body = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, ids):
        return self.head(torch.relu(self.body(self.emb(ids))).mean(1))


def test_tied_head_stays_float_and_trains_the_shared_weight():
    torch.manual_seed(0)
    model = TiedLM()
    ids = torch.randint(0, 12, (4, 5))
    y = np.array([1, 2, 3, 4])
    prog = et.compile(model, (ids,), quantize="int8", update=et.LastK(1))
    assert prog.state["emb.weight"].dtype == np.float32  # the shared weight: float, read by both layers
    assert prog.state["body.weight"].dtype == np.int8  # the untied layer: int8
    ops = [n.op for n in prog.train_graph.nodes]
    assert "qconv2d" in ops and "embedding" in ops and "linear" in ops
    before = prog.state["emb.weight"].copy()
    losses = [prog.step(ids.numpy(), y) for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert not np.array_equal(prog.state["emb.weight"], before)  # LastK(1): the head, i.e. the shared tensor
