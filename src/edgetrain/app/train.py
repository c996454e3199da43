"""Fine-tuning a compiled program on labelled images, with a checkpoint per epoch.

`fit(built, data, opts, meta)` trains `built.prog` for `opts.epochs` epochs (counted from the
start, so a resumed run stops where an uninterrupted one would), one batch of the compiled
size per step, in an order drawn per epoch from (seed, epoch): a run resumed from any
checkpoint takes the same batches in the same order and ends with bit-equal weights.

After each epoch `<out>/epoch-NNNN.ckpt` is written atomically. When a step's loss is not
finite (Program.step keeps the weights of the step before), when the run blows up while
still finite (divergence.DivergenceGuard: the weights of the step before are put back), or
on Ctrl-C (handled between steps), `<out>/stopped.ckpt` records the last good state with its
place in the epoch, and TrainingStopped is raised: nothing done before is lost."""
from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from .checkpoint import Built, Checkpoint, save_checkpoint
from ..data.folder import ImageSet
from .divergence import DivergenceGuard
from ..program import NonFiniteLossError

EPOCH_FILE = "epoch-{:04d}.ckpt"
STOPPED_FILE = "stopped.ckpt"
#: int8 programs are calibrated on this many training images when no calibration set is given
CALIBRATION_IMAGES = 32
#: images per predict call when measuring accuracy
EVAL_CHUNK = 256


class TrainingStopped(Exception):
    """Training stopped before the last epoch; the last good state is saved in `checkpoint`."""

    def __init__(self, message: str, checkpoint: Path, reason: str):
        super().__init__(message)
        self.checkpoint, self.reason = checkpoint, reason


@dataclass(frozen=True)
class TrainOptions:
    epochs: int
    out_dir: Path
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    progress: bool = True
    #: tests: called as hook("save", path) between a checkpoint's fsync and its rename, and
    #: hook("step", n) before step n (1-based, counted over the whole run)
    hook: Optional[Callable[[str, object], None]] = None


