"""Runners: what runs a compiled program (compiled.py) on a backend.

A runner holds the running state (`state`: weights, buffers and optimizer state as numpy
arrays; `steps`: the training steps done) and runs `step`, `gradients` and `predict`.
`RunnerBase` writes once what every backend shares: the data and label feeds and their
checks, the gradients of a partly trained parameter, the state a step writes, and `predict`'s
batching. `ReferenceRunner` (backends/reference_runner.py) runs the graphs in the numpy reference runtime;
the C runner is backends/c/host.py's `CRunner`. A runner reads as its compiled program (its
fields) with live state, which is what the backends' emitters take.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Optional, Protocol, runtime_checkable

import numpy as np

from ..autodiff import grad_name
from ..interpreter import run_graph
from .compiled import COMPILED_FIELDS, CompiledProgram
from ..ir import FLOAT_DTYPES, Graph, Role, TensorType, Value
from ..passes.loss import CLASS_LOSSES, class_dim


class NonFiniteLossError(FloatingPointError):
    """Training produced a non-finite loss or weight; the last good weights were kept."""


#: the largest input or target magnitude a training step accepts. A step multiplies an input
#: by the gradient it induces (which scales with the input too) and sums such products over a
#: layer's fan-in: |x|^2 times fan-in and weights must stay far below float32's 2^128. Inputs
#: up to 2^40 leave 2^48 of headroom; real data (pixels, normalised features, audio samples)
#: lies many orders of magnitude below, so nothing larger is trainable data
MAX_TRAIN_MAGNITUDE = 2.0 ** 40


def check_trainable(a: np.ndarray, what: str) -> None:
    """Refuse float data a training step cannot use (non-finite, or over MAX_TRAIN_MAGNITUDE),
    before the step touches any state: one such sample would poison every later step."""
    if a.dtype.kind != "f" or a.size == 0:
        return
    with np.errstate(all="ignore"):  # the common case in two reductions, no temporaries (NaN fails the test)
        if float(a.max()) <= MAX_TRAIN_MAGNITUDE and -float(a.min()) <= MAX_TRAIN_MAGNITUDE:
            return
        bad = ~np.isfinite(a)
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), a.shape)
            raise ValueError(f"{what}: {int(bad.sum())} non-finite value(s) ({a[i]} at index {tuple(map(int, i))}); "
                             f"training needs finite data")
        peak = float(np.max(np.abs(a)))
    if peak > MAX_TRAIN_MAGNITUDE:
        raise ValueError(f"{what}: a value of magnitude {peak:.3g} is over the {MAX_TRAIN_MAGNITUDE:.3g} that float32 "
                         f"training arithmetic can take without overflowing; normalise the data (--mean/--std)")


def as_array(x, want: TensorType, what: str, batch_free: bool = False) -> np.ndarray:
    """`x` (numpy array, torch tensor or nested list) as an array of type `want`; with
    `batch_free` the first dim may differ."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    ok = a.shape[1:] == want.shape[1:] and a.ndim >= 1 if batch_free else a.shape == want.shape
    if not ok:
        expect = ("(N," + ",".join(map(str, want.shape[1:])) + ")") if batch_free else str(want.shape)
        raise ValueError(f"{what}: expected shape {expect}, got {a.shape}")
    if want.dtype in FLOAT_DTYPES:
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"{what}: expected numbers, got dtype {a.dtype}")
    elif not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what}: expected integers ({want.dtype}), got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=want.dtype)


#: load_state's default: no entries (read-only, so one default serves every call)
NO_STATE: Mapping[str, np.ndarray] = MappingProxyType({})


def label_input(g: Graph) -> Value:
    """The label input of a training step `g` (every training step has one)."""
    v = g.the_input(Role.LABEL)
    if v is None:
        raise ValueError("the training step has no label input")
    return v


