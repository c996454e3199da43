"""Calibration: the real range of chosen values of a float graph over a few real batches."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from ..interpreter import run_graph
from ..ir import Graph, Value


class CalibrationError(ValueError):
    pass


def observe_ranges(g: Graph, arrays: Mapping[str, np.ndarray], batches: Iterable[Sequence[np.ndarray]],
                   values: Sequence[Value]) -> dict[Value, tuple[float, float]]:
    """(min, max) of each of `values` over `batches` (each a tuple of the graph's data
    inputs, in order). `arrays` binds the parameter and buffer inputs."""
    if not values:
        return {}
    batches = list(batches)
    probe = g.replace(outputs=tuple(values), output_names=tuple(f"v{i}" for i in range(len(values))))
    data = [v for v in g.inputs if v.name not in arrays]
    lo = np.full(len(values), np.inf)
    hi = np.full(len(values), -np.inf)
    seen = 0
    for batch in batches:
        for feeds in chunk_feeds(batch, data, arrays):
            out, _ = run_graph(probe, feeds)
            for i in range(len(values)):
                a = out[f"v{i}"]
                lo[i] = min(lo[i], float(a.min()))
                hi[i] = max(hi[i], float(a.max()))
            seen += 1
    if not seen:
        raise CalibrationError("calibration needs at least one batch of real inputs")
    bad = [values[i] for i in range(len(values)) if not (np.isfinite(lo[i]) and np.isfinite(hi[i]))]
    if bad:
        raise CalibrationError(f"calibration saw non-finite or no values for {len(bad)} tensors")
    return {v: (float(lo[i]), float(hi[i])) for i, v in enumerate(values)}


def chunk_feeds(batch, data: Sequence[Value], arrays):
    """Feeds for `batch` cut into pieces of the graph's static batch size (a remainder
    smaller than that is dropped)."""
    if isinstance(batch, np.ndarray) or hasattr(batch, "detach"):
        batch = (batch,)
    if len(batch) != len(data):
        raise CalibrationError(f"a calibration batch has {len(batch)} inputs; the model takes {len(data)}")
    arrs = []
    for v, x in zip(data, batch):
        a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        if a.shape[1:] != v.shape[1:]:
            raise CalibrationError(f"calibration input {v.name}: expected (N,{','.join(map(str, v.shape[1:]))}), "
                                   f"got {a.shape}")
        arrs.append(np.ascontiguousarray(a, dtype=v.dtype))
    b = data[0].shape[0]
    if arrs[0].shape[0] < b:
        raise CalibrationError(f"a calibration batch has {arrs[0].shape[0]} samples, fewer than the compiled "
                               f"batch size {b}")
    for i in range(0, arrs[0].shape[0] - b + 1, b):
        yield {**arrays, **{v.name: a[i:i + b] for v, a in zip(data, arrs)}}
