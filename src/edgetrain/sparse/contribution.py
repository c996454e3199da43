"""Contribution analysis (Tiny Training, MCUNetV3, section 3.2): the accuracy gain of
each piece of a sparse update, measured on real data.

A piece is either "the biases of the last k layers" or "layer i's weights, ratio r of its
channels". As in the paper, a bias piece's gain is the top-1 after a short fine-tune of
the classifier and the last k biases minus that of the classifier alone (the baseline),
and a weight piece's gain is measured over a bias-only update: the top-1 after
fine-tuning the classifier, the biases of the last `weight_base` layers and that weight
piece, minus the top-1 without the weight piece. `weight_base` defaults to the analysed
bias depth with the largest gain, the bias update a search will most likely pick, provided
that gain clears the noise (SIGNIFICANCE paired standard errors); otherwise the weight gains
are over the classifier alone. (A bias depth that won by chance is a bad base: on the
BasicMotions GRU, 10 held-out cases, the recurrent bias "gained" +10 points at a standard
error of 15, and every weight piece measured over it lost, down to -50 points for the GRU's
input weights, which gain +30 over the classifier alone and reach 0.85 top-1 on the test
split against 0.30 for the recurrent bias; the search then chose the recurrent bias.) (Gains
measured over the classifier alone do not add up: on mbv2-w0.35 five weight pieces each
gained +4-6 points over the classifier alone, largely the same gain that the biases
give, and schemes searched on those sums fell 1-5 points short of the paper's.) The channels are exactly those compile() trains for `Sparse(weights={i: r})`
(largest L2 norm of the weights compile() resolves schemes on: `scheme_layers`). The
fine-tune is float32 PyTorch (`finetune.FineTuner`), as in the paper's analysis.

The result, a `ContributionTable`, is what `compile(update="auto", contributions=...)`
maximises under a memory budget; it saves to and loads from JSON.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..scale import Executor, as_executor, run_pieces
from ..trainable import BiasOnly, Full, LastK, SchemeError, Sparse, UpdateScheme
from .finetune import FineTune, Trainable
from .pieces import TuneJob, correct_of, in_cut_order, piece_key, release, tune_job, tune_piece
from .scheme_layers import scheme_layers

#: channel ratios of the paper's analysis and released schemes
DEFAULT_RATIOS = (0.125, 0.25, 0.5, 1.0)
#: the paper's released schemes train weights only in the last ~20 convolutions
#: (mbv2-w0.35: layers 27..49 of 51): the layers analysed by default
DEFAULT_LAST_LAYERS = 20
#: default bias depths: every BIAS_STEP-th k up to BIAS_DEPTH_FACTOR x the analysed layers
#: (the paper's released schemes train the biases of the last 16..34 of mbv2's 51 layers)
BIAS_STEP = 4
BIAS_DEPTH_FACTOR = 2
FORMAT = "edgetrain-contributions/1"
#: a gain counts as measured (not noise) above this many standard errors: the bias depth
#: that weight gains are measured over, and the pieces update="auto" offers (auto.py)
SIGNIFICANCE = 2.0
FILE_MODE = 0o644  # mkstemp makes 0600 files; a results file is for everyone to read


class ContributionError(ValueError):
    pass


@dataclass(frozen=True)
class ContributionTable:
    """Measured accuracy gains (fractions of 1, e.g. 0.02 = +2 points of top-1). `stderr`
    is the median standard error of the gains (paired over the test images): the search
    offers only pieces whose gain clears it clearly (auto.SIGNIFICANCE)."""

    model: str  # a name for the model (e.g. "mbv2-w0.35")
    layers: tuple[str, ...]  # the weight of each layer Sparse can name, by index: checks the model
    base_accuracy: float  # top-1 after fine-tuning the classifier alone
    bias_gains: Mapping[int, float]  # k -> gain of also training the biases of the last k layers
    weight_gains: Mapping[tuple[int, float], float]  # (layer, ratio) -> gain of also training those weights
    meta: Mapping[str, Any] = field(default_factory=dict)  # how it was measured
    stderr: float = 0.0  # typical standard error of one gain (0: unknown)
    weight_base: int = 0  # weight gains are over training the biases of the last weight_base layers

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(str(v) for v in self.layers))
        object.__setattr__(self, "bias_gains", {int(k): float(v) for k, v in sorted(dict(self.bias_gains).items())})
        object.__setattr__(self, "weight_gains", {(int(i), float(r)): float(v)
                                                  for (i, r), v in sorted(dict(self.weight_gains).items())})
        object.__setattr__(self, "meta", dict(self.meta))
        object.__setattr__(self, "weight_base", int(self.weight_base))
        bad = [k for k in self.bias_gains if not 1 <= k <= len(self.layers)]
        bad += [] if 0 <= self.weight_base <= len(self.layers) else [f"weight_base={self.weight_base}"]
        bad += [i for i, r in self.weight_gains if not 0 <= i < len(self.layers) or not 0 < r <= 1]
        if bad:
            raise ContributionError(f"table entries out of range for {len(self.layers)} layers: {bad[:5]}")
        object.__setattr__(self, "stderr", float(self.stderr))
        values = [self.base_accuracy, self.stderr, *self.bias_gains.values(), *self.weight_gains.values()]
        if not all(math.isfinite(v) for v in values) or self.stderr < 0:
            raise ContributionError("table holds a non-finite accuracy or gain, or a negative stderr")

    __hash__ = None  # holds dicts

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The `n` largest gains as (description, gain), best first."""
        rows = [(f"bias last {k}", g) for k, g in self.bias_gains.items()]
        rows += [(f"layer {i} weights x{r:g}", g) for (i, r), g in self.weight_gains.items()]
        return sorted(rows, key=lambda t: -t[1])[:n]

    def check_layers(self, weights: Sequence[str]) -> None:
        """ContributionError unless `weights` (of the layers Sparse can name in the model to
        search for, by index) are the analysed model's."""
        ours = tuple(weights)
        if ours != self.layers:
            raise ContributionError(f"the contribution table of {self.model!r} was measured on a model with "
                                    f"{len(self.layers)} layers ({', '.join(self.layers[:2])}, ...), this model has "
                                    f"{len(ours)} ({', '.join(ours[:2])}, ...): analyse this model "
                                    f"(edgetrain.sparse.analyze_contributions or bench/contribution.py)")

    def to_json(self) -> str:
        weights: dict[str, dict[str, float]] = {}
        for (i, r), g in self.weight_gains.items():
            weights.setdefault(str(i), {})[repr(r)] = g
        return json.dumps({"format": FORMAT, "model": self.model, "base_accuracy": self.base_accuracy,
                           "stderr": self.stderr, "weight_base": self.weight_base,
                           "bias_gains": {str(k): g for k, g in self.bias_gains.items()},
                           "weight_gains": weights, "layers": list(self.layers), "meta": self.meta}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ContributionTable":
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT:
                raise ContributionError(f"not a contribution table (format {d.get('format')!r}, expected {FORMAT!r})")
            weights = {(int(i), float(r)): g for i, by_r in d["weight_gains"].items() for r, g in by_r.items()}
            return cls(d["model"], tuple(d["layers"]), float(d["base_accuracy"]),
                       {int(k): g for k, g in d["bias_gains"].items()}, weights, d.get("meta", {}),
                       float(d.get("stderr", 0.0)), int(d.get("weight_base", 0)))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as err:
            if isinstance(err, ContributionError):
                raise
            raise ContributionError(f"cannot read contribution table: {type(err).__name__}: {err}") from None

    def save(self, path: Union[str, os.PathLike]) -> Path:
        """Write the JSON atomically (temporary file, fsync, rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json() + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "ContributionTable":
        path = Path(path)
        if not path.is_file():
            raise ContributionError(f"no contribution table at {path}; make one with "
                                    f"edgetrain.sparse.analyze_contributions(...).save(path) or bench/contribution.py")
        return cls.from_json(path.read_text())


def as_table(contributions: Union[ContributionTable, str, os.PathLike]) -> ContributionTable:
    """A table, or the table saved at a path."""
    if isinstance(contributions, ContributionTable):
        return contributions
    if isinstance(contributions, (str, os.PathLike)):
        return ContributionTable.load(contributions)
    raise ContributionError(f"contributions must be a ContributionTable or the path of its JSON, "
                            f"got {type(contributions).__name__}")


def analyze_contributions(model: torch.nn.Module, train, test, *, name: str = "model",
                          layers: Optional[Sequence[int]] = None, last: int = DEFAULT_LAST_LAYERS,
                          ratios: Sequence[float] = DEFAULT_RATIOS,
                          bias_ks: Optional[Sequence[int]] = None, weight_base: Union[int, str] = "best",
                          config: FineTune = FineTune(),
                          quantize: Optional[str] = "int8", meta: Optional[Mapping[str, Any]] = None,
                          progress: Optional[Callable[[str, float], None]] = None,
                          executor: Union[None, str, Executor] = None,
                          results: Union[None, str, os.PathLike] = None) -> ContributionTable:
    """Measure the gain of the biases of the last k layers (k in `bias_ks`) and of each
    layer's weights (Sparse indices `layers`) at each ratio in `ratios`, fine-tuning
    `model` (a classifier, eval mode) on `train` = (images, labels) and scoring top-1 on
    `test`. Defaults: the `last` layers; k every BIAS_STEP up to
    BIAS_DEPTH_FACTOR times that many, every k when that is below BIAS_STEP (a model with
    fewer than BIAS_STEP layers: `default_bias_ks`). Weight gains are over training the biases of the
    last `weight_base` layers ("best": the k in `bias_ks` with the largest gain that clears
    SIGNIFICANCE paired standard errors, else 0, `best_bias_depth`; 0: over the classifier
    alone). Channels are those compile(..., quantize=quantize) trains.
    `progress(label, top1)` is called after each run.

    Each fine-tune is an independent piece (sparse/pieces.py) run by `executor`: None or
    "serial" in this process, "ray" as Ray tasks on a local Ray, or an edgetrain.scale
    Executor (`RayExecutor(address="HOST:PORT")` for a cluster); the table is the same bit
    for bit. With `results` (a path), each fine-tune is appended to that file as it
    finishes and a rerun takes the finished ones from it (docs/scale.md)."""
    t0 = time.perf_counter()
    # resolved once, before any work: a bad name or a missing Ray fails here, and a local Ray
    # started for "ray" (on first use) serves both rounds of fine-tunes
    executor, owned = as_executor(executor)
    x0 = torch.as_tensor(train[0][:1]).float() if isinstance(train, (tuple, list)) and len(train) == 2 else None
    if x0 is None:
        raise ContributionError("train must be a pair (images, labels)")
    sl = scheme_layers(model, (x0,), quantize)
    n = sl.n_sparse_layers
    if n == 0:
        raise ContributionError("the model has no conv/linear layer besides its classifier")
    layers = tuple(range(max(0, n - last), n)) if layers is None else tuple(int(i) for i in layers)
    if bias_ks is None:
        bias_ks = default_bias_ks(n, len(layers))
        if not bias_ks:  # layers=(): the default depths follow the analysed layers
            warnings.warn(f"analyze_contributions measures no bias gains: no layer is analysed for weights, "
                          f"and the default bias depths follow them; give bias_ks (1..{n})", stacklevel=2)
    bias_ks, ratios = tuple(sorted({int(k) for k in bias_ks})), tuple(sorted({float(r) for r in ratios}))
    bad = [i for i in layers if not 0 <= i < n] + [k for k in bias_ks if not 1 <= k <= n]
    if bad or not all(0 < r <= 1 for r in ratios):
        raise ContributionError(f"the model has {n} layers Sparse can name (0..{n - 1}): layers and bias depths "
                                f"must lie within them, ratios in (0, 1]; got {bad or list(ratios)}")
    if not (weight_base == "best" or (isinstance(weight_base, int) and not isinstance(weight_base, bool)
                                      and 0 <= weight_base <= n)):
        raise ContributionError(f"weight_base must be 'best' or a bias depth 0..{n}, got {weight_base!r}")
    job = tune_job(model, train, test, config)
    report = None if progress is None else (lambda key, acc: progress(_label(key), acc))
    runs = {"base": Sparse(), **{("bias", k): Sparse(bias_last=k) for k in bias_ks}}
    try:
        kept = _run_all(job, {key: sl.resolve(s) for key, s in runs.items()}, executor, results, report)
        acc = {key: top1 for key, (top1, _) in kept.items()}
        base = acc["base"]
        bias_gains = {k: acc[("bias", k)] - base for k in bias_ks}
        bias_stderr = {k: paired_stderr(kept[("bias", k)][1], kept["base"][1]) for k in bias_ks}
        if weight_base == "best":
            weight_base = best_bias_depth(bias_gains, bias_stderr)
        w_ref = "base" if weight_base == 0 else ("bias", weight_base)
        runs = {("weight", i, r): Sparse(bias_last=weight_base, weights={i: r}) for i in layers for r in ratios}
        if w_ref not in kept:
            runs[w_ref] = Sparse(bias_last=weight_base)
        kept.update(_run_all(job, {key: sl.resolve(s) for key, s in runs.items()}, executor, results, report))
        acc = {key: top1 for key, (top1, _) in kept.items()}
    finally:
        release()
        if owned:
            executor.close()
    # a gain is a paired difference on the same test images: its standard error is that of
    # the per-image differences (-1, 0, 1) over the test set; the table keeps the median
    errors = [paired_stderr(kept[key][1], kept["base" if key[0] == "bias" else w_ref][1])
              for key in kept if key not in ("base", w_ref)]
    info = {"quantize": quantize, "analysed_layers": list(layers), "ratios": list(ratios), "bias_ks": list(bias_ks),
            "bias_stderr": [bias_stderr[k] for k in bias_ks],  # of each bias gain, in bias_ks order
            **asdict(config), "train_images": len(job.train[1]), "test_images": len(job.test[1]),
            "seconds": round(time.perf_counter() - t0, 1), **dict(meta or {})}
    if not bias_ks:
        info["bias_gains"] = "none measured (no bias depth asked for)"
    return ContributionTable(name, tuple(layer.weight for layer in sl.dense[:-1]), base, bias_gains,
                             {(i, r): acc[("weight", i, r)] - acc[w_ref] for i in layers for r in ratios}, info,
                             float(np.median(errors)) if errors else 0.0, weight_base)


def best_bias_depth(gains: Mapping[int, float], stderrs: Mapping[int, float],
                    significance: float = SIGNIFICANCE) -> int:
    """The bias depth weight gains are measured over (weight_base="best"): the k with the
    largest gain (the smaller k on ties) among those whose gain exceeds `significance` times
    its paired standard error, `stderrs[k]`; 0 (the classifier alone) when none does, e.g.
    every bias depth lost accuracy or won a few held-out cases by chance."""
    clear = [k for k, g in gains.items() if g > 0 and g > significance * stderrs[k]]
    return max(clear, key=lambda k: (gains[k], -k)) if clear else 0


def default_bias_ks(n: int, analysed: int) -> tuple[int, ...]:
    """The bias depths measured by default for a model with `n` layers Sparse can name, of
    which `analysed` are analysed for weights: every BIAS_STEP-th k up to BIAS_DEPTH_FACTOR x
    `analysed` (at most n); when that limit is below BIAS_STEP (a model with fewer than
    BIAS_STEP layers, or one or two layers analysed) every depth up to it, so that a small
    model's bias gains are measured too."""
    top = min(n, BIAS_DEPTH_FACTOR * analysed)
    return tuple(range(BIAS_STEP, top + 1, BIAS_STEP)) or tuple(range(1, top + 1))


def _run_all(job: TuneJob, runs: Mapping[Any, Trainable], executor, results,
             progress: Optional[Callable[[Any, float], None]]) -> dict:
    """{key: (top-1, per test image: correct)} of fine-tuning each of `runs`, one piece per
    distinct trainable set, by ascending cut (the order a serial run computes fastest)."""
    pieces: dict[str, Trainable] = {}
    keys_of: dict[str, list] = {}
    for key in in_cut_order(job, runs):
        pieces.setdefault(piece_key(runs[key]), runs[key])
        keys_of.setdefault(piece_key(runs[key]), []).append(key)

    def report(piece: str, result: dict):
        for key in keys_of[piece]:
            progress(key, result["top1"])

    done = run_pieces(tune_piece, job, pieces, executor=executor, results=results,
                      job=job.fingerprint, progress=None if progress is None else report)
    n = len(job.test[1])
    return {key: (done[piece]["top1"], correct_of(done[piece], n)) for piece, keys in keys_of.items() for key in keys}


def paired_stderr(correct: np.ndarray, ref: np.ndarray) -> float:
    """Standard error of a top-1 difference paired over the same test images: that of the
    per-image differences (-1, 0, 1) of `correct` and `ref` (bool arrays)."""
    n = len(ref)
    return float(np.std(correct.astype(np.int8) - ref.astype(np.int8), ddof=1) / math.sqrt(n)) if n > 1 else 0.0


def _label(key) -> str:
    if key == "base":
        return "classifier only"
    return f"bias last {key[1]}" if key[0] == "bias" else f"layer {key[1]} weights x{key[2]:g}"


def scheme_accuracies(model: torch.nn.Module, schemes: Mapping[Any, UpdateScheme], train, test, *,
                      config: FineTune = FineTune(), quantize: Optional[str] = "int8",
                      executor: Union[None, str, Executor] = None,
                      results: Union[None, str, os.PathLike] = None) -> dict:
    """{label: top-1 after fine-tuning `model` with schemes[label]}, trained as in the
    analysis (same trainer, data, order and channels as compile(..., quantize=quantize)),
    each scheme one piece run by `executor`, saved to `results` (as analyze_contributions)."""
    bad = [s for s in schemes.values() if not isinstance(s, (Full, BiasOnly, LastK, Sparse))]
    if bad:
        raise SchemeError(f"not an update scheme: {bad[0]!r}")
    executor, owned = as_executor(executor)
    x0 = torch.as_tensor(train[0][:1]).float()
    try:
        sl = scheme_layers(model, (x0,), quantize)
        done = _run_all(tune_job(model, train, test, config), {k: sl.resolve(s) for k, s in schemes.items()},
                        executor, results, None)
    finally:
        release()
        if owned:
            executor.close()
    return {k: done[k][0] for k in schemes}


def scheme_accuracy(model: torch.nn.Module, scheme: UpdateScheme, train, test, *,
                    config: FineTune = FineTune(), quantize: Optional[str] = "int8") -> float:
    """Top-1 after fine-tuning `model` with `scheme` (see scheme_accuracies)."""
    return scheme_accuracies(model, {0: scheme}, train, test, config=config, quantize=quantize)[0]
