"""edgetrain <command>: compile a model into a training program (firmware, memory report),
fine-tune it, export its weights, inspect it, plan its schedule, run the demo."""
from __future__ import annotations

import argparse
import sys


def _scheme(text: str):
    import edgetrain as et

    t = text.lower()
    if t == "full":
        return et.Full()
    if t in ("bias", "bias-only", "biasonly"):
        return et.BiasOnly()
    if t.startswith("last"):
        _, _, k = t.partition(":")
        try:
            return et.LastK(int(k or 1))
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"unknown update scheme {text!r}: use full, bias or last:K")


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


def _inspect(args) -> int:
    import torch

    import edgetrain as et

    model, xs = _model_and_inputs(args)
    prog = et.compile(model, xs, update=args.update)
    print(f"# {args.model}: captured graph")
    print(prog.stages["captured"])
    if args.training_graph:
        print(f"\n# training graph (backward, updates, node order)")
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
    from .demo import DemoConfig, run_demo

    cfg = DemoConfig(task=args.task, train_images=args.train_images, test_images=args.test_images,
                     epochs=args.epochs, seed=args.seed, qas=not args.no_qas, assets=args.assets)
    res = run_demo(cfg)
    return 0 if res["after"] > res["before"] else 1


def _profile(args) -> int:
    import json

    from .devices import calibrate_host, get_device

    dev = calibrate_host() if args.calibrate else get_device(args.device)
    print(json.dumps(dev.as_dict(), indent=2) if args.json else dev.describe())
    return 0


