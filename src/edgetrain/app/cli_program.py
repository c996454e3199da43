"""`edgetrain compile | train | export`: a user's own model from the command line to a
firmware project (cli_compile.py), a fine-tuned checkpoint, and weights PyTorch loads back."""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Callable, Optional

from .cli_config import BACKEND_HELP, COMPILED_FILE, THREADS_HELP, config_from_options, normalization, say
from .options import (MAX_CLASSES, MAX_EPOCHS, MAX_HEADROOM, MAX_IMAGES, MAX_MOMENTUM, MAX_SAMPLES, MAX_SEED,
                      MAX_THREADS, MAX_WEIGHT_DECAY, at_most, bounded_float, byte_size, count, floats, headroom,
                      label_value, positive_float, positive_floats, seed, update_scheme_text)
from .exit_codes import exit_codes
from ..devices.targets import TARGETS as TARGET_REGISTRY

#: passes/loss.py's LOSSES, spelled out so that --help imports no numpy (tests/core/test_losses_families.py
#: checks that they agree)
LOSS_CHOICES = ("cross_entropy", "sequence_cross_entropy", "causal_lm", "mse", "l1", "bce_with_logits")

#: firmware steps embedded by `compile` when no --samples is given
DEFAULT_SAMPLES = 4
#: the emit targets (devices/targets.py), then the host project cross-built for another Linux
#: architecture and run under QEMU user mode (backends/c/cross.py CROSS_TARGETS, spelled out so that
#: --help imports no numpy; tests/backends/c/test_aarch64.py checks that they agree)
CROSS_TARGET_NAMES = ("aarch64-linux",)
TARGETS = tuple(TARGET_REGISTRY) + CROSS_TARGET_NAMES
# --- parsers -------------------------------------------------------------------------------------
#: what --data, --val and --calibrate accept (edgetrain.data.folder.load_images)
DATA_HELP = ("an ImageFolder path (DIR/<class>/<image>), or a data set as NAME:PATH in its published form: "
             "cifar10:PATH (cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/, or the "
             "cifar-10-batches-py folder it extracts to), mnist:DIR or fashion-mnist:DIR (a folder of the four idx "
             ".gz files); a bare mnist | fashion-mnist reads the installed package, a bare cifar10 the shared assets "
             "folder ($EDGETRAIN_ASSETS); ts:PATH a UCR/UEA time series set (a NAME_TRAIN.ts file, its folder, or a "
             "set's name in the sktime package; the _TEST.ts validates) for a model taking (batch, dims, length)")
MODEL_HELP = ("path/to/model.py:FACTORY (a function or class in the file that returns a torch.nn.Module, called "
              "with the --model-arg values) or a zoo model name (mbv2-w0.35, mcunet-5fps, proxyless-w0.3, resnet18, "
              "resnet18-cifar, bert-tiny, ds-cnn, ad-autoencoder)")