@runtime_checkable
class Runner(Protocol):
    """What runs a compiled program: state in (`state`, `steps`, `load_state`) and out
    (`state`), and the three calls of the public API."""

    backend: str
    compiled: CompiledProgram
    state: dict
    steps: int

    def step(self, x, y) -> float: ...

    def gradients(self, x, y) -> dict: ...

    def predict(self, x) -> np.ndarray: ...

    def load_state(self, state: Mapping[str, np.ndarray] = NO_STATE, steps: Optional[int] = None) -> None: ...

    def rebind(self, compiled: CompiledProgram) -> "Runner": ...


class RunnerBase:
    """Feeds, labels, checks and batching, shared by every runner (module docstring).
    Subclasses implement `step`, `gradients` and `predict_batch` (one compiled batch)."""

    backend = "?"

    def __init__(self, compiled: CompiledProgram, state: Optional[Mapping[str, np.ndarray]] = None, steps: int = 0):
        self.compiled = compiled
        self.state: dict[str, np.ndarray] = (compiled.fresh_state() if state is None else
                                             {k: np.array(v, copy=True) for k, v in state.items()})
        self.steps = int(steps)

    def __getattr__(self, name: str):
        """The compiled program's fields (a runner reads as the program it runs)."""
        if name in COMPILED_FIELDS:
            compiled = self.__dict__.get("compiled")
            if compiled is not None:
                return getattr(compiled, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def rebind(self, compiled: CompiledProgram) -> "RunnerBase":
        """A runner of the same kind for `compiled` (e.g. the program with a schedule applied),
        starting from a copy of this one's state and step count."""
        return type(self)(compiled, self.state, self.steps)

    def load_state(self, state: Mapping[str, np.ndarray] = NO_STATE, steps: Optional[int] = None) -> None:
        """State in: each of `state`'s entries replaces the runner's, and `steps` its step count."""
        for k, v in dict(state).items():
            self.state[k] = v
        if steps is not None:
            self.steps = int(steps)

    # --- inputs --------------------------------------------------------------------------
    def _graph_fact(self, g: Graph, key, compute):
        """compute(), remembered per graph and key: a graph's lookups by name or role scan all its
        inputs (a few hundred on a real model: most of a small step's Python time, every step)."""
        cache = self.__dict__.setdefault("_graph_facts", {})
        hit = cache.get((id(g), key))
        if hit is None or hit[0] is not g:  # the graph itself is kept: its id is not reused meanwhile
            hit = cache[(id(g), key)] = (g, compute())
        return hit[1]

    def data_feeds(self, g: Graph, x, training: bool = False) -> dict[str, np.ndarray]:
        """The graph's data feeds for the model input(s) `x`; for `training` (step, gradients)
        checked to be data a step can use (check_trainable)."""
        c = self.compiled
        xs = x if isinstance(x, (tuple, list)) and len(c.inputs) > 1 else (x,)
        if len(xs) != len(c.inputs):
            raise ValueError(f"the model takes {len(c.inputs)} inputs, got {len(xs)}")
        src = c.input_transform or g
        feeds = {name: as_array(v, self._graph_fact(src, name, lambda name=name: src.input(name).type), f"input {i}")
                 for i, (name, v) in enumerate(zip(c.inputs, xs))}
        if training:
            for i, name in enumerate(c.inputs):
                check_trainable(feeds[name], f"input {i}")
        if c.input_transform is not None:
            feeds = run_graph(c.input_transform, feeds)[0]
        return feeds

    def label_feed(self, g: Graph, y) -> np.ndarray:
        """The labels (class losses: integer class indices of the output's shape without its
        class dim, each in range or the program's ignore_index) or the float targets shaped like the
        output (mse, l1, bce_with_logits)."""
        want = self._graph_fact(g, Role.LABEL, lambda: label_input(g).type)
        loss = self.compiled.loss
        if loss in CLASS_LOSSES:
            y = as_array(y, want, "labels")
            fwd = self.compiled.forward_graph
            out = self._graph_fact(fwd, ("output type",), lambda: fwd.output("output").type)
            classes = out.shape[class_dim(loss, out.rank)]
            ignore = self.compiled.ignore_index
            counted = y[y != ignore]
            if counted.size and (counted.min() < 0 or counted.max() >= classes):
                raise ValueError(f"labels must lie in [0, {classes}) or equal the ignore_index {ignore}, got "
                                 f"values in [{counted.min()}, {counted.max()}]")
            return y
        y = as_array(y, want, "targets")
        check_trainable(y, "targets")
        return y

    def feeds(self, g: Graph, x, y) -> dict[str, np.ndarray]:
        """Every input of `g`: state, data, labels, the page store and the step count."""
        feeds = {v.name: self.state[v.name] for v in g.inputs if v.name in self.state}
        feeds.update(self.data_feeds(g, x, training=True))
        feeds[label_input(g).name] = self.label_feed(g, y)
        store, step = g.the_input(Role.PAGE_STORE), g.the_input(Role.STEP)
        if store is not None:
            feeds[store.name] = self.compiled.page_store.array
        if step is not None:
            feeds[step.name] = np.array(self.steps, dtype=np.int32)
        return feeds

    # --- outputs ---------------------------------------------------------------------------
    def full_gradients(self, out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{param: gradient} from the grad graph's outputs `out`, a selected-channel gradient
        scattered into zeros of its parameter's shape."""
        grads = {}
        for p, sel in self.compiled.trainable.items():
            gv = out[grad_name(p)]
            grads[p] = gv if sel is None else sel.scatter(gv, self.state[p].shape)
        return grads

    def written_state(self) -> list[str]:
        """The state tensors a training step writes: trained weights, optimizer state, and
        whatever an op updates in place (train-mode batch norm's running statistics)."""
        from ..ops import get_op

        g = self.compiled.train_graph
        cached = self.__dict__.get("_written")
        if cached is None or cached[0] is not g:  # once per train graph, not on every step
            inputs = set(g.inputs)
            written = {v.name for n in g.nodes if get_op(n.op).mutates
                       for _, j in get_op(n.op).shares for v in n.inputs[j:j + 1] if v in inputs}
            optimizer = {v.name for v in g.inputs_with(Role.OPTIMIZER_STATE)}
            trainable = self.compiled.trainable
            cached = self._written = (g, [k for k in self.state if k in trainable or k in optimizer
                                          or k in written])
        return cached[1]

    def non_finite(self, loss: float, bad_name: str = "") -> NonFiniteLossError:
        """The error of a step whose loss or weight `bad_name` became non-finite."""
        return NonFiniteLossError(f"step {self.steps + 1}: loss is {loss}" + (f", {bad_name} became non-finite"
                                  if bad_name else "") + f"; weights kept from step {self.steps}")

    def predict(self, x) -> np.ndarray:
        """The model's outputs, shaped as the model gives them. A batch of the compiled size
        runs as it is; one of any other size runs in chunks of the compiled batch when the
        output leads with the batch (its first dim is the compiled batch), else it is refused:
        an output such as a language model's flattened (N*T, V) logits cannot be cut into
        samples."""
        c = self.compiled
        if len(c.inputs) != 1:
            return self.predict_batch(x)
        want = (c.input_transform or c.forward_graph).input(c.inputs[0]).type
        a = as_array(x, want, "input", batch_free=True)
        b, n = want.shape[0], a.shape[0]
        if n == b:
            return self.predict_batch(a)
        out = self._graph_fact(c.forward_graph, ("output type",), lambda: c.forward_graph.output("output").type)
        if not out.shape or out.shape[0] != b:
            raise ValueError(f"predict: the model's output {out} does not lead with the batch of {b}, so it "
                             f"cannot be computed in chunks: give exactly {b} samples, got {n}")
        pad = (-n) % b
        if pad:
            a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], dtype=a.dtype)])
        return np.concatenate([self.predict_batch(a[i:i + b]) for i in range(0, a.shape[0], b)])[:n]

    def predict_batch(self, x) -> np.ndarray:
        raise NotImplementedError

    def step(self, x, y) -> float:
        raise NotImplementedError

    def gradients(self, x, y) -> dict[str, np.ndarray]:
        raise NotImplementedError
