"""One client's round, the server's evaluation, and the whole run without Flower.

A client's round is a pure function of (job, client, round, global trained tensors): the
program's state is reset to its compiled initial state (frozen weights, zero momentum: each
round's local SGD starts afresh, as FedAvg's clients do), the global trained tensors are
loaded, and `local_steps` steps run on batches drawn from the client's shard by a generator
seeded with (seed, round, client). The step counter, which keys the int8 updates' stochastic
rounding, starts at a number of its own for each (round, client), so no two local updates
share rounding noise. So Flower's run (flower.py), whatever worker runs which client in
whatever order, gives the global tensors `run_serial` gives, bit for bit.
"""
from __future__ import annotations

import csv
import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Mapping, Optional

import numpy as np

from .average import fed_average, model_bytes, update_bytes
from .job import FederatedJob, Setup, setup_of

log_ = logging.getLogger(__name__)
#: images per predict call when measuring test accuracy
EVAL_CHUNK = 256


@dataclass(frozen=True)
class ClientUpdate:
    client: int
    samples: int  # the shard's size: the client's FedAvg weight
    values: dict  # {name: trained part} after the local steps
    loss: float  # mean loss of its local steps
    steps: int


@dataclass
class RoundRecord:
    round: int  # 0: the model before any round
    accuracy: float  # the global model on the test set
    loss: Optional[float] = None  # mean of the clients' local losses (weighted by samples)
    client_bytes: int = 0  # what each client sent this round (the trained tensors' parts)
    model_bytes: int = 0  # what it would send with full-model FedAvg
    seconds: float = 0.0


@dataclass
class FederatedResult:
    job: FederatedJob
    rounds: list = field(default_factory=list)  # RoundRecord per round, round 0 first
    values: dict = field(default_factory=dict)  # the final global trained tensors
    shard_sizes: list = field(default_factory=list)

    def as_dict(self) -> dict:
        """The job (a model factory as the sha256 of its model file's text, when it has one), the
        shard sizes and every round's figures, as JSON values."""
        job = {f.name: getattr(self.job, f.name) for f in fields(self.job) if f.name != "model_factory"}
        if self.job.model_factory is not None:
            job["model_sha256"] = getattr(self.job.model_factory, "sha256", None)
        return {"job": job, "shard_sizes": self.shard_sizes, "rounds": [asdict(r) for r in self.rounds]}


def _round_start_step(setup: Setup, rnd: int, client: int) -> int:
    """Where (round, client)'s step counter starts: past every other (round, client)'s steps."""
    stride = max(setup.local_steps(k) for k in range(setup.job.clients))
    return ((rnd - 1) * setup.job.clients + client) * stride


