"""edgetrain <command>: compile a model into a training program (firmware, memory report),
fine-tune it, export its weights, inspect it, plan its schedule, run the demo."""
from __future__ import annotations

import argparse
import sys
import threading

from .cli_errors import INTERRUPTED, report_error, warning_line
from .interrupts import command_handlers, deferred_interrupts, forget_unhandled_interrupt, quiet_signals, restore
from .cli_logging import QUIET_HELP, VERBOSE_HELP, command_logging, level_of
from .options import (MAX_BATCH, MAX_CLASSES, MAX_EPOCHS, MAX_FACTOR, MAX_FRACTION, MAX_IMAGE_SIDE, MAX_IMAGES,
                      MAX_SECONDS, MAX_SEED, MAX_THREADS, at_most, bounded_float, byte_size, count, seed,
                      update_scheme_text)

#: --traceback, before or after the command
TRACEBACK_HELP = "print the Python traceback of an error too (it is always saved to a file on an internal error)"
#: --update of inspect, schedule and report (compile and train also take auto, with --contributions)
UPDATE_HELP = "what to train: full, bias (biases only) or last:K (the last K conv/linear layers) (default full)"
MODEL_ARG_HELP = "a zoo model name (mbv2-w0.35, mcunet-5fps, proxyless-w0.3, resnet18, resnet18-cifar, bert-tiny), " \
                 "or path/to/model.py:FACTORY with --input"
CLASSES_HELP = ("number of output classes (default 10; for a model file, passed to its factory as num_classes= "
                f"when given; {at_most(MAX_CLASSES)})")
BATCH_HELP = f"batch size of a zoo model (default 1, {at_most(MAX_BATCH)})"


def _scheme(text: str):
    """The update scheme object of --update's text (read by options.update_scheme_text)."""
    from ..sparse import BiasOnly, Full, LastK

    t = update_scheme_text(text)
    if t == "auto":
        raise argparse.ArgumentTypeError("--update auto needs a contribution table and a budget: use `edgetrain "
                                         "compile MODEL --update auto --contributions JSON --sram BYTES`")
    if t == "full":
        return Full()
    if t == "bias":
        return BiasOnly()
    return LastK(int(t.partition(":")[2]))


def _model_and_inputs(args) -> tuple:
    """(model, example inputs) of `args.model`: a zoo name (its own input at --batch), or
    path/to/model.py:FACTORY with --input (and --model-arg)."""
    import edgetrain as et

    from .usermodel import check_forward, example_inputs, load_model, parse_input, parse_model_args, parse_model_spec

    spec = parse_model_spec(args.model)
    if not spec.is_file and not args.input:
        return et.models.get(args.model, num_classes=args.classes or 10), (et.models.example_input(
            args.model, batch=args.batch),)
    if not args.input:
        raise ValueError(f"{spec}: give the model's input shape, e.g. --input 1x3x64x64 (batch first)")
    model = load_model(spec, parse_model_args(args.model_arg), args.classes)
    xs = example_inputs([parse_input(t) for t in args.input])
    check_forward(model, xs, str(spec))
    return model, xs


def _add_model_options(p) -> None:
    p.add_argument("--input", action="append", metavar="SHAPE[:DTYPE]",
                   help="for a model file: its input shape, batch first, e.g. 1x3x64x64 or 1x128:int64 (repeatable)")
    p.add_argument("--model-arg", action="append", metavar="NAME=VALUE",
                   help="for a model file: a keyword argument of its factory (repeatable)")


def _short_source(line: str) -> str:
    """'path:N: code' with the path relative to the working directory when under it."""
    import os

    path, sep, rest = line.partition(":")
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return line
    return (rel if not rel.startswith("..") else path) + sep + rest


