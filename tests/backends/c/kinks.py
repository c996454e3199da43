"""Float64 runs of a program's graph with chosen ReLU / clamp decisions taken the other way.

Two correct float32 programs sum in different orders, so a pre-activation within float32
rounding of a ReLU or clamp threshold can land on either side, and that one mask bit moves
every gradient upstream of the element by far more than rounding: resnet18-cifar's step 2
(batch 1, 32x32) has a block output 4.2e-7 above zero against a tensor maximum of 10, which
oneDNN's AVX2 convolution puts below zero; the first conv's momentum then moves by 5e-4 of its
largest entry in 87 % of its entries. Neither the float32 nor the float64 reference explains
such a result, the float64 run with that element flipped does (to 2e-7).

`flipped_runs` yields the float64 run of a graph on given feeds, then the runs with the
nearest kinks flipped (each of the KINK_CANDIDATES nearest alone, then in pairs): a result
that meets one of them is the exact computation up to decisions that float32 rounding leaves
open; a kernel fault meets none. A flip mirrors the pre-activation about its threshold
(s -> 2t - s), a change below float32 rounding, so every consumer (the activation, its
gradient mask, a clamp's backward reading its input) sees the other side consistently.
Max-pool ties are not flipped: the float64 reference compiled from the model covers those.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Optional, TypeVar

import numpy as np

from edgetrain.ops import get_op
from edgetrain.ops.bnact import BN_ACT_OP, act_attrs

T = TypeVar("T")
#: a pre-activation this close to a threshold, relative to its tensor's largest magnitude, is
#: a kink float32 rounding may flip (the two seen: 4.2e-8 and 4.5e-8; float32's epsilon 6e-8,
#: a K-term sum's rounding about sqrt(K) of it)
KINK_NEAR = 1e-6
#: how many of the nearest kinks are tried, and how many of them at once
KINK_CANDIDATES, KINK_MAX_FLIPS = 4, 2


@dataclass(frozen=True)
class Kink:
    node: int  # the index of the activation's node in the graph
    index: int  # the element, a flat index into the pre-activation
    threshold: float
    inward: float  # +1 for a lower threshold (ReLU's, clamp's min), -1 for clamp's max
    distance: float  # |s - threshold| relative to the pre-activation's largest magnitude
    where: str  # the node's op and output, for messages

    def __str__(self) -> str:
        return f"{self.where}[{self.index}] {self.distance:.2g} from {self.threshold:g}"


def thresholds(node) -> tuple[tuple[float, float], ...]:
    """Where the node's activation changes branch, each with the direction of its open side
    (Kink.inward): ReLU at 0, clamp at its bounds."""
    act, a = node.op, node.attrs
    if act == BN_ACT_OP:
        act, a = a["act"], act_attrs(a)
    if act == "relu":
        return ((0.0, 1.0),)
    if act == "clamp":
        return tuple((float(a[k]), d) for k, d in (("min", 1.0), ("max", -1.0)) if a.get(k) is not None)
    return ()


def _pre_activation(node, ins: list) -> np.ndarray:
    """The tensor the activation's thresholds apply to: a fused node's batch norm (+ residual)."""
    if node.op != BN_ACT_OP:
        return ins[0]
    a = node.attrs
    bn = ins[:len(ins) - bool(a["residual"])]
    (s,) = get_op("batch_norm").ref(bn, {"eps": a["eps"]})
    if a["residual"]:
        (s,) = get_op("add").ref([s, ins[-1]], {})
    return np.asarray(s, dtype=np.float64)


def _mirror(s: np.ndarray, flips) -> None:
    """Each flipped element to the other side of its threshold, in place (one exactly on it,
    where the masks count it outside, just inside)."""
    flat = s.reshape(-1)
    for k in flips:
        v, t = flat[k.index], k.threshold
        flat[k.index] = 2 * t - v if v != t else np.nextafter(t, k.inward * np.inf)


def _as64(a):
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def run_float64(g, feeds: Mapping[str, np.ndarray], flips=()) -> tuple[dict, dict, list[Kink]]:
    """Run graph `g` in float64 (its float feeds widened, every float result kept in float64)
    with the kinks `flips` flipped: (outputs by name, the inputs by name after the run, as the
    ops that update an input in place left them, and every kink within KINK_NEAR, nearest
    first)."""
    env = {v: _as64(feeds[v.name]).copy() for v in g.inputs}
    by_node: dict[int, list[Kink]] = {}
    for k in flips:
        by_node.setdefault(k.node, []).append(k)
    kinks = []
    for i, n in enumerate(g.nodes):
        ins = [env[v] for v in n.inputs]
        ts = thresholds(n)
        if not ts:
            outs = get_op(n.op).ref(ins, n.attrs)
        else:
            s = _pre_activation(n, ins)
            if n.op != BN_ACT_OP:  # the producer's value itself: every consumer sees the flip
                s = env[n.inputs[0]] = ins[0] = s.copy()
            _mirror(s, by_node.get(i, ()))
            scale = max(float(np.abs(s).max(initial=0)), 1e-30)
            for t, inward in ts:
                d = np.abs(s - t).reshape(-1) / scale
                for j in np.flatnonzero(d <= KINK_NEAR):
                    kinks.append(Kink(i, int(j), t, inward, float(d[j]), f"node {i} ({n.op})"))
            outs = (get_op(n.attrs["act"]).ref([s], act_attrs(n.attrs)) if n.op == BN_ACT_OP
                    else get_op(n.op).ref(ins, n.attrs))
        opdef = get_op(n.op)
        shares = dict(opdef.shares)
        for k, (o, raw) in enumerate(zip(n.outputs, outs)):
            a = _as64(raw)
            j = shares.get(k)
            if opdef.mutates and j is not None and j < len(n.inputs):
                env[n.inputs[j]][...] = a  # in place, as the interpreter writes a mutated input
                a = env[n.inputs[j]]
            env[o] = a
    outputs = {name: env[v] for name, v in zip(g.output_names, g.outputs)}
    inputs = {v.name: env[v] for v in g.inputs}
    return outputs, inputs, sorted(kinks, key=lambda k: k.distance)


def feeds_copy(prog, g, x, y) -> dict[str, np.ndarray]:
    """A copy of every feed of `prog`'s graph `g` for the batch (x, y): a step updates the
    state arrays the runner's feeds point at."""
    return {k: np.array(v) for k, v in prog.runner.feeds(g, x, y).items()}


