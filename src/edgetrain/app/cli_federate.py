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
import logging
from dataclasses import dataclass, field
from typing import Optional

from .options import (MAX_BATCH, MAX_CLASSES, MAX_CLIENTS, MAX_EPOCHS, MAX_IMAGES, MAX_MOMENTUM, MAX_SEED, MAX_STEPS,
                      MAX_WORKERS, at_most, bounded_float, count, floats, positive_float, positive_floats, seed)

log = logging.getLogger(__name__)
#: what -o DIR holds after a run
RESULTS_FILE, WEIGHTS_FILE = "results.json", "weights.safetensors"
#: the batch of a zoo model's program when --input is not given
DEFAULT_BATCH = 8

DESCRIPTION = ("Simulate --clients devices fine-tuning MODEL together with Flower's simulation engine: each "
               "round every client trains the program on its own shard of --data (split --partition iid or "
               "dirichlet:ALPHA) from the global model, and the server averages only the tensors the update "
               "scheme trains (weighted by samples; int8 weights averaged in real values and re-quantized to "
               "the program's fixed scales, rounding half to even). Prints per round the global model's test "
               "accuracy and the bytes each client sent beside the bytes of sending the whole model.")
MODEL_HELP = ("mbv2-w0.35 | mcunet-5fps | proxyless-w0.3 (the paper's ImageNet-pretrained int8 models, from the "
              "shared assets: --assets), digitnet (MNIST-pretrained), another zoo model name (random weights), or "
              "path/to/model.py:FACTORY (a function or class in the file that returns a torch.nn.Module taking "
              "images, called with the --model-arg values; needs --input): the same MODEL as compile and train")
#: the old spellings of options, kept for a while: each use prints a one-line deprecation warning
DEPRECATED = {"--scheme": "use --update (it takes the same values)",
              "--batch": "use --input NxCxHxW (batch first, e.g. --input 8x1x28x28)",
              "--out": "use -o DIR (it writes results.json and the final weights there)"}


