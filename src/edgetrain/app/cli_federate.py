"""`edgetrain federate`: N simulated devices fine-tune one program together (Flower, FedAvg).

Each round every client trains the program (int8 with QAS and a sparse scheme by default) on
its own shard of --data from the global trained tensors; the server averages only those
tensors (weighted by samples, int8 in real values re-quantized to the program's scales: see
edgetrain.federated.average) and measures the global model on the test set. Printed per round:
test accuracy, the clients' mean loss, and the bytes each client sent against the whole model's.
Flower is optional: without it the command exits 2 saying how to install it (or runs the
same rounds in one process with --serial)."""
from __future__ import annotations

import argparse
import sys

from .options import (MAX_BATCH, MAX_CLASSES, MAX_CLIENTS, MAX_EPOCHS, MAX_IMAGES, MAX_MOMENTUM, MAX_SEED, MAX_STEPS,
                      MAX_WORKERS, at_most, bounded_float, count, floats, positive_float, positive_floats, seed)

DESCRIPTION = ("Simulate --clients devices fine-tuning MODEL together with Flower's simulation engine: each "
               "round every client trains the program on its own shard of --data (split --partition iid or "
               "dirichlet:ALPHA) from the global model, and the server averages only the tensors the update "
               "scheme trains (weighted by samples; int8 weights averaged in real values and re-quantized to "
               "the program's fixed scales, rounding half to even). Prints per round the global model's test "
               "accuracy and the bytes each client sent beside the bytes of sending the whole model.")
MODEL_HELP = ("mbv2-w0.35 | mcunet-5fps | proxyless-w0.3 (the paper's ImageNet-pretrained int8 models, from the "
              "shared assets: --assets), digitnet (MNIST-pretrained), or another zoo model name (random weights)")


def add_federate(sub) -> None:
    """Register the `federate` command on the CLI's subparsers."""
    import textwrap

    from .cli_program import DATA_HELP, exit_codes

    examples = ("edgetrain federate mbv2-w0.35 --clients 10 --rounds 20 --data cifar10 --partition dirichlet:0.5 "
                "--train-images 2000 --out fl.json",
                "edgetrain federate digitnet --clients 3 --rounds 2 --data mnist --train-images 300 --local-steps 5 "
                "--out fl.csv")
    p = sub.add_parser("federate", help="simulate devices fine-tuning a model together (Flower, FedAvg over the "
                       "trained tensors)", description=textwrap.fill(DESCRIPTION, 88),
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + exit_codes("federate"))
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--clients", type=count(MAX_CLIENTS), default=10,
                   help=f"simulated devices (default 10, {at_most(MAX_CLIENTS)})")
    p.add_argument("--rounds", type=count(MAX_EPOCHS), default=20,
                   help=f"federated rounds (default 20, {at_most(MAX_EPOCHS)})")
    p.add_argument("--data", required=True, help="training images, split among the clients: " + DATA_HELP)
    p.add_argument("--test-data", metavar="DATA", help="test images (default: --data's test split)")
    p.add_argument("--partition", default="iid", metavar="iid|dirichlet:ALPHA",
                   help="how the training images are split: iid, or per class by Dirichlet(ALPHA) shares (label "
                        "skew; small ALPHA: few classes per client) (default iid)")
    p.add_argument("--train-images", type=count(MAX_IMAGES), metavar="N",
                   help=f"use N training images (default all, {at_most(MAX_IMAGES)})")
    p.add_argument("--test-images", type=count(MAX_IMAGES), metavar="N",
                   help=f"use N test images (default all, {at_most(MAX_IMAGES)})")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--local-steps", type=count(MAX_STEPS), metavar="S",
                       help=f"steps per client and round ({at_most(MAX_STEPS)})")
    steps.add_argument("--epochs", type=count(MAX_EPOCHS), default=1,
                       help=f"passes over its shard per client and round (default 1, {at_most(MAX_EPOCHS)})")
    p.add_argument("--batch", type=count(MAX_BATCH), default=8,
                   help=f"batch size of the program (default 8, {at_most(MAX_BATCH)})")
    p.add_argument("--lr", type=positive_float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--momentum", type=bounded_float(MAX_MOMENTUM, zero=True), default=0.0,
                   help=f"SGD momentum, reset each round (default 0, {at_most(MAX_MOMENTUM)})")
    p.add_argument("--scheme", metavar="SCHEME",
                   help="what the clients train and send: paper[:LABEL] (the paper's scheme, default 49kb), full, "
                        "bias, last:K, or JSON {\"bias_last\": N, \"weights\": {\"LAYER\": RATIO}}; default paper "
                        "for the paper's models, else last:2")
    p.add_argument("--quantize", choices=("int8", "none"), default="int8", help="int8 with QAS (default) or float32")
    p.add_argument("--no-qas", action="store_true", help="int8: turn Quantization-Aware Scaling off")
    p.add_argument("--backend", choices=("c", "reference"),
                   help="run the program as generated C (default when a C compiler is found) or the numpy reference")
    p.add_argument("--classes", type=count(MAX_CLASSES), default=10,
                   help=f"output classes (default 10, {at_most(MAX_CLASSES)})")
    p.add_argument("--mean", type=floats, metavar="M[,M,M]", help="per-channel mean of pixels in [0, 1] "
                   "(default the model's: 0 for the paper's models, MNIST's for digitnet)")
    p.add_argument("--std", type=positive_floats, metavar="S[,S,S]", help="per-channel divisor after the mean "
                   "(default the model's: 1/255 for the paper's models, whose input is pixels 0..255)")
    p.add_argument("--seed", type=seed, default=0,
                   help=f"split, data order and rounding seed (default 0, {at_most(MAX_SEED)})")
    p.add_argument("--workers", type=count(MAX_WORKERS), default=2,
                   help="CPUs of the local Ray that runs the clients, one client per CPU at a time, one process each "
                        f"(default 2; {at_most(MAX_WORKERS)} and at most this machine's CPUs)")
    p.add_argument("--serial", action="store_true",
                   help="run the same rounds in this process without Flower (the same result, bit for bit)")
    p.add_argument("--assets", metavar="DIR", help="the shared assets folder (default $EDGETRAIN_ASSETS, else "
                   "shared/assets beside a source checkout)")
    p.add_argument("--out", metavar="FILE", help="write the per-round figures: FILE.json, else CSV")
    p.set_defaults(func=run_federate)


