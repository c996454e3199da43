"""Short float32 fine-tuning in PyTorch that trains only given parameters (and of a weight
only given channels): the trainer of contribution analysis (as the paper's own analysis,
which simulates in float) and of per-scheme accuracy.

Speed: a run whose lowest trained parameter sits high in the network does not need the
layers below it, which stay frozen. The model is traced with torch.fx; a *cut* is a point
in its forward code where exactly one tensor flows on (e.g. between two blocks, residual
connections included). The outputs at the highest cut below a run's lowest trained
parameter are computed once for all images and cached; the run trains only the part
above. Runs are processed by ascending cut, each cut's features computed from the
previous one's, so the whole network runs once over the data. A model fx cannot trace
is trained whole (same result, slower).

Every run starts from the same weights, sees the same images in the same order (numpy
default_rng(seed)) and masks its gradients so that untrained channels keep their values.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx

from ..autodiff import ChannelSelect

Trainable = Mapping[str, Optional[ChannelSelect]]
#: small batches gain nothing from more threads, and spinning threads on a shared core
#: slowed runs 50-fold when another process was busy (measured on 2 cores)
SINGLE_THREAD = 1
#: images per forward pass when computing cached features or test accuracy (memory only)
EVAL_BATCH = 256


class FineTuneError(ValueError):
    pass


@dataclass(frozen=True)
class FineTune:
    """How each run fine-tunes: SGD with momentum on cross-entropy, `epochs` passes over the
    training images in batches of `batch` (the last partial batch dropped), image order from
    numpy default_rng(seed); `threads` for PyTorch (None: leave its setting).

