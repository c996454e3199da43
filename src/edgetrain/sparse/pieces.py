"""Fine-tunes as independent pieces of work (scale.run_pieces): contribution analysis and
per-scheme accuracy run each of their fine-tunes as one piece, in this process or on Ray.

A piece is one set of trainable parameters (and channels); what all pieces share, the
model, the data and the FineTune settings, is a `TuneJob`, sent once to each worker. A
piece's result is plain JSON (top-1 and which test images it got right) so that it can be
appended to a results file; its key names exactly what it trains, and the job's
fingerprint names everything else the result depends on, so a rerun (or another analysis
of the same model and data) reuses a finished piece only where it would compute the same.

Each process keeps the fine-tuner of the last job it ran (its cached features serve the
next piece of the same job); `release()` drops it when a job is done.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from .finetune import FineTune, FineTuner, Trainable

#: the one fine-tuner this process keeps: {job fingerprint: tuner}
_TUNERS: dict[str, FineTuner] = {}


@dataclass(frozen=True, eq=False)
class TuneJob:
    """What every piece of one fine-tuning job shares."""

    model: torch.nn.Module
    train: tuple
    test: tuple
    config: FineTune
    fingerprint: str  # sha256 of the model (structure and weights), the data and the settings


def tune_job(model: torch.nn.Module, train, test, config: FineTune) -> TuneJob:
    """The job of fine-tuning `model` on `train`, scored on `test`, with `config`."""
    h = hashlib.sha256(repr(model).encode() + repr(config).encode())
    for name, t in model.state_dict().items():
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    arrays = []
    for split in (train, test):
        pair = tuple(np.ascontiguousarray(np.asarray(a)) for a in split)
        for a in pair:
            h.update(f"{a.dtype}:{a.shape}".encode())
            h.update(a.tobytes())
        arrays.append(pair)
    return TuneJob(model, arrays[0], arrays[1], config, h.hexdigest())


def tuner_of(job: TuneJob) -> FineTuner:
    """This process's fine-tuner of `job` (made on first use, the previous job's dropped)."""
    tuner = _TUNERS.get(job.fingerprint)
    if tuner is None:
        _TUNERS.clear()
        tuner = _TUNERS[job.fingerprint] = FineTuner(job.model, job.train, job.test, job.config)
    return tuner


def release() -> None:
    """Drop this process's fine-tuner (its copy of the model, the data and features)."""
    _TUNERS.clear()


def piece_key(trainable: Trainable) -> str:
    """A text naming exactly what a run trains: parameter -> None (all of it) or
    [dim, channels]."""
    return json.dumps({p: None if sel is None else [sel.dim, list(sel.index)]
                       for p, sel in sorted(trainable.items())}, separators=(",", ":"))


def tune_piece(job: TuneJob, trainable: Trainable) -> dict[str, Any]:
    """One fine-tune: {"top1": top-1, "correct": per test image 1/0 as a hex bitmap}."""
    top1, correct = tuner_of(job).run_one(trainable)
    return {"top1": top1, "correct": np.packbits(correct.astype(bool)).tobytes().hex()}


def correct_of(result: Mapping[str, Any], n: int) -> np.ndarray:
    """The per-image correct flags (bool, n) of a piece's result."""
    return np.unpackbits(np.frombuffer(bytes.fromhex(result["correct"]), np.uint8), count=n).astype(bool)


def in_cut_order(job: TuneJob, runs: Mapping[Any, Trainable]) -> list:
    """The keys of `runs` by ascending cut (stable), each run checked against the model: the
    order in which cached features serve most runs."""
    tuner = tuner_of(job)
    cut = {key: tuner.cut_of(t, key) for key, t in runs.items()}
    return sorted(runs, key=lambda k: cut[k])