class Deprecated(argparse.Action):
    """Stores the value as its new option does and notes the old spelling (run_federate warns)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        old = list(getattr(namespace, "deprecated", None) or [])
        namespace.deprecated = old + [option_string]


def add_federate(sub) -> None:
    """Register the `federate` command on the CLI's subparsers."""
    import textwrap

    from .cli_config import BACKEND_HELP
    from .cli_program import DATA_HELP
    from .exit_codes import exit_codes

    examples = ("edgetrain federate mbv2-w0.35 --clients 10 --rounds 20 --data cifar10 --partition dirichlet:0.5 "
                "--train-images 2000 -o fl/",
                "edgetrain federate digitnet --clients 3 --rounds 2 --data mnist --train-images 300 --local-steps 5 "
                "--update bias -o fl/",
                "edgetrain federate nets/mine.py:build --input 8x3x64x64 --data photos/ --clients 4 --rounds 5 "
                "-o fl/")
    p = sub.add_parser("federate", help="simulate devices fine-tuning a model together (Flower, FedAvg over the "
                       "trained tensors)", description=textwrap.fill(DESCRIPTION, 88),
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + exit_codes("federate"))
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--input", metavar="NxCxHxW",
                   help="the program's input: batch, channels, height, width, e.g. 8x3x128x128 (images are resized "
                        f"to it); default a zoo model's own image at batch {DEFAULT_BATCH}; a model file needs it")
    p.add_argument("--model-arg", action="append", metavar="NAME=VALUE",
                   help="for a model file: a keyword argument of its factory (value read as a Python literal), "
                        "repeatable")
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
    p.add_argument("--batch", type=count(MAX_BATCH), action=Deprecated, help=argparse.SUPPRESS)
    p.add_argument("--lr", type=positive_float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--momentum", type=bounded_float(MAX_MOMENTUM, zero=True), default=0.0,
                   help=f"SGD momentum, reset each round (default 0, {at_most(MAX_MOMENTUM)})")
    p.add_argument("--update", dest="scheme", metavar="SCHEME",
                   help="what the clients train and send: full, bias, last:K (the last K conv/linear layers), "
                        "paper[:LABEL] (the paper's scheme, default 49kb), or JSON {\"bias_last\": N, \"weights\": "
                        "{\"LAYER\": RATIO}}; default paper for the paper's models, else last:2")
    p.add_argument("--scheme", dest="scheme", action=Deprecated, help=argparse.SUPPRESS)
    p.add_argument("--quantize", choices=("int8", "none"), default="int8", help="int8 with QAS (default) or float32")
    p.add_argument("--no-qas", action="store_true", help="int8: turn Quantization-Aware Scaling off")
    p.add_argument("--backend", choices=("c", "reference"), help=BACKEND_HELP)
    p.add_argument("--classes", type=count(MAX_CLASSES),
                   help="output classes (default 10; for a model file, passed to its factory as num_classes= when "
                        f"given; {at_most(MAX_CLASSES)})")
    p.add_argument("--mean", type=floats, metavar="M[,M,M]", help="per-channel mean of pixels in [0, 1] "
                   "(default the model's: 0 for the paper's models and model files, MNIST's for digitnet)")
    p.add_argument("--std", type=positive_floats, metavar="S[,S,S]", help="per-channel divisor after the mean "
                   "(default the model's: 1/255 for the paper's models, whose input is pixels 0..255; 1 for a model "
                   "file)")
    p.add_argument("--seed", type=seed, default=0,
                   help=f"split, data order, initial weights and rounding seed (default 0, {at_most(MAX_SEED)})")
    p.add_argument("--workers", type=count(MAX_WORKERS), default=2,
                   help="CPUs of the local Ray that runs the clients, one client per CPU at a time, one process each "
                        f"(default 2; {at_most(MAX_WORKERS)} and at most this machine's CPUs)")
    p.add_argument("--serial", action="store_true",
                   help="run the same rounds in this process without Flower (the same result, bit for bit)")
    p.add_argument("--assets", metavar="DIR", help="the shared assets folder (default $EDGETRAIN_ASSETS, else "
                   "shared/assets beside a source checkout)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help=f"write {RESULTS_FILE} (the job and every round's figures) and {WEIGHTS_FILE} (the final "
                        "global model's state_dict, as `edgetrain export` writes it) into DIR (created); default: "
                        "print the figures only")
    p.add_argument("--out", metavar="FILE", action=Deprecated, help=argparse.SUPPRESS)
    p.set_defaults(func=run_federate)


@dataclass(frozen=True)
class FileModel:
    """path/to/model.py:FACTORY as a FederatedJob's model_factory: a picklable value that compares
    equal to its copies (each Ray worker builds the model from it). The file's text is read once,
    here, where the user named it (as `train` runs a model file named on its command line): every
    process runs that text, never the file as it may be later."""

    spec: str
    text: str = field(repr=False)
    kwargs: tuple = field(default=(), hash=False)  # (name, value) pairs of the factory's arguments
    classes: Optional[int] = None
    seed: int = 0

    @property
    def sha256(self) -> str:
        from .usermodel import source_digest

        return source_digest(self.text)

    def __call__(self):
        from pathlib import Path

        from .usermodel import ModelSource, load_model, parse_model_spec

        spec = parse_model_spec(self.spec)
        return load_model(spec, dict(self.kwargs), self.classes, seed=self.seed,
                          source=ModelSource(Path(spec.path), self.text))


def default_backend() -> str:
    """"c" when a host C compiler is found, else "reference": every command's rule
    (backends/c/toolchain.default_backend)."""
    from ..backends.c.toolchain import default_backend as rule

    return rule()


def model_of(args) -> tuple:
    """(model name, model factory or None, batch, (C, H, W) or None) of MODEL, --input,
    --model-arg, --classes and the deprecated --batch."""
    from ..federated.job import DIGITNET, PAPER_MODELS
    from .usermodel import parse_input, parse_model_args, parse_model_spec, read_model_source

    spec = None if args.model in (DIGITNET, *PAPER_MODELS) else parse_model_spec(args.model)
    shape = None
    batch = args.batch or DEFAULT_BATCH
    if args.input is not None:
        if args.batch is not None:
            raise ValueError("--batch and --input both give the batch: give --input NxCxHxW only")
        dims = parse_input(args.input)
        if dims.dtype != "float32" or len(dims.shape) != 4:
            raise ValueError(f"--input {args.input}: federate trains image classifiers: give batch, channels, height "
                             f"and width, e.g. 8x3x64x64")
        batch, shape = dims.shape[0], dims.shape[1:]
        if batch > MAX_BATCH:
            raise ValueError(f"--input {args.input}: a batch of {batch:,} is more than {MAX_BATCH:,}")
    if spec is None or not spec.is_file:
        if args.model_arg:
            raise ValueError("--model-arg applies to a model file (path/to/model.py:FACTORY)")
        return args.model, None, batch, shape
    if shape is None:
        raise ValueError(f"{spec}: give the model's input shape, e.g. --input 8x3x64x64 (batch first)")
    source = read_model_source(spec.path)
    factory = FileModel(str(spec), source.text, tuple(sorted(parse_model_args(args.model_arg).items())),
                        args.classes, args.seed)
    return str(spec), factory, batch, shape


def job_of(args):
    from ..federated import FederatedJob

    model, factory, batch, shape = model_of(args)
    return FederatedJob(model=model, data=args.data, test_data=args.test_data, clients=args.clients,
                        rounds=args.rounds, partition=args.partition, train_images=args.train_images,
                        test_images=args.test_images, local_steps=args.local_steps, epochs=args.epochs,
                        batch=batch, lr=args.lr, momentum=args.momentum, scheme=args.scheme,
                        quantize=None if args.quantize == "none" else "int8", qas=not args.no_qas,
                        backend=args.backend or default_backend(), seed=args.seed, classes=args.classes or 10,
                        assets=args.assets, mean=args.mean, std=args.std, input_shape=shape, model_factory=factory)


def _row(r) -> str:
    if r.round == 0:
        return f"round  0: accuracy {r.accuracy:6.1%} (before federated training)"
    return (f"round {r.round:2d}: accuracy {r.accuracy:6.1%}, loss {r.loss:.4f}, each client sent "
            f"{r.client_bytes:,} B of {r.model_bytes:,} B ({r.client_bytes / r.model_bytes:.1%} of the model), "
            f"{r.seconds:.1f} s")


def run_federate(args) -> int:
    for old in dict.fromkeys(getattr(args, "deprecated", None) or ()):
        log.warning(f"{old} is deprecated: {DEPRECATED[old]}")
    if args.output:
        from .outlock import output_lock

        with output_lock(args.output, "edgetrain federate"):  # one run per -o folder at a time
            return _run_federate(args)
    return _run_federate(args)


def _run_federate(args) -> int:
    from ..federated import FlowerMissing, require_flower, run_flower, run_serial, write_results
    from ..federated.flower import check_workers

    try:
        job = job_of(args)
        if not args.serial:
            check_workers(args.workers)  # before anything is compiled (a ValueError: exit 2)
            require_flower()
    except FlowerMissing as err:
        raise ValueError(str(err)) from None  # exit 2, one line
    log.info(f"{job.model}: {job.clients} clients, {job.rounds} rounds, {job.partition} split of {job.data}, "
             f"batch {job.batch}, {job.quantize or 'float32'} on the {job.backend} backend"
             + ("" if args.serial else f", Flower on {args.workers} Ray CPUs"))

    def show(r) -> None:  # the figures a user runs the command for: standard output, at once
        print(_row(r), flush=True)

    if args.serial:
        res = run_serial(job, log=show)
    else:
        res = run_flower(job, workers=args.workers, log=show, quiet=not log.isEnabledFor(logging.DEBUG))
    log.info(f"shards: {res.shard_sizes}")
    if args.out:
        log.info(f"per-round figures written to {write_results(res, args.out)}")
    if args.output:
        for path in write_output(res, args.output):
            log.info(f"wrote {path}")
    return 0


def write_output(res, folder) -> list:
    """results.json and weights.safetensors of `res` in `folder` (created), each written atomically."""
    import json
    from pathlib import Path

    from safetensors.torch import save

    from ..federated import final_state_dict
    from .checkpoint import atomic_write

    sd = final_state_dict(res)
    meta = {"format": "pt", "edgetrain_model": res.job.model, "edgetrain_rounds": str(res.job.rounds)}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [atomic_write(folder / RESULTS_FILE, (json.dumps(res.as_dict(), indent=1) + "\n").encode()),
            atomic_write(folder / WEIGHTS_FILE, save(sd, metadata=meta))]