The defaults are bench/accuracy.py's on-device settings, 2 epochs. The learning rate
decides whether gains add up, which the budgeted search assumes: on mbv2-w0.35 (2,000
CIFAR-10 images), five weight pieces gained 36.4 points summed but 11.9 trained together
at lr 0.003 (single pieces learn faster, not better), and 7.2 summed vs 5.9 together at
lr 0.001, where the paper's 99 KB scheme also trains stably (+5.9, -1.7 at 0.003)."""

    epochs: int = 2
    batch: int = 8  # the on-device fine-tuning batch of bench/accuracy.py
    lr: float = 0.001
    momentum: float = 0.9
    seed: int = 0
    threads: Optional[int] = SINGLE_THREAD

    def __post_init__(self):
        for name in ("epochs", "batch", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "seed" else 1):
                raise FineTuneError(f"FineTune {name} must be an int >= {0 if name == 'seed' else 1}, got {v!r}")
        for name in ("lr", "momentum"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise FineTuneError(f"FineTune {name} must be a finite number >= 0, got {v!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise FineTuneError(f"FineTune threads must be None or an int >= 1, got {self.threads!r}")


def _as_split(data, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise FineTuneError(f"{what} must be a pair (images, labels)")
    x, y = (torch.as_tensor(np.asarray(a)) for a in data)
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y) or len(y) == 0:
        raise FineTuneError(f"{what}: expected images (N, ...) and labels (N,) with N >= 1, "
                            f"got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise FineTuneError(f"{what}: labels must be integers, got {y.dtype}")
    return x.float(), y.long()


class _Cuts:
    """The fx trace of a model and its cut points (node positions where one tensor flows on)."""

    def __init__(self, model: Optional[torch.nn.Module]):
        self.gm: Optional[fx.GraphModule] = None
        if model is None:
            return
        try:
            gm = fx.symbolic_trace(model)
        except Exception:  # fx cannot trace data-dependent control flow: train whole models
            return
        nodes = list(gm.graph.nodes)
        if sum(n.op == "placeholder" for n in nodes) != 1:
            return
        self.gm, self.nodes = gm, nodes
        pos = {n: i for i, n in enumerate(nodes)}
        last_use = {n: max((pos[u] for u in n.users), default=pos[n]) for n in nodes}
        dies: dict[int, list] = {}
        for n in nodes:
            dies.setdefault(last_use[n], []).append(n)
        self.cuts = []  # positions i such that only nodes[i] is used after i (get_attr aside)
        live: set = set()
        for i, n in enumerate(nodes):
            if n.op != "get_attr":
                live.add(n)
            live.difference_update(dies.get(i, ()))
            if n.op not in ("get_attr", "output") and live == {n}:
                self.cuts.append(i)
        self.first_use = {}  # parameter name -> position of the first node that reads it
        for i, n in enumerate(nodes):
            if n.op == "call_module":
                names = [f"{n.target}.{p}" for p, _ in gm.get_submodule(n.target).named_parameters()]
            elif n.op == "get_attr":
                names = [n.target]
            else:
                continue
            for name in names:
                self.first_use.setdefault(name, i)

    def cut_below(self, params) -> int:
        """The highest cut strictly below every node that reads one of `params` (-1: none)."""
        if self.gm is None:
            return -1
        missing = [p for p in params if p not in self.first_use]
        if missing or not params:
            raise FineTuneError(f"parameters {missing[:3]} are not read by the model's traced forward")
        lowest = min(self.first_use[p] for p in params)
        return max((c for c in self.cuts if c < lowest), default=-1)

    def segment(self, start: int, end: Optional[int]) -> Callable:
        """A module computing the value at cut `end` (None: the model's output) from the value
        at cut `start` (-1 or the placeholder: the model's input)."""
        g = fx.Graph()
        env: dict = {}
        first = start + 1
        if start < 0 or self.nodes[start].op == "placeholder":
            first = max(first, 1)
            env[self.nodes[0]] = g.placeholder("x")
        else:
            env[self.nodes[start]] = g.placeholder("x")

        def arg(a):
            if a not in env:  # a parameter fetched before the cut
                if a.op != "get_attr":
                    raise FineTuneError(f"fx node {a.name} crosses the cut")
                env[a] = g.node_copy(a, arg)
            return env[a]

        stop = len(self.nodes) - 1 if end is None else end
        for n in self.nodes[first:stop + 1]:
            env[n] = g.node_copy(n, arg)
        if end is None:
            g.output(fx.node.map_arg(self.nodes[-1].args[0], arg))
        else:
            g.output(env[self.nodes[end]])
        return fx.GraphModule(self.gm, g)


class FineTuner:
    """Fine-tunes copies of one model's weights on one data set, run after run."""

    def __init__(self, model: torch.nn.Module, train, test, config: FineTune = FineTune(),
                 cache_features: bool = True):
        if not isinstance(config, FineTune):
            raise FineTuneError(f"config must be FineTune, got {type(config).__name__}")
        self.config = config
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.params = dict(self.model.named_parameters())
        self.initial = {k: v.detach().clone() for k, v in self.params.items()}
        self.x_train, self.y_train = _as_split(train, "train")
        self.x_test, self.y_test = _as_split(test, "test")
        self.cuts = _Cuts(self.model if cache_features else None)
        self._last: Optional[tuple] = None  # run_one's cached (cut, features)

    def accuracy(self, trainable: Trainable) -> float:
        """Top-1 on the test images after fine-tuning `trainable`."""
        return self.accuracies({0: trainable})[0]

    def trained(self, trainable: Trainable) -> tuple[float, dict[str, torch.Tensor]]:
        """(top-1, the trained values of `trainable`) of one run."""
        out = {}
        self.accuracies({0: trainable}, keep=out)
        return out[0][:2]

    def accuracies(self, runs: Mapping[Hashable, Trainable],
                   progress: Optional[Callable[[Hashable, float], None]] = None, keep: Optional[dict] = None) -> dict:
        """{key: top-1 after fine-tuning runs[key]}, each run from the initial weights
        (`keep`, if given, receives {key: (top-1, trained values, per test image: correct)})."""
        for key, trainable in runs.items():
            self._check(key, trainable)
        cut_of = {key: self.cut_of(t) for key, t in runs.items()}
        out = {}
        with _threads(self.config.threads):
            at = (-1, (self.x_train, self.x_test))
            for key in sorted(runs, key=lambda k: cut_of[k]):  # sorted() is stable: input order on ties
                at = self._features(at, cut_of[key])
                trained, correct = self._run(self._top(at[0]), runs[key], *at[1])
                out[key] = int(correct.sum()) / len(correct)
                if keep is not None:
                    keep[key] = (out[key], trained, correct)
                if progress is not None:
                    progress(key, out[key])
        return {key: out[key] for key in runs}

    def cut_of(self, trainable: Trainable, key: Hashable = "run") -> int:
        """The cut whose cached features a run of `trainable` starts from (-1: the images);
        FineTuneError (naming the run `key`) if it does not fit the model."""
        self._check(key, trainable)
        return self.cuts.cut_below(list(trainable))

    def run_one(self, trainable: Trainable) -> tuple[float, np.ndarray]:
        """(top-1, per test image: correct) of one run, as accuracies() computes it. The
        features of the last cut used stay cached for the next call: a series of runs by
        ascending cut computes every feature once, by the same steps as accuracies(), so
        each result equals accuracies()' bit for bit."""
        with _threads(self.config.threads):
            cut = self.cut_of(trainable)
            at = self._last if self._last is not None and self._last[0] <= cut else (-1, (self.x_train, self.x_test))
            self._last = at = self._features(at, cut)
            _, correct = self._run(self._top(cut), trainable, *at[1])
        return int(correct.sum()) / len(correct), correct

    def _features(self, at: tuple, cut: int) -> tuple:
        """(cut, features at `cut`) computed from `at` = (a lower cut, its features)."""
        here, feats = at
        if cut == here:
            return at
        step = self.cuts.segment(here, cut)
        return cut, tuple(_forward(step, x) for x in feats)

    def _top(self, cut: int):
        return self.cuts.segment(cut, None) if self.cuts.gm is not None else self.model

    def _check(self, key, trainable: Trainable):
        if not trainable:
            raise FineTuneError(f"run {key!r} trains no parameter")
        unknown = [p for p in trainable if p not in self.params]
        if unknown:
            raise FineTuneError(f"run {key!r}: {unknown[:3]} are not parameters of the model (a scheme "
                                f"resolved on batch-norm-folded layers names folded biases that the float "
                                f"model lacks: fold batch norm into the model first)")
        for p, sel in trainable.items():
            if sel is not None and (sel.dim >= self.params[p].ndim or max(sel.index) >= self.params[p].shape[sel.dim]):
                raise FineTuneError(f"run {key!r}: channel selection {sel} does not fit "
                                    f"{p} {tuple(self.params[p].shape)}")

    def _run(self, top, trainable: Trainable, f_train: torch.Tensor, f_test: torch.Tensor):
        c = self.config
        params = [self.params[p] for p in trainable]
        masks = [None if sel is None else _mask(self.params[p], sel) for p, sel in trainable.items()]
        for p in params:
            p.requires_grad_(True)
        try:
            opt = torch.optim.SGD(params, lr=c.lr, momentum=c.momentum)
            rng = np.random.default_rng(c.seed)
            steps = len(f_train) // c.batch
            if steps == 0:
                raise FineTuneError(f"{len(f_train)} training images are fewer than one batch of {c.batch}")
            for _ in range(c.epochs):
                order = torch.from_numpy(rng.permutation(len(f_train)))
                for s in range(steps):
                    idx = order[s * c.batch:(s + 1) * c.batch]
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(top(f_train[idx]), self.y_train[idx]).backward()
                    for p, m in zip(params, masks):
                        if m is not None:
                            p.grad.mul_(m)
                    opt.step()
            logits = _forward(top, f_test)
            trained = {name: p.detach().clone() for name, p in zip(trainable, params)}
            return trained, (logits.argmax(1) == self.y_test).numpy()
        finally:
            with torch.no_grad():
                for name, p in zip(trainable, params):
                    p.requires_grad_(False)
                    p.copy_(self.initial[name])


def _mask(p: torch.Tensor, sel: ChannelSelect) -> torch.Tensor:
    shape = [1] * p.ndim
    shape[sel.dim] = p.shape[sel.dim]
    m = torch.zeros(shape, dtype=p.dtype)
    m.view(-1)[list(sel.index)] = 1
    return m


def _forward(module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([module(x[i:i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])


class _threads:
    def __init__(self, n: Optional[int]):
        self.n, self.before = n, None

    def __enter__(self):
        if self.n is not None:
            self.before = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.before is not None:
            torch.set_num_threads(self.before)