def flipped_runs(g, feeds: Mapping[str, np.ndarray]) -> Iterator[tuple[tuple[Kink, ...], dict, dict]]:
    """(flips, outputs, inputs after) of the float64 run, then of the runs with each of the
    KINK_CANDIDATES nearest kinks flipped, then with two of them (module docstring)."""
    outputs, inputs, kinks = run_float64(g, feeds)
    yield (), outputs, inputs
    near = kinks[:KINK_CANDIDATES]
    for r in range(1, KINK_MAX_FLIPS + 1):
        for flips in itertools.combinations(near, r):
            outputs, inputs, _ = run_float64(g, feeds, flips)
            yield flips, outputs, inputs


def first_explaining(runs: Iterable[tuple[tuple[Kink, ...], T]],
                     meets: Callable[[T], bool]) -> Optional[tuple[Kink, ...]]:
    """The flips of the first of `runs` ((flips, result) pairs) whose result `meets` accepts,
    or None."""
    for flips, result in runs:
        if meets(result):
            return flips
    return None


def flipped_gradients(prog, x, y) -> Iterator[dict[str, np.ndarray]]:
    """The gradients ({param: gradient}, as `prog.gradients` gives them) of flipped_runs of
    the program's gradient graph on the batch (x, y)."""
    g = prog.compiled.grad_graph
    for _, outputs, _ in flipped_runs(g, feeds_copy(prog, g, x, y)):
        yield prog.runner.full_gradients(outputs)