def client_indices(setup: Setup, rnd: int, client: int) -> np.ndarray:
    """The training images of (round, client)'s local steps, batch after batch: passes over
    its shard, each in an order drawn from (seed, round, client)."""
    j, shard = setup.job, setup.shards[client]
    need = setup.local_steps(client) * j.batch
    rng = np.random.default_rng([j.seed, 0xC11E, rnd, client])
    passes = -(-need // len(shard))
    return np.concatenate([shard[rng.permutation(len(shard))] for _ in range(passes)])[:need]


def reset_with(setup: Setup, values: Mapping[str, np.ndarray], steps: int = 0) -> None:
    """The program's state as compiled (zero momentum), with `values` as its trained tensors."""
    prog = setup.prog
    prog.load_state(prog.compiled.fresh_state(), steps=steps)
    prog.load_trained(values)


def client_update(setup: Setup, client: int, rnd: int, values: Mapping[str, np.ndarray]) -> ClientUpdate:
    """Client `client`'s local training in round `rnd` (1-based) from the global `values`."""
    j = setup.job
    reset_with(setup, values, _round_start_step(setup, rnd, client))
    idx = client_indices(setup, rnd, client)
    losses = [setup.prog.step(setup.batch(idx[s:s + j.batch]), setup.train.labels[idx[s:s + j.batch]])
              for s in range(0, len(idx), j.batch)]
    new = {k: t.values for k, t in setup.prog.trained_tensors().items()}
    return ClientUpdate(client, len(setup.shards[client]), new, float(np.mean(losses)), len(losses))


def evaluate(setup: Setup, values: Mapping[str, np.ndarray]) -> float:
    """Test accuracy of the program with the trained tensors `values`."""
    reset_with(setup, values)
    test, right = setup.test, 0
    for i in range(0, len(test), EVAL_CHUNK):
        idx = np.arange(i, min(i + EVAL_CHUNK, len(test)))
        x = test.batch(idx, setup.shape, setup.mean, setup.std)
        right += int((setup.prog.predict(x).argmax(-1) == test.labels[idx]).sum())
    return right / max(len(test), 1)


def aggregate(setup: Setup, updates: list) -> dict:
    """FedAvg of the clients' updates (sorted by client id, so the sum's order is fixed)."""
    ups = sorted(updates, key=lambda u: u.client)
    return fed_average(setup.prog.trained_tensors(), [(u.samples, u.values) for u in ups])


def initial_values(setup: Setup) -> dict:
    reset_with(setup, {})
    return {k: t.values for k, t in setup.prog.trained_tensors().items()}


def round_record(setup: Setup, rnd: int, values, updates, seconds: float) -> RoundRecord:
    n = sum(u.samples for u in updates)
    loss = sum(u.loss * u.samples for u in updates) / n
    return RoundRecord(rnd, evaluate(setup, values), loss, update_bytes(setup.prog.trained_tensors()),
                       model_bytes(setup.prog), seconds)


def run_serial(job: FederatedJob, log: Optional[Callable[[RoundRecord], None]] = None) -> FederatedResult:
    """The federated run in one process, clients one after another (the reference Flower's
    run must equal)."""
    setup = setup_of(job)
    values = initial_values(setup)
    res = FederatedResult(job, [RoundRecord(0, evaluate(setup, values))], shard_sizes=[len(s) for s in setup.shards])
    if log:
        log(res.rounds[0])
    for rnd in range(1, job.rounds + 1):
        t0 = time.perf_counter()
        updates = [client_update(setup, k, rnd, values) for k in range(job.clients)]
        values = aggregate(setup, updates)
        for u in updates:
            log_.debug("round %d client %d: %d steps, mean loss %.4f", rnd, u.client, u.steps, u.loss)
        res.rounds.append(round_record(setup, rnd, values, updates, time.perf_counter() - t0))
        if log:
            log(res.rounds[-1])
    res.values = values
    return res


def run_centralized(job: FederatedJob, log: Optional[Callable[[RoundRecord], None]] = None) -> FederatedResult:
    """The baseline: one program trained on the union of the shards, as many steps per
    "round" as all clients take in one (the same sample-steps), evaluated after each."""
    setup = setup_of(job)
    j, prog = job, setup.prog
    union = np.sort(np.concatenate(setup.shards))
    per_round = sum(setup.local_steps(k) for k in range(j.clients))
    values = initial_values(setup)
    res = FederatedResult(job, [RoundRecord(0, evaluate(setup, values))], shard_sizes=[len(union)])
    reset_with(setup, values)
    for rnd in range(1, j.rounds + 1):
        t0 = time.perf_counter()
        rng = np.random.default_rng([j.seed, 0xCE47, rnd])
        need = per_round * j.batch
        idx = np.concatenate([union[rng.permutation(len(union))] for _ in range(-(-need // len(union)))])[:need]
        losses = [prog.step(setup.batch(idx[s:s + j.batch]), setup.train.labels[idx[s:s + j.batch]])
                  for s in range(0, need, j.batch)]
        state, steps = {k: np.array(v, copy=True) for k, v in prog.state.items()}, prog.steps
        values = {k: t.values for k, t in prog.trained_tensors().items()}
        acc = evaluate(setup, values)
        prog.load_state(state, steps=steps)  # evaluate reset the state: training goes on from here
        res.rounds.append(RoundRecord(rnd, acc, float(np.mean(losses)), seconds=time.perf_counter() - t0))
        if log:
            log(res.rounds[-1])
    res.values = values
    return res


def final_state_dict(res: FederatedResult) -> dict:
    """The model's state_dict (torch tensors, as Program.state_dict gives it: an int8 program's in
    real values) with the run's final global trained tensors, checked to load into the model."""
    setup = setup_of(res.job)
    reset_with(setup, res.values)
    sd = {k: v.contiguous() for k, v in setup.prog.state_dict().items()}
    if setup.model is not None:
        try:
            setup.model.load_state_dict(sd)
        except RuntimeError as err:
            raise ValueError(f"the final weights do not load into {res.job.model}: "
                             f"{str(err).splitlines()[0]}") from err
    return sd


def write_results(res: FederatedResult, path) -> Path:
    """The per-round figures as JSON (.json) or CSV (anything else)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(res.as_dict(), indent=1) + "\n")
        return path
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(res.rounds[0])))
        w.writeheader()
        for r in res.rounds:
            w.writerow(asdict(r))
    return path