def _inspect(args) -> int:
    import torch

    import edgetrain as et
    from ..ir.printer import format_graph

    model, xs = _model_and_inputs(args)
    prog = et.compile(model, xs, update=args.update)
    print(f"# {args.model}: captured graph (each op with the model line it came from and, "
          f"in brackets, the submodule that ran it)")
    print(format_graph(prog.stages["captured"], {i: _short_source(line) for i, line in prog.source_lines.items()}))
    if args.training_graph:
        print("\n# training graph (backward, updates, node order)")
        print(prog.train_graph)
    n_train = sum(prog.state[p].size for p in prog.trainable)
    print(f"\n# trained parameters ({len(prog.trainable)} tensors, {n_train:,} values)")
    for p, sel in prog.trainable.items():
        extra = f"  channels {len(sel.index)}/{prog.state[p].shape[sel.dim]} of dim {sel.dim}" if sel else ""
        print(f"  {p:50s} {tuple(prog.state[p].shape)}{extra}")
    print(f"\n# memory ({args.update}, batch {xs[0].shape[0]})")
    print(f"  {prog.memory.summary()}")
    if args.plot:
        print(f"  timeline drawn to {prog.memory.plot(args.plot)}")
    del torch
    return 0


def _demo(args) -> int:
    from .exit_codes import NOT_IMPROVED
    from .demo import DemoConfig, run_demo

    cfg = DemoConfig(task=args.task, train_images=args.train_images, test_images=args.test_images,
                     epochs=args.epochs, seed=args.seed, qas=not args.no_qas, assets=args.assets,
                     backend=args.backend, threads=args.threads)
    res = run_demo(cfg)
    return 0 if res["after"] > res["before"] else NOT_IMPROVED


def _profile(args) -> int:
    import json

    from ..devices import calibrate_host, get_device

    dev = calibrate_host() if args.calibrate else get_device(args.device)
    print(json.dumps(dev.as_dict(), indent=2) if args.json else dev.describe())
    return 0


def _plan(args, prog):
    """(problem, ram, deadline, schedule) of `prog` for the schedule options in `args`."""
    from edgetrain.config import parse_bytes
    from edgetrain.devices import get_device
    from edgetrain.remat.build import build_problem
    from edgetrain.remat.solvers import SOLVERS

    problem = build_problem(prog, get_device(args.device), group=args.group, mapped_weights=args.mapped_weights)
    ram = parse_bytes(args.ram, "--ram")  # the parser checked the numbers (cli_types) and that one was given
    if args.fraction is not None:
        ram = problem.fixed_ram + int(args.fraction * problem.activation_bytes)
    deadline = args.deadline
    if args.deadline_factor is not None:
        deadline = args.deadline_factor * problem.base_time_s
    return problem, ram, deadline, SOLVERS[args.solver](problem, ram, deadline, args.time_limit)


def _sized_inputs(args):
    import torch

    model, xs = _model_and_inputs(args)
    x = xs[0]
    if getattr(args, "size", None):
        if x.dim() != 4:
            raise ValueError(f"--size applies to image models; {args.model} takes {tuple(x.shape)}")
        x = torch.randn(x.shape[0], x.shape[1], args.size, args.size, generator=torch.Generator().manual_seed(0))
        xs = (x,) + tuple(xs[1:])
    return model, xs


