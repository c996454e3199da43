"""The language model's head and its loss in vocabulary chunks (issue 32): a class loss over
the last dim of a linear layer's output becomes one op that computes the logits a chunk of
the vocabulary at a time, so the (T, V) logits are never whole. (Filled in by issue 32.)"""
from __future__ import annotations

from ..ir import Graph


def chunk_lm_head(g: Graph) -> Graph:
    """`g` with its linear head + cross entropy fused into chunked ops; `g` itself when its
    loss is not a class loss over the last dim of a linear layer's output."""
    return g
