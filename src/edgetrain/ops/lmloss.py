"""The language model's head and loss in vocabulary chunks: (T, V) logits are never whole.
(Filled in by issue 32.)"""
from __future__ import annotations
