"""Federated averaging of the trained tensors only, in real values, back to the program's integers.

Each client sends the trained part of each trained tensor (Program.trained_tensors: a sparse
scheme's channels only) at its storage dtype; every client runs the same compiled program,
so they share its fixed scales. The server averages, weighted by the clients' sample counts
n_k (FedAvg):

    real = sum_k (n_k / sum n) * (q_k - zero) * scale          (float64, clients in id order)
    q    = clamp(round_half_even(real / scale) + zero, lo, hi)   (int8 weights, int32 biases)

Rounding is to nearest, ties to even (numpy's rint: no bias up or down over many rounds),
then clamped to the range the program's own integer update keeps (int8 weights [-127, 127],
int32 biases [-2^24, 2^24]: passes/updates.py). Float tensors are averaged in float64 and
stored as float32. The frozen tensors are never sent: each device already holds them.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..ir import Role
from ..program import Program, TrainedTensor


def fed_average(layout: Mapping[str, TrainedTensor],
                updates: Sequence[tuple[float, Mapping[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """{name: averaged trained part} of `updates` ((n_k, {name: values}) per client, in client
    order), each tensor re-quantized as `layout` (the program's trained_tensors) says."""
    if not updates:
        raise ValueError("no client updates to average")
    counts = np.array([float(n) for n, _ in updates], dtype=np.float64)
    if not (np.all(np.isfinite(counts)) and np.all(counts > 0)):
        raise ValueError(f"client sample counts must be positive, got {counts.tolist()}")
    weights = counts / counts.sum()
    out = {}
    for name, t in layout.items():
        real = np.zeros(t.values.shape, dtype=np.float64)
        for w, (_, values) in zip(weights, updates):
            if name not in values:
                raise ValueError(f"a client update lacks trained tensor {name!r}")
            v = np.asarray(values[name])
            if v.shape != t.values.shape or v.dtype != t.values.dtype:
                raise ValueError(f"client update of {name!r} is {v.dtype}{tuple(v.shape)}, the program trains "
                                 f"{t.values.dtype}{tuple(t.values.shape)}")
            real += w * (v.astype(np.float64) if t.scale is None else (v.astype(np.float64) - t.zero) * t.scale)
        out[name] = requantize(real, t)
    return out


def requantize(real: np.ndarray, t: TrainedTensor) -> np.ndarray:
    """Real values to `t`'s storage: round half to even on its scale, clamp to its range."""
    if t.scale is None:
        return real.astype(t.values.dtype)
    q = np.rint(real / t.scale) + t.zero
    lo, hi = t.range
    return np.clip(q, lo, hi).astype(t.values.dtype)


def update_bytes(layout: Mapping[str, TrainedTensor]) -> int:
    """Bytes one client sends per round: the trained parts at their storage dtype."""
    return sum(t.nbytes for t in layout.values())


def model_bytes(prog: Program) -> int:
    """Bytes of the whole model at its storage dtype (every parameter and frozen tensor of
    the forward graph, trained or not): what full-model FedAvg sends per client and round."""
    g = prog.forward_graph
    return sum(int(np.asarray(prog.state[v.name]).nbytes) for v in g.inputs_with(Role.PARAMETER, Role.FROZEN)
               if v.name in prog.state)