def add_program_options(p: argparse.ArgumentParser, for_train: bool = False) -> None:
    """The options that say which program to compile (compile and train share them). For train
    they default to None, so that a checkpoint's settings can be told apart from given ones."""
    d = (lambda v: None) if for_train else (lambda v: v)
    g = p.add_argument_group("program (what to compile)")
    g.add_argument("--input", action="append", metavar="SHAPE[:DTYPE]",
                   help="an input's shape, batch first, e.g. 1x3x128x128 (float32), or 1x128:int64 for token ids "
                        "(1x128:int64:30522 draws example ids below 30522); repeat for several inputs; a zoo model's "
                        "default is its own input at batch 1")
    g.add_argument("--model-arg", action="append", metavar="NAME=VALUE",
                   help="keyword argument of the factory (value read as a Python literal), repeatable")
    g.add_argument("--classes", type=count(MAX_CLASSES),
                   help="output classes: a zoo model's num_classes (default 10); for a model file, passed to the "
                        f"factory as num_classes= ({at_most(MAX_CLASSES)})")
    g.add_argument("--loss", choices=LOSS_CHOICES, default=d("cross_entropy"),
                   help="training loss: cross_entropy (classes in dim 1, any rank: per-pixel too), "
                        "sequence_cross_entropy (classes in the last dim: a language model's (N, T, V)), "
                        "causal_lm (the same, each position predicting the next label), all "
                        "ignoring labels equal to --ignore-index; bce_with_logits (float targets: multi-label), mse "
                        "or l1 (targets shaped like the output) (default cross_entropy)")
    g.add_argument("--ignore-index", type=label_value, default=d(-100), metavar="LABEL",
                   help="the class losses' label that counts neither in the loss nor in its mean, as torch's "
                        "ignore_index (e.g. 255 for a segmentation's void class, a padding token's id) "
                        "(default -100, torch's)")
    g.add_argument("--update", dest="update_spec", type=update_scheme_text, default=d("full"), metavar="SCHEME",
                   help="what to train: full, bias (biases only), last:K (the last K conv/linear layers), or auto "
                        "(the sparse scheme of largest measured gain that fits --sram; needs --contributions) "
                        "(default full)")
    g.add_argument("--contributions", metavar="JSON",
                   help="with --update auto: the contribution table (edgetrain.sparse.analyze_contributions(...)"
                        ".save(path), or bench/contribution.py)")
    g.add_argument("--search", choices=("exact", "evolutionary"), default=d("exact"),
                   help="with --update auto: exact knapsack (default) or the paper's evolutionary search")
    g.add_argument("--quantize", choices=("none", "int8"), default=d("none"),
                   help="int8: the integer training program a microcontroller runs (QAS on unless --no-qas); "
                        "default none (float32)")
    g.add_argument("--calibrate", metavar="DATA",
                   help="int8: calibrate the scales on these images instead of the example input (train's "
                        "default: its training images): " + DATA_HELP)
    g.add_argument("--calibrate-images", type=count(MAX_IMAGES), default=d(32), metavar="N",
                   help=f"images of --calibrate used (default 32, {at_most(MAX_IMAGES)})")
    g.add_argument("--int8-headroom", type=headroom, default=d(1.0), metavar="H",
                   help="int8: room for the trained layers to grow: their int8 weight scales and output ranges H "
                        "times wider than the pretrained weights' and the calibrated ones (their precision H times "
                        f"coarser); frozen layers keep theirs (default 1, {at_most(MAX_HEADROOM)})")
    g.add_argument("--backward", choices=("float", "integer"), default=d("float"),
                   help="int8: integer computes every gradient, the loss and the SGD update in integers, no float "
                        "arithmetic in the step (a core without an FPU; the cross-entropy loss); default float "
                        "(float32 gradients)")
    g.add_argument("--lr", type=positive_float, default=d(0.01), help="SGD learning rate (default 0.01)")
    g.add_argument("--momentum", type=bounded_float(MAX_MOMENTUM, zero=True), default=d(0.0),
                   help=f"SGD momentum (default 0, {at_most(MAX_MOMENTUM)})")
    g.add_argument("--weight-decay", type=bounded_float(MAX_WEIGHT_DECAY, zero=True), default=d(0.0),
                   help=f"SGD weight decay (default 0, {at_most(MAX_WEIGHT_DECAY)})")
    g.add_argument("--no-qas", action="store_true", default=d(False),
                   help="int8: turn Quantization-Aware Scaling off")
    g.add_argument("--rounding-seed", type=seed, default=d(0), metavar="SEED",
                   help=f"int8: seed of the stochastic rounding of updates (default 0, {at_most(MAX_SEED)})")
    g.add_argument("--sram", "--ram", dest="sram", type=byte_size, metavar="BYTES",
                   help="RAM (SRAM) budget, e.g. 256KB: the program must fit (exit 3 with the smallest budget that "
                        "fits otherwise); also the firmware's RAM region")
    g.add_argument("--flash", type=byte_size, metavar="BYTES",
                   help="flash budget for read-only weights, e.g. 1MB; also the firmware's flash region (which holds "
                        "its code too)")
    g.add_argument("--backend", choices=("reference", "c"), help=BACKEND_HELP)
    g.add_argument("--mean", type=floats, metavar="M[,M,M]",
                   help="images: per-channel mean subtracted from pixels in [0, 1] (default 0)")
    g.add_argument("--std", type=positive_floats, metavar="S[,S,S]",
                   help="images: per-channel divisor after the mean (default 1); --std 0.00392156862745098 feeds "
                        "pixels 0..255")


