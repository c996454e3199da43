"""Shared checks of the fusion passes' tests: random values for a graph's inputs, and that two
graphs (before and after a pass) compute the same outputs bit for bit on the reference runtime."""
from __future__ import annotations

import numpy as np

from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph


def graph_values(g: Graph, fixed: dict, seed: int = 0, spread: float = 1.0) -> dict:
    """{input name: array}: `fixed`'s where given, positive (|N| + 0.5) for variances
    (names starting "var"), else `spread` * N(0, 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in g.inputs:
        if v.name in fixed:
            out[v.name] = np.array(fixed[v.name], copy=True)
        elif v.name.startswith("var"):
            out[v.name] = (np.abs(rng.standard_normal(v.shape)) + 0.5).astype(v.dtype)
        else:
            out[v.name] = (spread * rng.standard_normal(v.shape)).astype(v.dtype)
    return out


def same_outputs(a: Graph, b: Graph, feeds: dict) -> None:
    """a and b give equal outputs (bit for bit) from the same feeds."""
    got_a = run_graph(a, {k: v.copy() for k, v in feeds.items()})[0]
    got_b = run_graph(b, {k: v.copy() for k, v in feeds.items()})[0]
    assert got_a.keys() == got_b.keys()
    for k in got_a:
        assert np.array_equal(got_a[k], got_b[k]), k