def _plan(args, prog):
    """(problem, ram, deadline, schedule) of `prog` for the schedule options in `args`."""
    from edgetrain.config import parse_bytes
    from edgetrain.devices import get_device
    from edgetrain.schedule.build import build_problem
    from edgetrain.schedule.solvers import SOLVERS

    problem = build_problem(prog, get_device(args.device), group=args.group)
    if args.ram is not None and args.fraction is not None:
        raise ValueError("give --ram or --fraction, not both")
    ram = parse_bytes(args.ram, "--ram")
    if args.fraction is not None:
        if not 0 < args.fraction:
            raise ValueError(f"--fraction must be positive, got {args.fraction}")
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
        print(f"  budget: {'unlimited' if ram is None else f'{ram:,} B'}; deadline: "
              f"{'none' if deadline is None else f'{deadline:.4g} s'}")
        print(f"  {sched.summary()}")
        print(f"  energy x{sched.energy_j / problem.base_energy_j:.4f}, time x{sched.time_s / problem.base_time_s:.4f} "
              f"of plain back-propagation")
    if args.plot:
        from edgetrain.schedule.chart import plot_schedule

        print(f"  schedule map drawn to {plot_schedule(sched, args.plot)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _report(args) -> int:
    import edgetrain as et
    from edgetrain.report import report_files

    model, xs = _sized_inputs(args)
    prog = et.compile(model, xs, update=args.update, quantize=None if args.quantize == "none" else args.quantize)
    sched = None
    if args.ram is not None or args.fraction is not None or args.deadline is not None \
            or args.deadline_factor is not None:
        sched = _plan(args, prog)[3]
    files = report_files(prog, args.output, sched)
    print(f"{args.model}: {prog.memory.summary()}")
    if sched is not None:
        print(f"  {sched.summary()}")
    for k, v in files.items():
        print(f"  {k}: {v}")
    return 0


def _add_schedule_options(c) -> None:
    c.add_argument("--device", default="a72", help="device profile: m0, m4f, m7, a72, tx2, host (default a72)")
    c.add_argument("--ram", help="whole RAM budget, e.g. 48MB (weights included; default unlimited)")
    c.add_argument("--fraction", type=float, help="budget as weights + this fraction of plain back-propagation's "
                   "peak activation memory (instead of --ram)")
    c.add_argument("--deadline", type=float, help="seconds per training step (default none)")
    c.add_argument("--deadline-factor", type=float, help="deadline as this multiple of the plain step's time")
    c.add_argument("--solver", default="milp", choices=("milp", "checkmate", "paging", "chen", "dtr", "none"),
                   help="milp (POET, HiGHS; default), checkmate (remat only), paging (paging only), chen (sqrt(n) "
                   "checkpoints), dtr (greedy eviction), none (keep everything)")
    c.add_argument("--time-limit", type=float, default=60.0, help="MILP time limit in seconds (default 60)")
    c.add_argument("--group", action="store_true", help="decide cheap elementwise chains (conv -> bn -> relu) as one "
                   "unit: a smaller problem, coarser decisions")
    c.add_argument("--update", type=_scheme, default="full", help="full | bias | last:K (default full)")
    c.add_argument("--batch", type=int, default=1, help="batch size of a zoo model (default 1)")
    c.add_argument("--size", type=int, help="image side for image models (default the zoo's)")
    c.add_argument("--classes", type=int, help="number of output classes (default 10; for a model file, passed to "
                   "its factory as num_classes= when given)")


def build_parser() -> argparse.ArgumentParser:
    from .cli_program import EXIT_CODES, add_commands

    p = argparse.ArgumentParser(prog="edgetrain", description="Compile PyTorch models into on-device training "
                                "programs that fit the device's memory.", epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traceback", action="store_true", help="print the Python traceback of an error too")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_commands(sub)
    i = sub.add_parser("inspect", help="print a model's captured graph, trained parameters and memory report")
    i.add_argument("model", help="a zoo model name, or path/to/model.py:FACTORY with --input")
    _add_model_options(i)
    i.add_argument("--update", type=_scheme, default="full", help="full | bias | last:K (default full)")
    i.add_argument("--classes", type=int, help="number of output classes (default 10; for a model file, passed to "
                   "its factory as num_classes= when given)")
    i.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    i.add_argument("--training-graph", action="store_true", help="also print the whole training graph")
    i.add_argument("--plot", metavar="PNG", help="draw the memory timeline to this file")
    i.set_defaults(func=_inspect)
    d = sub.add_parser("demo", help="fine-tune a pretrained model on a downstream set in int8 with QAS")
    d.add_argument("--task", choices=("auto", "digits", "cifar10"), default="auto",
                   help="cifar10: the paper's MobileNetV2-0.35 on CIFAR-10 (needs the shared assets: --assets); "
                        "digits: MNIST-pretrained DigitNet on inverted digits; auto (default): cifar10 if possible")
    d.add_argument("--assets", metavar="DIR", help="the shared assets folder (tiny-training/mbv2-w0.35.pkl and "
                   "CIFAR-10: cifar-10-python.tar.gz, cifar-10-batches-py/ or cifar10-jpg.zip); default "
                   "$EDGETRAIN_ASSETS, else shared/assets beside a source checkout")
    d.add_argument("--train-images", type=int, default=None, help="training images (default: the task's)")
    d.add_argument("--test-images", type=int, default=None, help="test images (default: the task's)")
    d.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    d.add_argument("--seed", type=int, default=0, help="data order, new classifier and rounding seed")
    d.add_argument("--no-qas", action="store_true", help="turn Quantization-Aware Scaling off")
    d.set_defaults(func=_demo)
    f = sub.add_parser("profile", help="print a device's cost profile (RAM, compute, energy, paging)")
    f.add_argument("--device", default="host", help="m0 | m4f | m7 | a72 | tx2 | host (default host)")
    f.add_argument("--calibrate", action="store_true", help="measure this machine instead (a few seconds)")
    f.add_argument("--json", action="store_true", help="print the profile as JSON")
    f.set_defaults(func=_profile)
    c = sub.add_parser("schedule", help="plan rematerialization and paging of a model's training step under a RAM "
                       "budget and a deadline on a device profile (POET)")
    c.add_argument("model", help="a zoo model name, or path/to/model.py:FACTORY with --input")
    _add_model_options(c)
    _add_schedule_options(c)
    c.add_argument("--plot", metavar="PNG", help="draw the time x layer schedule map to this file")
    c.add_argument("--json", action="store_true", help="print one JSON line")
    c.set_defaults(func=_schedule)
    r = sub.add_parser("report", help="write an HTML report (memory timeline by kind, update scheme over the layers, "
                       "and with --ram/--fraction/--deadline a remat/paging schedule map) and its PNGs",
                       description="Write OUT/report.html with memory.png, scheme.png and, when a budget or deadline is "
                       "given, schedule.png (the time x layer map of the chosen solver's schedule).")
    r.add_argument("model", help="a zoo model name, or path/to/model.py:FACTORY with --input")
    _add_model_options(r)
    _add_schedule_options(r)
    r.add_argument("--quantize", choices=("none", "int8"), default="none", help="train in int8 (default float32)")
    r.add_argument("-o", "--output", default="report", help="output folder (default ./report)")
    r.set_defaults(func=_report)
    return p


#: torch.export's own deprecation notice, printed on every capture: noise for a CLI user
TORCH_EXPORT_NOISE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def main(argv=None) -> int:
    import warnings

    from .cli_program import exit_code_for

    warnings.filterwarnings("ignore", message=TORCH_EXPORT_NOISE, category=FutureWarning)
    args = build_parser().parse_args(argv)
    try:
        if isinstance(getattr(args, "update", None), str):
            args.update = _scheme(args.update)
        return args.func(args)
    except argparse.ArgumentTypeError as err:
        print(f"edgetrain {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BaseException as err:  # boundary: a clear message and a meaningful exit code, no traceback
        if isinstance(err, SystemExit):
            raise
        code = exit_code_for(err)
        if args.traceback:
            import traceback

            traceback.print_exc()
        if code is None:
            print(f"edgetrain {args.command}: internal error: {type(err).__name__}: {err} (a bug: rerun with "
                  f"--traceback and report it)", file=sys.stderr)
            return 1
        msg = str(err) or type(err).__name__
        print(f"edgetrain {args.command}: {'interrupted' if code == 130 else 'error'}: {msg}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