def _run_compile(args) -> int:
    from .cli_compile import run_compile

    return run_compile(args)


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, 88)


def add_commands(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    c = sub.add_parser("compile", formatter_class=fmt,
                       help="compile a model into a training program: firmware project, memory report, checkpoint",
                       description=_wrap("Compile MODEL into an on-device training program and write into -o DIR: the C "
                       "project for --target (host library, or Cortex-M firmware training on --samples embedded "
                       "samples), memory.json and memory.png (the memory report) and program.ckpt (the program, "
                       "which `edgetrain train --resume DIR/program.ckpt` fine-tunes)."),
                       epilog="example:\n  edgetrain compile nets/mine.py:build --input 1x3x64x64 --sram 256KB "
                       "--flash 1MB --quantize int8 --target cortex-m4 --verify -o out/\n\n" + exit_codes("compile"))
    c.add_argument("model", help=MODEL_HELP)
    add_program_options(c)
    c.add_argument("--target", choices=TARGETS, default="cortex-m4",
                   help="host (C library + test driver); firmware: cortex-m4 | cortex-m7 (QEMU mps2), rv32imafc | "
                   "rv32imc (RISC-V, QEMU virt; rv32imc has no FPU: float code in soft-float); or aarch64-linux (the "
                   "host project cross-built with aarch64-linux-gnu-gcc; --verify runs it under qemu-aarch64) "
                   "(default cortex-m4)")
    c.add_argument("--weight-banks", type=int, choices=(1, 2), default=1,
                   help="Cortex-M firmware: 2 keeps the trained weights in two banks and commits a step by one "
                   "header write after its CRC-32, so a reset mid-step resumes from the last complete update "
                   "(costs a second copy of the trained state in SRAM, counted in the memory report's peak and "
                   "checked against --sram); "
                   "default 1 (updates in place)")
    c.add_argument("--samples", type=count(MAX_SAMPLES), default=DEFAULT_SAMPLES, metavar="N",
                   help=f"training samples embedded in the firmware, one step each (default {DEFAULT_SAMPLES}, "
                        f"{at_most(MAX_SAMPLES)}): from --calibrate's images when given, else random inputs and "
                        f"labels")
    c.add_argument("--verify", action="store_true",
                   help="build the project and run it (Cortex-M: under QEMU), print its losses and check them "
                        "against the reference runtime's (exit 5 on failure)")
    c.add_argument("--no-plot", action="store_true", help="do not draw memory.png")
    c.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder (created)")
    c.set_defaults(func=_run_compile)

    t = sub.add_parser("train", formatter_class=fmt, help="fine-tune a program on images, with a checkpoint per epoch",
                       description=_wrap("Fine-tune a training program on labelled images: an ImageFolder (DATA/<class>/"
                       "<image>, classes in sorted order, images resized to the model's input) or a data set in its "
                       "published form (cifar10:PATH of cifar-10-python.tar.gz, mnist, fashion-mnist). The program is MODEL compiled with the program options, or a "
                       "checkpoint: --resume continues a run exactly (the same data, order and settings: the final "
                       "weights equal an uninterrupted run's), --init starts a new run from a checkpoint's weights. "
                       "After each epoch DIR/epoch-NNNN.ckpt is written atomically; a non-finite loss or Ctrl-C "
                       "saves the last good state to DIR/stopped.ckpt."),
                       epilog="examples:\n  edgetrain train nets/mine.py:build --input 1x3x64x64 --data photos/ "
                       "--epochs 5 -o runs/a\n  edgetrain train --resume runs/a --model-file nets/mine.py --data photos/ "
                       "--epochs 8 -o runs/a\n"
                       "  edgetrain compile ... -o out/ && edgetrain train --resume out/program.ckpt --data mnist "
                       "-o runs/b\n  edgetrain train nets/mine.py:build --input 1x3x32x32 --data "
                       "cifar10:dl/cifar-10-python.tar.gz --val cifar10:dl/cifar-10-python.tar.gz -o runs/c\n\n"
                       + exit_codes("train"))
    t.add_argument("model", nargs="?", help=MODEL_HELP + " (not with --resume / --init)")
    t.add_argument("--data", required=True, help="training images (a data set's train split): " + DATA_HELP)
    t.add_argument("-o", "--output", required=True, metavar="DIR", help="where checkpoints go (created)")
    t.add_argument("--epochs", type=count(MAX_EPOCHS), default=1,
                   help=f"train until this many epochs are done (default 1, {at_most(MAX_EPOCHS)})")
    t.add_argument("--seed", type=seed, help="data order seed (default 0; a resumed run keeps its own; "
                   f"{at_most(MAX_SEED)})")
    t.add_argument("--limit", type=count(MAX_IMAGES), metavar="N",
                   help=f"use N training images ({at_most(MAX_IMAGES)})")
    t.add_argument("--skip-bad-images", action="store_true",
                   help="leave unreadable (corrupt, truncated) images out with a warning instead of stopping")
    t.add_argument("--val", metavar="DATA", help="images to measure accuracy on after each epoch, as --data (a "
                   "data set's test split)")
    t.add_argument("--val-limit", type=count(MAX_IMAGES), metavar="N",
                   help=f"use N validation images ({at_most(MAX_IMAGES)})")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--resume", metavar="CKPT|DIR", help="continue the run of this checkpoint (a folder: its "
                     "furthest complete checkpoint)")
    src.add_argument("--init", metavar="CKPT|DIR", help="start a new run from this checkpoint's program and weights")
    add_trust_options(t)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--threads", type=count(MAX_THREADS), metavar="N", help=f"{THREADS_HELP} ({at_most(MAX_THREADS)})")
    add_program_options(t, for_train=True)
    t.set_defaults(func=run_train)

    e = sub.add_parser("export", formatter_class=fmt, help="write a checkpoint's weights as a PyTorch state_dict "
                       "(safetensors)",
                       description=_wrap("Write the trained weights of a checkpoint as the original model's state_dict in "
                       "safetensors format (an int8 program's as real values, batch norm folded into its "
                       "convolution); checked to load into the model with load_state_dict before it is written."),
                       epilog="example:\n  edgetrain export runs/a --model-file nets/mine.py -o mine.safetensors\n"
                       "  python -c \"from safetensors.torch import load_file; model.load_state_dict(load_file('mine.safetensors'))\"\n\n"
                       + exit_codes("export"))
    e.add_argument("checkpoint", metavar="CKPT|DIR", help="a checkpoint, or a folder (its furthest complete one)")
    e.add_argument("-o", "--output", required=True, metavar="FILE", help="the .safetensors file to write")
    add_trust_options(e)
    e.set_defaults(func=run_export)


def add_trust_options(p: argparse.ArgumentParser) -> None:
    """--model-file / --trust-model-file: a checkpoint of a model file's program runs that file
    only when it is named for this run (modeltrust.py)."""
    g = p.add_argument_group("model file of a checkpoint (rebuilding its program runs the file's code)")
    g.add_argument("--model-file", metavar="FILE.py",
                   help="the model file the checkpoint was compiled from; runs only if its sha256 equals the "
                        "one the checkpoint records")
    g.add_argument("--trust-model-file", action="store_true",
                   help="run the model file without the sha256 check (--model-file, else the path the checkpoint "
                        "records): only for checkpoints you trust")




# --- train -------------------------------------------------------------------------------------------
_PROGRAM_OPTS = ("input", "model_arg", "classes", "loss", "update_spec", "contributions", "search", "quantize",
                 "calibrate", "int8_headroom", "backward", "lr", "momentum", "weight_decay", "no_qas", "rounding_seed",
                 "sram", "flash", "backend")


def train_hook() -> Optional[Callable[[str, object], None]]:
    """The hook `train` gives the training loop (TrainOptions.hook: called at each checkpoint save
    and before each step): none. Tests replace this function in a child process to pause it at a
    save or a step and kill it there (tests/cli/pause_launcher.py)."""
    return None


def run_train(args) -> int:
    from .outlock import output_lock

    with output_lock(args.output, "edgetrain train"):  # one run per -o folder at a time
        return _run_train(args)


def _run_train(args) -> int:
    from .checkpoint import build_program, load_checkpoint, remove_stale_temporaries
    from .cli_config import threads_option
    from ..data.folder import load_images
    from .train import TrainMeta, TrainOptions, calibration_batch, describe_skipped, fit, image_shape

    out = Path(args.output)
    remove_stale_temporaries(out)  # a dead run's only: the folder is ours now
    given = [o for o in _PROGRAM_OPTS if getattr(args, o) not in (None, False)]
    source = args.resume or args.init
    if source:
        if args.model:
            raise ValueError(f"give a model or --{'resume' if args.resume else 'init'}, not both")
        allowed = {"lr"} if args.init else set()
        fixed = [o for o in given if o not in allowed]
        if fixed:
            raise ValueError(f"--{fixed[0].replace('_', '-')}: the program is fixed by the checkpoint "
                             f"({'--init may change --lr only' if args.init else 'a resumed run cannot change it'})")
        ck = load_checkpoint(source)
        resumed = args.resume and ck.train.get("reason") != "compiled"
        if args.init and args.lr is not None:
            import dataclasses

            ck.config = dataclasses.replace(ck.config, lr=args.lr)
        threads = threads_option(args.threads, ck.config.backend)
        built = ck.restore(args.model_file, args.trust_model_file, threads)
        prog = built.prog
        meta = TrainMeta.from_dict(ck.train) if resumed else TrainMeta()
        say(f"loaded {ck.path} ({ck.config.model}, {prog.steps} steps done"
            + (f", epoch {meta.epoch} batch {meta.position})" if resumed else ")"))
    else:
        if not args.model:
            raise ValueError("give a model (path/to/model.py:FACTORY or a zoo name), --resume or --init")
        if args.model_file or args.trust_model_file:
            raise ValueError("--model-file and --trust-model-file apply to --resume / --init (a new run names its "
                             "model file as MODEL)")
        config = config_from_options(args, args.model)
        threads = threads_option(args.threads, config.backend)
        built, ck, resumed, meta = None, None, False, TrainMeta()
    # the image shape, from the program (or, before compiling, from the config)
    if built is not None:
        b, c, h, w = image_shape(built.prog)
    else:
        from ..data.folder import check_image_shape
        from .usermodel import parse_input

        if config.loss != "cross_entropy":
            raise ValueError("train fits labelled images: it needs --loss cross_entropy")
        c, h, w = check_image_shape(parse_input(config.inputs[0]).shape)
    if resumed:
        if args.seed is not None and args.seed != meta.seed:
            raise ValueError(f"--seed {args.seed}: the resumed run uses seed {meta.seed}")
        mean, std = normalization(args, c, (meta.mean, meta.std), "the resumed run normalises with")
    else:
        stored = None
        if ck is not None and ck.train.get("reason") == "compiled":  # compile's normalisation is the default
            stored = (tuple(ck.train.get("mean", (0.0,))), tuple(ck.train.get("std", (1.0,))))
        fixed = built is not None and built.config.quantize and stored is not None
        mean, std = normalization(args, c, stored, "the int8 program was calibrated on images normalised with"
                          if fixed else None)
        meta.seed = 0 if args.seed is None else args.seed
    meta.mean, meta.std = mean, std
    data = load_images(args.data, (c, h, w), limit=args.limit, skip_bad=args.skip_bad_images)
    if data.skipped:
        logging.getLogger(__name__).warning(describe_skipped(data.skipped).removeprefix("warning: "))
    if data.conversion((c, h, w)):  # a named set's own size differs from the model's input: say so
        say(f"note: {data.conversion((c, h, w))}")
    fingerprint = data.fingerprint()
    if resumed and meta.data and meta.data != fingerprint:
        raise ValueError(f"--data {args.data} is not the data this run trained on ({len(data)} images now; its "
                         f"fingerprint differs): resume with the same --data and --limit, or start a new run from "
                         f"these weights with --init")
    meta.data = fingerprint
    _check_output(out, ck if resumed else None)
    if not args.val and args.data.startswith("ts:"):  # the _TEST.ts beside the _TRAIN.ts, when there is one
        from ..data.timeseries import test_split_of
        args.val = test_split_of(args.data)
    val = load_images(args.val, (c, h, w), split="test", limit=args.val_limit, skip_bad=args.skip_bad_images) \
        if args.val else None
    if built is None:
        calib = None
        if config.quantize == "int8":
            if args.calibrate:
                from .cli_compile import calibration

                calib = calibration(args, config, (mean, std))[0]
            else:
                calib = [calibration_batch(data, (c, h, w), mean, std, meta.seed)]
        t0 = time.perf_counter()
        built = build_program(config, calibration=calib, contributions=args.contributions,
                              search=args.search or "exact", threads=threads)
        say(f"compiled {config.model} in {time.perf_counter() - t0:.1f} s: {built.prog.memory.summary()}")
    if meta.epoch >= args.epochs:
        say(f"nothing to do: {meta.epoch} epochs are done (--epochs {args.epochs})")
        return 0
    say(f"training on {data.source}: {len(data)} images in {len(data.classes)} classes, epochs "
        f"{meta.epoch + 1}..{args.epochs}, on the {built.prog.backend} backend"
        f"{f' ({threads} threads)' if threads else ''}, checkpoints in {out}")
    opts = TrainOptions(epochs=args.epochs, out_dir=out, mean=mean, std=std, hook=train_hook(),
                        progress=not args.no_progress and logging.getLogger(__name__).isEnabledFor(logging.INFO))
    written = fit(built, data, opts, meta, val, log=say)
    say(f"done: {built.prog.steps} steps; last checkpoint {written[-1]}")
    return 0


def _check_output(out: Path, resumed_from) -> None:
    """A new run must not overwrite another run's checkpoints; a resumed run writes into its own
    folder (or a fresh one)."""
    from .checkpoint import SUFFIX, TMP_PREFIX

    if not out.is_dir():
        return
    found = sorted(p.name for p in out.glob("*" + SUFFIX) if not p.name.startswith(TMP_PREFIX)
                   and p.name != COMPILED_FILE)
    if not found:
        return
    if resumed_from is not None and resumed_from.path is not None and \
            resumed_from.path.resolve().parent == out.resolve():
        return
    raise ValueError(f"{out} already holds checkpoints ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}) "
                     f"of another run: resume it with --resume {out}, or write to another -o folder")


# --- export ---------------------------------------------------------------------------------------------
def run_export(args) -> int:
    from safetensors.torch import save

    from .checkpoint import atomic_write, load_checkpoint

    ck = load_checkpoint(args.checkpoint)
    built = ck.restore(args.model_file, args.trust_model_file)
    sd = {k: v.contiguous() for k, v in built.prog.state_dict().items()}
    try:
        built.model.load_state_dict(sd)
    except RuntimeError as err:
        raise ValueError(f"the exported weights do not load into {ck.config.model}: {str(err).splitlines()[0]}") \
            from err
    meta = {"format": "pt", "edgetrain_model": ck.config.model, "edgetrain_steps": str(built.prog.steps)}
    path = atomic_write(args.output, save(sd, metadata=meta))
    say(f"wrote {len(sd)} tensors ({sum(v.numel() for v in sd.values()):,} values) of {ck.config.model} after "
        f"{built.prog.steps} steps to {path}")
    return 0