@dataclass
class TrainMeta:
    """Where a run stands; stored in each checkpoint's `train`."""

    seed: int = 0
    data: str = ""  # the training data's fingerprint
    epoch: int = 0  # epochs done
    position: int = 0  # batches done in the current epoch
    loss_sum: float = 0.0  # over the current epoch's batches done
    history: list = field(default_factory=list)  # per epoch: {"epoch", "loss", "steps", "val_accuracy"}
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    reason: str = "epoch"  # why this checkpoint was written: epoch | compiled | non-finite | diverged | interrupted

    def as_dict(self) -> dict:
        return {"seed": self.seed, "data": self.data, "epoch": self.epoch, "position": self.position,
                "loss_sum": self.loss_sum, "history": list(self.history), "mean": list(self.mean),
                "std": list(self.std), "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict) -> "TrainMeta":
        return cls(seed=int(d.get("seed", 0)), data=str(d.get("data", "")), epoch=int(d.get("epoch", 0)),
                   position=int(d.get("position", 0)), loss_sum=float(d.get("loss_sum", 0.0)),
                   history=list(d.get("history", [])), mean=tuple(d.get("mean", (0.0,))),
                   std=tuple(d.get("std", (1.0,))), reason=str(d.get("reason", "epoch")))


def image_shape(prog) -> tuple[int, int, int, int]:
    """(B, C, H, W) of the program's single image input."""
    from ..data.folder import check_image_shape

    if len(prog.inputs) != 1:
        raise ValueError(f"training on images needs a model with one input; this one takes {len(prog.inputs)}")
    t = (prog.input_transform or prog.forward_graph).input(prog.inputs[0]).type
    if t.dtype != "float32":
        raise ValueError(f"training on images needs a float32 image input; the model's is {t.dtype}")
    c, h, w = check_image_shape(t.shape)
    return t.shape[0], c, h, w


def check_labels(prog, data: ImageSet) -> None:
    """The data's classes must be among the model's outputs."""
    classes = prog.forward_graph.output("output").shape[-1]
    if len(data.classes) > classes or (len(data) and int(data.labels.max()) >= classes):
        raise ValueError(f"labels out of range: {data.source} has {len(data.classes)} classes "
                         f"({', '.join(data.classes[:12])}{', ...' if len(data.classes) > 12 else ''}) but the model "
                         f"outputs {classes}; compile it with --classes {len(data.classes)} (or a factory argument)")


def calibration_batch(data: ImageSet, shape, mean, std, seed: int, n: int = CALIBRATION_IMAGES) -> np.ndarray:
    """`n` training images (a fixed random choice) as one float batch, for int8 scales."""
    idx = np.sort(np.random.default_rng([seed, 1 << 20]).permutation(len(data))[:n])
    return data.batch(idx, shape, mean, std)


def accuracy(prog, data: ImageSet, shape, mean, std) -> float:
    right = 0
    for i in range(0, len(data), EVAL_CHUNK):
        idx = np.arange(i, min(i + EVAL_CHUNK, len(data)))
        right += int((prog.predict(data.batch(idx, shape, mean, std)).argmax(-1) == data.labels[idx]).sum())
    return right / max(len(data), 1)


class _DeferInterrupt:
    """Ctrl-C (SIGINT) sets a flag instead of raising in the middle of a step (whose updates
    are applied in place as it runs); the loop checks it between steps."""

    def __init__(self):
        self.hit = False
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.hit:  # a second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def fit(built: Built, data: ImageSet, opts: TrainOptions, meta: TrainMeta,
        val: Optional[ImageSet] = None, log=print) -> list[Path]:
    """Train `built.prog` on `data` from where `meta` stands to `opts.epochs` epochs; returns
    the checkpoints written. Raises TrainingStopped (after saving stopped.ckpt) on a
    non-finite loss, a blow-up (DivergenceGuard) or Ctrl-C."""
    from tqdm import tqdm

    prog = built.prog
    b, c, h, w = image_shape(prog)
    shape = (c, h, w)
    check_labels(prog, data)
    if val is not None:
        check_labels(prog, val)
    n_batches = len(data) // b
    if n_batches == 0:
        raise ValueError(f"{data.source} has {len(data)} images, fewer than one batch of {b}")
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(name: str) -> Path:
        hook = opts.hook
        pause = (lambda tmp: hook("save", tmp)) if hook is not None else None
        path = save_checkpoint(out / name, Checkpoint.of(built, meta.as_dict()), pause)
        written.append(path)
        return path

    def stop(reason: str, message: str):
        meta.reason = reason
        path = save(STOPPED_FILE)
        raise TrainingStopped(f"{message}; the last good weights (after {prog.steps} steps, epoch "
                              f"{meta.epoch + 1} batch {meta.position}/{n_batches}) are saved in {path}", path, reason)

    guard = DivergenceGuard(prog)
    with _DeferInterrupt() as interrupt:
        for epoch in range(meta.epoch, opts.epochs):
            order = np.random.default_rng([meta.seed, epoch]).permutation(len(data))
            t0 = time.perf_counter()
            bar = tqdm(total=n_batches, initial=meta.position, desc=f"epoch {epoch + 1}/{opts.epochs}",
                       disable=not opts.progress, file=sys.stderr, unit="step", dynamic_ncols=True, leave=False)
            try:
                for i in range(meta.position, n_batches):
                    idx = order[i * b:(i + 1) * b]
                    x, y = data.batch(idx, shape, opts.mean, opts.std), data.labels[idx]
                    if opts.hook is not None:
                        opts.hook("step", prog.steps + 1)
                    before = guard.before_step()
                    try:
                        with np.errstate(all="ignore"):  # a diverging step is reported once, below
                            loss = prog.step(x, y)
                    except NonFiniteLossError as err:
                        stop("non-finite", f"training stopped: {err}")
                    blowup = guard.check(loss)
                    if blowup is not None:
                        guard.undo(before)
                        stop("diverged", f"training stopped: step {prog.steps + 1} diverged: {blowup}; weights kept "
                                         f"from step {prog.steps} (the learning rate may be too high)")
                    meta.position, meta.loss_sum = i + 1, meta.loss_sum + loss
                    bar.update(1)
                    bar.set_postfix(loss=f"{meta.loss_sum / (i + 1):.4f}", refresh=False)
                    if interrupt.hit:
                        stop("interrupted", "training interrupted")
            finally:
                bar.close()
            entry = {"epoch": epoch + 1, "loss": meta.loss_sum / n_batches, "steps": prog.steps}
            if val is not None:
                entry["val_accuracy"] = accuracy(prog, val, shape, opts.mean, opts.std)
            meta.history.append(entry)
            meta.epoch, meta.position, meta.loss_sum, meta.reason = epoch + 1, 0, 0.0, "epoch"
            path = save(EPOCH_FILE.format(epoch + 1))
            acc = f"; val accuracy {100 * entry['val_accuracy']:.1f}%" if "val_accuracy" in entry else ""
            log(f"epoch {epoch + 1}/{opts.epochs}: mean loss {entry['loss']:.4f} over {n_batches} steps{acc} "
                f"({time.perf_counter() - t0:.1f} s); saved {path}")
    return written


def describe_skipped(skipped: Sequence[str]) -> str:
    head = "\n  ".join(skipped[:10])
    more = f"\n  ... and {len(skipped) - 10} more" if len(skipped) > 10 else ""
    return f"warning: skipped {len(skipped)} unreadable image(s):\n  {head}{more}"
