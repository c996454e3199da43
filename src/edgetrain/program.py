"""Program: a compiled training program, run by the reference runtime."""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from .autodiff import ChannelSelect, grad_name
from .backends.reference import run_graph
from .ir import FLOAT_DTYPES, Graph, TensorType
from .memory import MemoryReport
from .passes.loss import LABEL
from .passes.updates import STEP, momentum_name


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
    with np.errstate(all="ignore"):
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


class Program:
    """A model compiled for training. Weights live in `self.state` (numpy arrays)."""

    def __init__(self, *, inputs: tuple[str, ...], state: Mapping[str, np.ndarray], stages: dict[str, Graph],
                 forward: Graph, grad_graph: Graph, train_graph: Graph,
                 trainable: Mapping[str, Optional[ChannelSelect]], layers: tuple, memory: MemoryReport, loss: str,
                 optimizer, state_aliases: Mapping[str, str], export=None, quantize: Optional[str] = None,
                 graph_inputs: Optional[tuple[str, ...]] = None, input_transform: Optional[Graph] = None,
                 scheme=None, op_sources: Optional[Mapping[str, tuple]] = None,
                 source_lines: Optional[Mapping[int, str]] = None):
        self.stages = stages
        # captured op -> the model source lines it comes from (backends name them when they lack an op)
        self.op_sources = dict(op_sources or {})
        #: node index of stages['captured'] -> the model source line it came from
        self.source_lines = dict(source_lines or {})
        self.forward_graph, self.grad_graph, self.train_graph = forward, grad_graph, train_graph
        self.trainable = dict(trainable)
        self.layers = layers
        self.memory = memory
        self.loss = loss
        self.optimizer = optimizer
        self.inputs = tuple(inputs)  # the model's inputs, as the user passes them
        # the compiled graphs' data inputs: the same, or for an int8 program the int8 samples
        # that `input_transform` (float data -> int8, run as each sample is read in) makes
        self.graph_inputs = tuple(graph_inputs) if graph_inputs is not None else self.inputs
        self.input_transform = input_transform
        self.quantize = quantize
        self.scheme = scheme  # the update scheme it trains (for update="auto": the one chosen)
        self.search = None  # for update="auto": how the scheme was chosen (sparse.auto.SearchInfo)
        self.schedule = None  # the rematerialization / paging schedule it runs (`apply`), if any
        self.page_store = None  # where that schedule pages tensors to (schedule.apply.PageStore)
        self.steps = 0
        self.state: dict[str, np.ndarray] = {k: np.array(v, copy=True) for k, v in state.items()}
        self._export = export
        if optimizer.momentum:
            for p in self.trainable:
                m = train_graph.input(momentum_name(p))
                self.state[momentum_name(p)] = np.zeros(m.shape, dtype=m.dtype)
        self._aliases = dict(state_aliases)

    # --- inputs --------------------------------------------------------------------------
    def _data_feeds(self, g: Graph, x, training: bool = False) -> dict[str, np.ndarray]:
        """The graph's data feeds for the model input(s) `x`; for `training` (step, gradients)
        checked to be data a step can use (check_trainable)."""
        xs = x if isinstance(x, (tuple, list)) and len(self.inputs) > 1 else (x,)
        if len(xs) != len(self.inputs):
            raise ValueError(f"the model takes {len(self.inputs)} inputs, got {len(xs)}")
        src = self.input_transform or g
        feeds = {name: as_array(v, src.input(name).type, f"input {i}") for i, (name, v) in
                 enumerate(zip(self.inputs, xs))}
        if training:
            for i, name in enumerate(self.inputs):
                check_trainable(feeds[name], f"input {i}")
        if self.input_transform is not None:
            feeds = run_graph(self.input_transform, feeds)[0]
        return feeds

    def _label_feed(self, g: Graph, y) -> np.ndarray:
        want = g.input(LABEL).type
        if self.loss == "cross_entropy":
            y = as_array(y, want, "labels")
            classes = self.forward_graph.output("output").shape[-1]
            if y.size and (y.min() < 0 or y.max() >= classes):
                raise ValueError(f"labels must lie in [0, {classes}), got values in [{y.min()}, {y.max()}]")
            return y
        y = as_array(y, want, "targets")
        check_trainable(y, "targets")
        return y

    def _feeds(self, g: Graph, x, y) -> dict[str, np.ndarray]:
        feeds = {v.name: self.state[v.name] for v in g.inputs if v.name in self.state}
        feeds.update(self._data_feeds(g, x, training=True))
        feeds[LABEL] = self._label_feed(g, y)
        store = getattr(self, "page_store", None)
        if store is not None and any(v.name == store.name for v in g.inputs):
            feeds[store.name] = store.array
        if any(v.name == STEP for v in g.inputs):
            feeds[STEP] = np.array(self.steps, dtype=np.int32)
        return feeds

    # --- running ---------------------------------------------------------------------------
    def gradients(self, x, y) -> dict[str, np.ndarray]:
        """Gradients of the loss for the trained parameters, without updating. A parameter
        trained on some channels only gets zeros in the others. For an int8 program the
        gradients of int weights and biases are with respect to the integers themselves
        (d loss / d w_int = w_scale * d loss / d w_real), before QAS."""
        g = self.grad_graph
        out, _ = run_graph(g, self._feeds(g, x, y), set(self.graph_inputs) | {LABEL, STEP})
        return self._full_gradients(out)

    def _full_gradients(self, out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{param: gradient} from the grad graph's outputs `out`, a selected-channel gradient
        scattered into zeros of its parameter's shape."""
        grads = {}
        for p, sel in self.trainable.items():
            gv = out[grad_name(p)]
            grads[p] = gv if sel is None else sel.scatter(gv, self.state[p].shape)
        return grads

    def step(self, x, y) -> float:
        """One training step in place; returns the loss. A non-finite loss or weight raises
        NonFiniteLossError and leaves the weights as they were before this step."""
        g = self.train_graph
        feeds = self._feeds(g, x, y)
        saved = {k: self.state[k].copy() for k in self._written_state()}
        out, trace = run_graph(g, feeds, set(self.graph_inputs) | {LABEL, STEP})
        loss = float(out["loss"])
        bad = [k for k in saved if not np.all(np.isfinite(self.state[k]))]
        if not np.isfinite(loss) or bad:
            for k, v in saved.items():
                self.state[k][...] = v
            raise NonFiniteLossError(f"step {self.steps + 1}: loss is {loss}" + (f", {bad[0]} became non-finite"
                                     if bad else "") + f"; weights kept from step {self.steps}")
        self.steps += 1
        self.last_trace = trace
        return loss

    def _written_state(self) -> list[str]:
        """The state tensors a training step writes: trained weights, optimizer state, and
        whatever an op updates in place (train-mode batch norm's running statistics)."""
        from .ops import get_op

        g = self.train_graph
        cached = self.__dict__.get("_written")
        if cached is None or cached[0] is not g:  # once per train graph, not on every step
            inputs = set(g.inputs)
            written = {v.name for n in g.nodes if get_op(n.op).mutates
                       for _, j in get_op(n.op).shares for v in n.inputs[j:j + 1] if v in inputs}
            cached = self._written = (g, [k for k in self.state if k in self.trainable or k.startswith("momentum:")
                                          or k in written])
        return cached[1]

    def predict(self, x) -> np.ndarray:
        """Model outputs for a batch of any size (run in chunks of the compiled batch)."""
        g = self.forward_graph
        if len(self.inputs) != 1:
            feeds = {v.name: self.state[v.name] for v in g.inputs if v.name in self.state}
            feeds.update(self._data_feeds(g, x))
            return run_graph(g, feeds)[0]["output"]
        want = (self.input_transform or g).input(self.inputs[0]).type
        a = as_array(x, want, "input", batch_free=True)
        b = want.shape[0]
        n = a.shape[0]
        pad = (-n) % b
        if pad:
            a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], dtype=a.dtype)])
        feeds = {v.name: self.state[v.name] for v in g.inputs if v.name in self.state}
        outs = []
        for i in range(0, a.shape[0], b):
            feeds.update(self._data_feeds(g, a[i:i + b]))
            outs.append(run_graph(g, feeds)[0]["output"])
        return np.concatenate(outs)[:n]

    def apply(self, sched, page_file=None) -> "Program":
        """A new program running `sched` (from `edgetrain.schedule(self, ...)`): its train graph
        rewritten to recompute and page tensors as the schedule says, pages written to
        `page_file` (default: a temporary file). See schedule/apply.py."""
        from .schedule.apply import apply_schedule

        return apply_schedule(self, sched, page_file)

    def emit_c(self, out_dir, target: str = "host", samples=(), embed_weights=None):
        """Write this program as a C project (backends/c: host library or Cortex-M firmware)
        into `out_dir`; returns its path."""
        from .backends.c import emit_c

        return emit_c(self, out_dir, target=target, samples=samples, embed_weights=embed_weights)

    # --- weights out -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The current weights as torch tensors under the original model's state_dict keys.
        An int8 program gives its weights' real values (w_scale * w), with each batch norm
        folded into its convolution turned into the identity carrying the folded bias."""
        import torch

        state = self._export(self.state) if self._export is not None else self.state
        return {k: torch.from_numpy(np.array(state[name], copy=True)) for k, name in self._aliases.items()}

    def __repr__(self) -> str:
        n = sum(self.state[p].size for p in self.trainable)
        return (f"Program(trains {len(self.trainable)} tensors / {n:,} weights, loss={self.loss}, "
                f"{len(self.train_graph.nodes)} nodes; {self.memory.summary()})")
