"""The federated run on Flower's simulation engine (flwr 1.42: ClientApp, ServerApp, a FedAvg strategy).

Flower simulates the devices: each ClientApp call runs one client's round (rounds.client_update)
in a Ray worker of a local Ray started for the run (`address="local"`: never a cluster already
running on this machine; `workers` CPUs, one per client at a time). The ServerApp runs
`SparseFedAvg`, Flower's FedAvg strategy with its aggregation replaced by ours: only the trained
tensors travel and are averaged, in real values, re-quantized to the program's int8 scales
(average.py). Replies are sorted by client id before averaging, so the result does not depend
on which worker answered first: it equals `rounds.run_serial`'s, bit for bit. Only the job (a
small frozen value) goes with each message; a worker builds the program once (job.setup_of).

No network layer of ours: Flower's in-memory grid carries the messages.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Callable, Optional

import numpy as np

from ..config import usable_cpus
from .job import FederatedJob, setup_of
from .rounds import (ClientUpdate, FederatedResult, RoundRecord, aggregate, client_update, evaluate,
                     initial_values)
from .average import model_bytes, update_bytes

#: how to get Flower when it is missing
INSTALL_HINT = 'pip install -e ".[scale]"  (Flower\'s simulation engine: flwr[simulation], with Ray)'
#: metric keys of a client's reply
SAMPLES, CLIENT, LOSS, STEPS = "num-examples", "client", "loss", "steps"
#: seconds the server waits for a round's replies
ROUND_TIMEOUT = 24 * 3600


class FlowerMissing(ImportError):
    """Flower (flwr with its simulation engine) is not installed."""


def require_flower() -> None:
    """FlowerMissing unless flwr and its simulation engine import (with telemetry off: a
    simulation sends nothing over the network)."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    try:
        from flwr import app, clientapp, serverapp, simulation  # noqa: F401
        from flwr.serverapp import strategy  # noqa: F401
        import ray  # noqa: F401  (the simulation engine's backend)
    except ImportError as err:
        raise FlowerMissing(f"federated simulation needs Flower's simulation engine ({err}); install it with "
                            f"{INSTALL_HINT}") from None


def make_client_app(job: FederatedJob):
    """The ClientApp: a train message carries the global trained tensors and the round; the
    reply carries the client's trained tensors and its sample count. It closes over `job` only."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg, context):
        client = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        values = {name: a.numpy() for name, a in msg.content["arrays"].items()}
        up = client_update(setup_of(job), client, rnd, values)
        arrays = ArrayRecord({name: Array(np.ascontiguousarray(v)) for name, v in up.values.items()})
        metrics = MetricRecord({SAMPLES: up.samples, CLIENT: up.client, LOSS: up.loss, STEPS: up.steps})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


def sparse_fedavg(job: FederatedJob, setup, on_round: Callable[[list], None]):
    """Flower's FedAvg with our aggregation (module docstring); `on_round(updates)` sees each
    round's client updates."""
    from flwr.app import Array, ArrayRecord, MetricRecord
    from flwr.serverapp.strategy import FedAvg

    class SparseFedAvg(FedAvg):
        """FedAvg over the trained tensors only, int8-aware (federated/average.py); every
        client must answer (a failed client fails the run, with its error)."""

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            failed = [m for m in replies if m.has_error()]
            if failed or len(replies) != job.clients:
                why = "; ".join(f"node {m.metadata.src_node_id}: {m.error.reason}" for m in failed)
                raise RuntimeError(f"round {server_round}: {len(replies) - len(failed)} of {job.clients} clients "
                                   f"answered" + (f" ({why})" if why else ""))
            updates = []
            for m in replies:
                met = m.content["metrics"]
                values = {name: a.numpy() for name, a in m.content["arrays"].items()}
                updates.append(ClientUpdate(int(met[CLIENT]), int(met[SAMPLES]), values, float(met[LOSS]),
                                            int(met[STEPS])))
            on_round(updates)
            values = aggregate(setup, updates)
            n = sum(u.samples for u in updates)
            loss = sum(u.loss * u.samples for u in updates) / n
            return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in values.items()}), \
                MetricRecord({LOSS: loss})

    return SparseFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=job.clients,
                        min_available_nodes=job.clients)


#: Ray CPUs allowed on a machine with fewer CPUs than this (two workers on one CPU only take turns)
MIN_WORKER_LIMIT = 2


def check_workers(workers: int) -> int:
    """`workers`, checked against this machine: Flower starts one Ray actor (a process) per CPU it
    is given, so more than the machine has only starts processes that wait (100000 hung); at most
    its CPUs (or MIN_WORKER_LIMIT)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    cpus = usable_cpus()
    limit = max(cpus, MIN_WORKER_LIMIT)
    if workers > limit:
        raise ValueError(f"{workers} workers: this machine has {cpus} CPUs and Ray starts a process for each "
                         f"worker; use at most {limit}")
    return workers


def run_flower(job: FederatedJob, workers: int = 2, log: Optional[Callable[[RoundRecord], None]] = None,
               quiet: bool = True) -> FederatedResult:
    """The federated run simulated by Flower on a local Ray with `workers` CPUs (one client per
    CPU at a time, at most this machine's CPUs: check_workers); FlowerMissing when Flower is not
    installed."""
    check_workers(workers)
    require_flower()
    import ray
    from flwr.app import ArrayRecord, Array, MetricRecord
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    setup = setup_of(job)
    values0 = initial_values(setup)
    res = FederatedResult(job, shard_sizes=[len(s) for s in setup.shards])
    seen: dict = {}
    clock = [time.perf_counter()]

    def on_round(updates):
        seen["updates"] = sorted(updates, key=lambda u: u.client)  # sums in a fixed order

    def evaluate_fn(rnd: int, arrays):
        values = {k: a.numpy() for k, a in arrays.items()}
        acc = evaluate(setup, values)
        if rnd == 0:
            rec = RoundRecord(0, acc)
        else:
            ups = seen.pop("updates")
            n = sum(u.samples for u in ups)
            rec = RoundRecord(rnd, acc, sum(u.loss * u.samples for u in ups) / n,
                              update_bytes(setup.prog.trained_tensors()), model_bytes(setup.prog),
                              time.perf_counter() - clock[0])
            res.values = values
        res.rounds.append(rec)
        if log:
            log(rec)
        clock[0] = time.perf_counter()
        return MetricRecord({"accuracy": acc})

    server = ServerApp()

    @server.main()
    def main(grid, context):
        strategy = sparse_fedavg(job, setup, on_round)
        strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(np.ascontiguousarray(v))
                                                              for k, v in values0.items()}),
                       num_rounds=job.rounds, timeout=ROUND_TIMEOUT, evaluate_fn=evaluate_fn)

    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"address": "local", "num_cpus": workers, "num_gpus": 0, "include_dashboard": False,
                             "logging_level": logging.WARNING, "log_to_driver": not quiet}}
    started_ray = not ray.is_initialized()
    flwr_log = logging.getLogger("flwr")
    old_level = flwr_log.level
    if quiet:  # Flower's INFO lines per round, its warning that run_simulation is deprecated, Ray's tips
        flwr_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            if quiet:
                warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
            run_simulation(server_app=server, client_app=make_client_app(job), num_supernodes=job.clients,
                           backend_config=backend)
    finally:
        flwr_log.setLevel(old_level)
        if started_ray and ray.is_initialized():
            ray.shutdown()
    if len(res.rounds) != job.rounds + 1:
        raise RuntimeError(f"the Flower simulation ended after {len(res.rounds) - 1} of {job.rounds} rounds "
                           f"(see its log above)")
    return res