def default_backend() -> str:
    """"c" when a C compiler is on PATH, else "reference"."""
    from ..backends.c import CBackendError
    from ..backends.c.host import find_cc

    try:
        find_cc()
    except CBackendError:
        return "reference"
    return "c"


def job_of(args):
    from ..federated import FederatedJob

    return FederatedJob(model=args.model, data=args.data, test_data=args.test_data, clients=args.clients,
                        rounds=args.rounds, partition=args.partition, train_images=args.train_images,
                        test_images=args.test_images, local_steps=args.local_steps, epochs=args.epochs,
                        batch=args.batch, lr=args.lr, momentum=args.momentum, scheme=args.scheme,
                        quantize=None if args.quantize == "none" else "int8", qas=not args.no_qas,
                        backend=args.backend or default_backend(), seed=args.seed, classes=args.classes,
                        assets=args.assets, mean=args.mean, std=args.std)


def _row(r) -> str:
    if r.round == 0:
        return f"round  0: accuracy {r.accuracy:6.1%} (before federated training)"
    return (f"round {r.round:2d}: accuracy {r.accuracy:6.1%}, loss {r.loss:.4f}, each client sent "
            f"{r.client_bytes:,} B of {r.model_bytes:,} B ({r.client_bytes / r.model_bytes:.1%} of the model), "
            f"{r.seconds:.1f} s")


def run_federate(args) -> int:
    from ..federated import FlowerMissing, require_flower, run_flower, run_serial, write_results
    from ..federated.flower import check_workers

    try:
        job = job_of(args)
        if not args.serial:
            check_workers(args.workers)  # before anything is compiled (a ValueError: exit 2)
            require_flower()
    except FlowerMissing as err:
        print(f"edgetrain federate: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.model}: {job.clients} clients, {job.rounds} rounds, {job.partition} split of {job.data}, "
          f"{job.quantize or 'float32'} on the {job.backend} backend" + ("" if args.serial else
                                                                          f", Flower on {args.workers} Ray CPUs"))
    log = lambda r: print(_row(r), flush=True)  # noqa: E731
    res = run_serial(job, log=log) if args.serial else run_flower(job, workers=args.workers, log=log)
    print(f"shards: {res.shard_sizes}")
    if args.out:
        print(f"per-round figures written to {write_results(res, args.out)}")
    return 0