def _schedule(args) -> int:
    import json

    import edgetrain as et
    from edgetrain.config import format_bytes

    model, xs = _sized_inputs(args)
    prog = et.compile(model, xs, update=args.update)
    problem, ram, deadline, sched = _plan(args, prog)
    if args.json:
        print(json.dumps(dict(model=args.model, device=args.device, solver=args.solver, ram=ram, deadline_s=deadline,
                              energy_j=sched.energy_j, time_s=sched.time_s, peak_bytes=sched.peak_bytes,
                              activation_bytes=sched.activation_bytes, plain_activation_bytes=problem.activation_bytes,
                              base_energy_j=problem.base_energy_j, base_time_s=problem.base_time_s,
                              recomputations=sched.recomputations, page_ins=sched.page_ins,
                              page_outs=len(sched.page_out), solve_s=sched.solve_s, gap=sched.gap,
                              status=sched.status)))
    else:
        print(f"# {args.model} (batch {xs[0].shape[0]}) on {problem.device.title}")
        print(f"  {problem.describe()}")
        print(f"  budget: {'unlimited' if ram is None else f'{format_bytes(ram)} ({ram:,} B)'}; deadline: "
              f"{'none' if deadline is None else f'{deadline:.4g} s'}")
        print(f"  {sched.summary()}")
        print(f"  energy x{sched.energy_j / problem.base_energy_j:.4f}, time x{sched.time_s / problem.base_time_s:.4f} "
              f"of plain back-propagation")
    if args.plot:
        from edgetrain.reports.schedule_chart import plot_schedule

        print(f"  schedule map drawn to {plot_schedule(sched, args.plot)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _report(args) -> int:
    import edgetrain as et
    from edgetrain.reports.html import report_files

    from edgetrain.remat.plan import Infeasible

    model, xs = _sized_inputs(args)
    prog = et.compile(model, xs, update=args.update, quantize=None if args.quantize == "none" else args.quantize)
    sched, refused = None, None
    if args.ram is not None or args.fraction is not None or args.deadline is not None \
            or args.deadline_factor is not None:
        try:
            sched = _plan(args, prog)[3]
        except Infeasible as err:  # the memory and scheme figures need no schedule: written all the same
            refused = err
    files = report_files(prog, args.output, sched)
    print(f"{args.model}: {prog.memory.summary()}")
    if sched is not None:
        print(f"  {sched.summary()}")
    for k, v in files.items():
        print(f"  {k}: {v}")
    if refused is not None:
        raise Infeasible(f"{refused}; {_smallest_fraction(args, prog, refused)}; the report above has no schedule",
                         refused.smallest_ram)
    return 0


def _smallest_fraction(args, prog, err) -> str:
    """What to try after `err` (an Infeasible of `prog` on args.device): the smallest RAM a
    schedule meets, as the MILP found it, else the problem's proven lower bound (no schedule fits
    below it), as --ram and as the --fraction (2 decimals, rounded up) that gives at least it."""
    import math

    from edgetrain.devices import get_device
    from edgetrain.remat.build import build_problem
    from edgetrain.remat.greedy import ram_lower_bound

    problem = build_problem(prog, get_device(args.device), group=args.group, mapped_weights=args.mapped_weights)
    ram = err.smallest_ram or ram_lower_bound(problem)
    act = max(problem.activation_bytes, 1)
    f = math.ceil(100 * (ram - problem.fixed_ram) / act) / 100
    while problem.fixed_ram + int(f * act) < ram:  # the budget _plan makes of f is at least ram
        f = round(f + 0.01, 2)
    if err.smallest_ram:
        return f"the smallest budget that fits: --fraction {f:g} (--ram {ram:,} bytes)"
    return f"try --fraction {f:g} (--ram {ram:,} bytes) or more"


def _add_schedule_options(c) -> None:
    c.add_argument("--device", default="a72", help="device profile: m0, m4f, m7, a72, tx2, host (default a72)")
    ram = c.add_mutually_exclusive_group()
    ram.add_argument("--ram", "--sram", dest="ram", type=byte_size, metavar="BYTES",
                     help="whole RAM budget, e.g. 48MB (weights included; default unlimited)")
    ram.add_argument("--fraction", type=bounded_float(MAX_FRACTION), help="budget as weights + this fraction of "
                     f"plain back-propagation's peak activation memory (instead of --ram; {at_most(MAX_FRACTION)})")
    deadline = c.add_mutually_exclusive_group()
    deadline.add_argument("--deadline", type=bounded_float(MAX_SECONDS), metavar="SECONDS",
                          help=f"seconds per training step (default none; {at_most(MAX_SECONDS)})")
    deadline.add_argument("--deadline-factor", type=bounded_float(MAX_FACTOR), metavar="FACTOR",
                          help="deadline as this multiple of the plain step's time (instead of --deadline; "
                               f"{at_most(MAX_FACTOR)})")
    c.add_argument("--solver", default="milp", choices=("milp", "checkmate", "paging", "chen", "dtr", "none"),
                   help="milp (POET, HiGHS; default), checkmate (remat only), paging (paging only), chen (sqrt(n) "
                   "checkpoints), dtr (greedy eviction), none (keep everything)")
    c.add_argument("--time-limit", type=bounded_float(MAX_SECONDS), default=60.0, metavar="SECONDS",
                   help=f"MILP time limit in seconds (default 60, {at_most(MAX_SECONDS)})")
    c.add_argument("--group", action="store_true", help="decide cheap elementwise chains (conv -> bn -> relu) as one "
                   "unit: a smaller problem, coarser decisions")
    c.add_argument("--mapped-weights", action="store_true",
                   help="the frozen weights are mapped from weights.bin, as the standalone host binary runs them "
                        "(compile --target host): the schedule also decides when each is resident and pays to read "
                        "it back, instead of holding all of them in RAM (no effect on devices whose weights sit in "
                        "flash)")
    c.add_argument("--update", type=update_scheme_text, default="full", metavar="SCHEME", help=UPDATE_HELP)
    c.add_argument("--batch", type=count(MAX_BATCH), default=1, help=BATCH_HELP)
    c.add_argument("--size", type=count(MAX_IMAGE_SIDE),
                   help=f"image side for image models (default the zoo's, {at_most(MAX_IMAGE_SIDE)})")
    c.add_argument("--classes", type=count(MAX_CLASSES), help=CLASSES_HELP)


def _texts(command: str, description: str, *examples: str) -> dict:
    """add_parser's description, epilog (examples, then the command's exit codes) and formatter:
    every command's --help says what it does, shows how to call it and what its exit code means."""
    import textwrap

    from .exit_codes import exit_codes

    shown = "\n".join(f"  {e}" for e in examples)
    return dict(description=textwrap.fill(description, 88), formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog=f"example{'s' if len(examples) > 1 else ''}:\n{shown}\n\n{exit_codes(command)}")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from .cli_federate import add_federate
    from .cli_program import add_commands
    from .exit_codes import EXIT_CODES

    p = argparse.ArgumentParser(prog="edgetrain", description="Compile PyTorch models into on-device training "
                                "programs that fit the device's memory.", epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"edgetrain {__version__}")
    p.add_argument("--traceback", action="store_true", help=TRACEBACK_HELP)
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    p.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_commands(sub)
    add_federate(sub)
    i = sub.add_parser("inspect", help="print a model's captured graph, trained parameters and memory report",
                       **_texts("inspect",
                                "Capture MODEL, compile its training program for --update and print the captured "
                                "graph (op by op, with shapes), the parameters the scheme trains and the memory of "
                                "one training step; --training-graph prints the whole training graph too.",
                                "edgetrain inspect mbv2-w0.35 --update last:4",
                                "edgetrain inspect nets/mine.py:build --input 1x3x64x64 --update bias --plot mem.png"))
    i.add_argument("model", help=MODEL_ARG_HELP)
    _add_model_options(i)
    i.add_argument("--update", type=update_scheme_text, default="full", metavar="SCHEME", help=UPDATE_HELP)
    i.add_argument("--classes", type=count(MAX_CLASSES), help=CLASSES_HELP)
    i.add_argument("--batch", type=count(MAX_BATCH), default=1, help=BATCH_HELP)
    i.add_argument("--training-graph", action="store_true", help="also print the whole training graph")
    i.add_argument("--plot", metavar="PNG", help="draw the memory timeline to this file")
    i.set_defaults(func=_inspect)
    d = sub.add_parser("demo", help="fine-tune a pretrained model on a downstream set in int8 with QAS",
                       **_texts("demo",
                                "Compile a pretrained model into an int8 training program (Quantization-Aware "
                                "Scaling, sparse update) and fine-tune it on the host on a data set it has not seen, "
                                "printing int8 test accuracy before and after, and after loading the trained weights "
                                "back into PyTorch; beside it, compile the program that fits the target device (a "
                                "Cortex-M7 with 256 KB of SRAM: batch 1, SGD without momentum, sparse update) and "
                                "print its peak memory. Exit 0 when accuracy improved, 6 when it did not.",
                                "edgetrain demo --task digits --train-images 800 --test-images 200",
                                "edgetrain demo --task cifar10 --epochs 2"))
    d.add_argument("--task", choices=("auto", "digits", "cifar10"), default="auto",
                   help="cifar10: the paper's MobileNetV2-0.35 on CIFAR-10 (needs the shared assets: --assets); "
                        "digits: MNIST-pretrained DigitNet on inverted digits; auto (default): cifar10 if possible")
    d.add_argument("--assets", metavar="DIR", help="the shared assets folder (tiny-training/mbv2-w0.35.pkl and "
                   "CIFAR-10: cifar-10-python.tar.gz, cifar-10-batches-py/ or cifar10-jpg.zip); default "
                   "$EDGETRAIN_ASSETS, else shared/assets beside a source checkout")
    d.add_argument("--train-images", type=count(MAX_IMAGES), default=None, metavar="N",
                   help="training images (default: the task's, 8000 digits or 1500 CIFAR-10 images; "
                        f"{at_most(MAX_IMAGES)})")
    d.add_argument("--test-images", type=count(MAX_IMAGES), default=None, metavar="N",
                   help=f"test images (default: the task's, 2000 or 500; {at_most(MAX_IMAGES)})")
    d.add_argument("--epochs", type=count(MAX_EPOCHS), default=1, help=f"epochs (default 1, {at_most(MAX_EPOCHS)})")
    d.add_argument("--seed", type=seed, default=0,
                   help=f"data order, new classifier and rounding seed (default 0, {at_most(MAX_SEED)})")
    d.add_argument("--no-qas", action="store_true", help="turn Quantization-Aware Scaling off")
    from .cli_config import BACKEND_HELP, THREADS_HELP

    d.add_argument("--backend", choices=("reference", "c"), help=BACKEND_HELP)
    d.add_argument("--threads", type=count(MAX_THREADS), metavar="N", help=f"{THREADS_HELP} ({at_most(MAX_THREADS)})")
    d.set_defaults(func=_demo)
    f = sub.add_parser("profile", help="print a device's cost profile (RAM, compute, energy, paging)",
                       **_texts("profile",
                                "Print the cost profile that `schedule` and `report` plan with: RAM, compute "
                                "throughput, energy per operation and per byte paged. --calibrate measures this "
                                "machine instead of using a stored profile.",
                                "edgetrain profile --device m4f", "edgetrain profile --calibrate --json"))
    f.add_argument("--device", default="host", help="m0 | m4f | m7 | a72 | tx2 | host (default host)")
    f.add_argument("--calibrate", action="store_true", help="measure this machine instead (a few seconds)")
    f.add_argument("--json", action="store_true", help="print the profile as JSON")
    f.set_defaults(func=_profile)
    c = sub.add_parser("schedule", help="plan rematerialization and paging of a model's training step under a RAM "
                       "budget and a deadline on a device profile (POET)",
                       **_texts("schedule",
                                "Plan which activations of MODEL's training step to keep, recompute or page out so "
                                "that the step fits --ram (or --fraction) and --deadline on --device at the least "
                                "energy (POET's MILP, or a baseline --solver), and print the plan's energy and time "
                                "against plain back-propagation. Exit 3 when no plan fits.",
                                "edgetrain schedule resnet18-cifar --batch 8 --device a72 --fraction 0.5",
                                "edgetrain schedule mbv2-w0.35 --device m7 --ram 320KB --deadline-factor 1.2 --json"))
    c.add_argument("model", help=MODEL_ARG_HELP)
    _add_model_options(c)
    _add_schedule_options(c)
    c.add_argument("--plot", metavar="PNG", help="draw the time x layer schedule map to this file")
    c.add_argument("--json", action="store_true", help="print one JSON line")
    c.set_defaults(func=_schedule)
    r = sub.add_parser("report", help="write an HTML report (memory timeline by kind, update scheme over the layers, "
                       "and with --ram/--fraction/--deadline a remat/paging schedule map) and its PNGs",
                       **_texts("report",
                                "Write OUT/report.html with memory.png, scheme.png and, when a budget or deadline "
                                "is given, schedule.png (the time x layer map of the chosen solver's schedule).",
                                "edgetrain report mbv2-w0.35 --update last:4 -o report/",
                                "edgetrain report nets/mine.py:build --input 8x1x28x28 --fraction 0.8 --device m4f "
                                "-o report/"))
    r.add_argument("model", help=MODEL_ARG_HELP)
    _add_model_options(r)
    _add_schedule_options(r)
    r.add_argument("--quantize", choices=("none", "int8"), default="none", help="train in int8 (default float32)")
    r.add_argument("-o", "--output", default="report", help="output folder (default ./report)")
    r.set_defaults(func=_report)
    for command in _subparsers(p).values():  # before or after the command: `edgetrain compile ... --traceback`
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=TRACEBACK_HELP)
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        command.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)
    return p


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """parser.parse_args, except that an option the command does not know is reported with the
    command's own usage (and the closest option it has), not the top-level usage."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        import difflib

        command = _subparsers(parser)[args.command]
        # every spelling of an option, and the name its help shows first (--sram of schedule is --ram)
        known = {o: next(x for x in a.option_strings if x.startswith("--")) for a in command._actions
                 if a.help != argparse.SUPPRESS and any(x.startswith("--") for x in a.option_strings)
                 for o in a.option_strings}
        hint = ""
        for word in extra:
            close = difflib.get_close_matches(word.split("=")[0], list(known), n=1) if word.startswith("-") else []
            if close:
                hint = f" (did you mean {known[close[0]]}?)"
                break
        command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


#: the commands whose work imports torch: main() imports it first with signals held back
TORCH_COMMANDS = frozenset(("compile", "train", "export", "federate", "inspect", "demo", "schedule", "report"))


def main(argv=None) -> int:
    """`edgetrain ARGV`: the exit code (0 done, 2 usage, ..., 130 interrupted: EXIT_CODES). Ctrl-C
    or SIGTERM at any moment (during start-up's imports, a second one included) ends in exit 130
    with one line and no traceback. Run as the program (argv None) a signal after the outcome is
    decided is ignored while Python exits."""
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    interrupts, old = command_handlers() if in_main_thread else (None, {})
    try:
        try:
            code = _run(argv)
        except KeyboardInterrupt:  # at start-up, or a signal while an error was being reported
            code = None
        if interrupts is not None and interrupts.seen and code != INTERRUPTED:  # one something caught
            code = None
        if in_main_thread:
            old = {**quiet_signals(), **old}
    except KeyboardInterrupt:  # a signal between the outcome and the quiet handlers
        code = None
        if in_main_thread:
            old = {**quiet_signals(), **old}
    try:
        if code is None:
            print("edgetrain: interrupted", file=sys.stderr)
            code = INTERRUPTED
        return code
    finally:
        if in_main_thread and argv is not None:  # called inside another program: leave it as it was
            restore(old)
        elif argv is None and code == INTERRUPTED:
            forget_unhandled_interrupt()


def _run(argv) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.verbose and args.quiet:
        _subparsers(parser)[args.command].error("-v/--verbose and -q/--quiet exclude each other")
    try:
        import warnings

        with warnings.catch_warnings(), command_logging(args.command, level_of(args)):
            warnings.showwarning = warning_line(args.command, warnings.showwarning)
            if args.command in TORCH_COMMANDS:  # first: _scheme and the command import torch too
                with deferred_interrupts():  # a signal inside torch's C++ start-up aborts the process
                    import torch  # noqa: F401
            if isinstance(getattr(args, "update", None), str):
                args.update = _scheme(args.update)
            return args.func(args)
    except argparse.ArgumentTypeError as err:
        print(f"edgetrain {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BaseException as err:  # boundary: a clear message and a meaningful exit code, no traceback
        if isinstance(err, SystemExit):
            raise
        return report_error(args, err, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
