"""Federated fine-tuning with Flower against centralized fine-tuning on the union of the shards.

    PYTHONPATH=src python bench/federated.py [--model mbv2-w0.35] [--data cifar10] [--clients 10]
        [--rounds 20] [--partition dirichlet:0.5] [--train-images 1000] [--test-images 300]
        [--epochs 1 | --local-steps S] [--batch 8] [--lr 0.001] [--momentum 0.9] [--scheme paper] [--backend c]
        [--workers 2] [--seed 0] [--out docs/results/federated.json]

The federated run (edgetrain.federated.run_flower: Flower's simulation engine on a local Ray of
--workers CPUs) and the centralized baseline (run_centralized: one program trained on the union
of the shards, as many steps per round as all clients take together: the same sample-steps)
start from the same compiled program (the paper's int8 mbv2-w0.35 with its 49 KB sparse scheme
by default, a new classifier) and are measured on the same test images after every round. Per
round: both accuracies, the bytes each client sent (the trained tensors only, at their storage
dtype) beside the bytes of full-model FedAvg, and the seconds taken. Without the shared assets,
use --model digitnet --data mnist (the issue's fallback).

Prints one JSON line (the figures, with the ratio of bytes), then a markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from edgetrain.federated import FederatedJob, run_centralized, run_flower, run_serial  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mbv2-w0.35")
    ap.add_argument("--data", default="cifar10")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--partition", default="dirichlet:0.5")
    ap.add_argument("--train-images", type=int, default=1000)
    ap.add_argument("--test-images", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--local-steps", type=int)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--scheme")
    ap.add_argument("--backend", default="c", choices=("c", "reference"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serial", action="store_true", help="the federated run without Flower (same figures)")
    ap.add_argument("--skip-centralized", action="store_true")
    ap.add_argument("--out", help="write the JSON figures here too")
    args = ap.parse_args(argv)
    job = FederatedJob(model=args.model, data=args.data, clients=args.clients, rounds=args.rounds,
                       partition=args.partition, train_images=args.train_images, test_images=args.test_images,
                       local_steps=args.local_steps, epochs=args.epochs, batch=args.batch, lr=args.lr, momentum=args.momentum,
                       scheme=args.scheme, backend=args.backend, seed=args.seed)
    say = lambda what: (lambda r: print(f"{what} round {r.round}: acc {r.accuracy:.3f} loss {r.loss} "  # noqa: E731
                                        f"{r.seconds:.1f} s", file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    fed = run_serial(job, log=say("fed")) if args.serial else run_flower(job, workers=args.workers, log=say("fed"))
    fed_s = time.perf_counter() - t0
    cen, cen_s = None, 0.0
    if not args.skip_centralized:
        t0 = time.perf_counter()
        cen = run_centralized(job, log=say("central"))
        cen_s = time.perf_counter() - t0
    last = fed.rounds[-1]
    row = {"bench": "federated", "job": fed.as_dict()["job"], "shard_sizes": fed.shard_sizes,
           "engine": "serial" if args.serial else f"flower on a local Ray of {args.workers} CPUs",
           "federated_accuracy": [r.accuracy for r in fed.rounds],
           "centralized_accuracy": [r.accuracy for r in cen.rounds] if cen else None,
           "federated_loss": [r.loss for r in fed.rounds[1:]],
           "client_bytes_per_round": last.client_bytes, "model_bytes_per_round": last.model_bytes,
           "bytes_ratio": last.client_bytes / last.model_bytes,
           "fleet_bytes_per_round": last.client_bytes * job.clients,
           "federated_seconds": fed_s, "centralized_seconds": cen_s}
    print(json.dumps(row))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(row, indent=1) + "\n")
    print("\n| round | federated top-1 | centralized top-1 | sent per client | full model |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(fed.rounds):
        c = f"{cen.rounds[i].accuracy:.1%}" if cen else "-"
        sent = f"{r.client_bytes:,} B" if r.round else "-"
        full = f"{r.model_bytes:,} B" if r.round else "-"
        print(f"| {r.round} | {r.accuracy:.1%} | {c} | {sent} | {full} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
