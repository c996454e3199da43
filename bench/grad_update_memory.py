"""Peak memory of a training step whose weight gradients are never stored whole (issue 21
items 1-2: passes/fuse.fuse_weight_grad_update), and the RAM budgets its schedule problem
can reach.

    PYTHONPATH=src python bench/grad_update_memory.py [--cases resnet18-cifar:1 bert-tiny:8 small-cnn-int8:1]
        [--fractions 0.5 0.3] [--solver milp] [--time-limit 30] [--mip-gap 0.001] [--decisions]
        [--device a72] [--momentum 0.9] [--step-time 15]

Per case (a zoo model `name:batch`, or `resnet18-imagenet:batch` (zoo_case), float32, SGD
(--momentum, default 0); or `small-cnn-int8:batch`, a 3->8 channel 3x3 convolution and a
Linear(8192, 16) compiled for int8): the memory report's peak and arena (its largest live set
and where), the schedule problem's plain activation memory and fixed RAM
(edgetrain.remat.build.build_problem), the lower bound every schedule needs
(greedy.ram_lower_bound) as a fraction of the activations (the smallest budget a schedule can
reach), and `et.schedule` at `fixed RAM + f x activations` for each fraction: its modelled
peak, extra energy, the solver's status, gap (on the total energy; --mip-gap asks for another)
and solve time (solver_quality), what it recomputes and pages (--decisions), or Infeasible.
Run the same command on a checkout before the fusion to compare (the figures are
deterministic but for the solve times and what a time limit cuts short).

With --step-time N: also the C host step time (`prog.step`, median of N steps after one
warm-up) of the program with the fusion and of the same program compiled without it (the
pipeline's "fused_grad_updates" step switched off in this process), steps alternating, so
that a loaded machine's noise hits both alike.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import warnings
from contextlib import contextmanager

import torch
import torch.nn as nn

import edgetrain as et
from edgetrain import pipeline
from edgetrain.devices import get_device
from edgetrain.remat.build import build_problem
from edgetrain.remat.greedy import ram_lower_bound
from edgetrain.remat.plan import Infeasible

warnings.filterwarnings("ignore", category=FutureWarning)
MB = 1e6


class SmallCNN(nn.Module):
    """A conv and a large Linear: the Linear's 16 x 8192 weight gradient dominates the step."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 32 * 32, 16)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def compile_case(case: str, args):
    name, batch = case.split(":")
    opt = et.SGD(lr=0.01, momentum=args.momentum)
    if name == "small-cnn-int8":
        torch.manual_seed(0)
        x = torch.randn(int(batch), 3, 32, 32)
        return et.compile(SmallCNN().eval(), (x,), quantize="int8", optimizer=opt)
    model, x = zoo_case(name, int(batch))
    return et.compile(model, (x,), optimizer=opt)


#: "resnet18-imagenet": the zoo's resnet18 (torchvision's architecture) with ImageNet's 1000
#: classes at 224 x 224 (the zoo's own input is 128 x 128)
IMAGENET = {"resnet18-imagenet": ("resnet18", 1000, 224)}


def zoo_case(name: str, batch: int):
    """(model, example input) of a zoo model, or of an IMAGENET variant."""
    if name in IMAGENET:
        zoo, classes, size = IMAGENET[name]
        return et.models.get(zoo, num_classes=classes), torch.randn(batch, 3, size, size,
                                                                    generator=torch.Generator().manual_seed(0))
    return et.models.get(name), et.models.example_input(name, batch=batch)


@contextmanager
def without_fusion():
    """The pipeline without its "fused_grad_updates" step (the unfused program, for comparison)."""
    saved = pipeline.STEPS
    pipeline.STEPS = tuple(dataclasses.replace(s, when=lambda o: False) if s.name == "fused_grad_updates" else s
                           for s in saved)
    try:
        yield
    finally:
        pipeline.STEPS = saved


def step_times(case: str, args) -> None:
    """Median C host step time, fused against unfused, steps alternating."""
    from edgetrain.backends.c.host import to_c_program

    fused = compile_case(case, args)
    with without_fusion():
        unfused = compile_case(case, args)
    if [n.op for n in fused.train_graph.nodes] == [n.op for n in unfused.train_graph.nodes]:
        print("  C host step: nothing fused (every weight gradient fits one block): the same program")
        return
    progs = {"fused": to_c_program(fused), "unfused": to_c_program(unfused)}
    name, batch = case.split(":")
    x = torch.randn(int(batch), 3, 32, 32) if name == "small-cnn-int8" else zoo_case(name, int(batch))[1]
    y = torch.zeros(int(batch), dtype=torch.int64)
    times = {k: [] for k in progs}
    for i in range(args.step_time + 1):
        for k, p in progs.items():
            t0 = time.perf_counter()
            p.step(x, y)
            if i:
                times[k].append(time.perf_counter() - t0)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    print(f"  C host step, median of {args.step_time}: fused {med['fused']:.2f} ms, unfused {med['unfused']:.2f} ms "
          f"({med['fused'] / med['unfused'] - 1:+.1%})")


def solver_quality(s) -> str:
    """The solver's own account of a schedule: its status, its gap (HiGHS's, on the total
    energy, base included: what the issue's "<= 1 % gap" bounds), the lower bound that gap
    puts on the extra energy, and its solve time."""
    if s.status == "heuristic":
        return f"{s.solver}: a heuristic, no bound; solved in {s.solve_s:.1f} s"
    base = s.problem.base_energy_j
    extra_lb = max(0.0, s.energy_j * (1 - s.gap) / base - 1) if base else 0.0
    return (f"{s.status}, gap {100 * s.gap:.2f}% of the total energy (extra energy >= {100 * extra_lb:+.2f}%), "
            f"solved in {s.solve_s:.1f} s")


def print_decisions(s) -> None:
    """What a schedule recomputes and pages, by op, with the energy each costs (share of the
    base energy): where its extra energy goes."""
    us, base, nodes = s.problem.units, s.problem.base_energy_j, s.problem.graph.nodes
    by = {}
    for kind, groups, cost in (("recompute", s.recompute, lambda u: u.energy_j),
                               ("page_in", s.page_in, lambda u: u.page_in_j),
                               ("page_out", [sorted(s.page_out)], lambda u: u.page_out_j)):
        for group in groups:
            for i in group:
                key = (kind, "+".join(dict.fromkeys(nodes[k].op for k in us[i].nodes)))
                n, e, b = by.get(key, (0, 0.0, 0))
                by[key] = (n + 1, e + cost(us[i]), b + us[i].bytes)
    for (kind, name), (n, e, b) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"    {kind:9s} {name[:40]:40s} x{n:4d}  {b / MB:8.2f} MB  {100 * e / base:+.3f}% energy")


def run_case(case: str, args) -> None:
    t0 = time.perf_counter()
    prog = compile_case(case, args)
    mem = prog.memory
    problem = build_problem(prog, get_device(args.device))
    act, fixed = problem.activation_bytes, problem.fixed_ram
    lb = ram_lower_bound(problem)
    print(f"{case}: peak {mem.peak_bytes / MB:.2f} MB ({mem.summary()})")
    print(f"  schedule problem on {args.device}: plain activations {act / MB:.2f} MB, fixed RAM {fixed / MB:.2f} MB, "
          f"lower bound {lb / MB:.2f} MB = fixed + {(lb - fixed) / act:.3f}x activations  "
          f"(compiled in {time.perf_counter() - t0:.1f} s)")
    for f in args.fractions:
        ram = int(fixed + f * act)
        t1 = time.perf_counter()
        try:
            gap = {"mip_rel_gap": args.mip_gap} if args.mip_gap is not None else {}
            s = et.schedule(prog, device=args.device, ram=ram, solver=args.solver, time_limit=args.time_limit, **gap)
            print(f"  {f:.2f}x: budget {ram / MB:.2f} MB -> {args.solver} peak {s.peak_bytes / MB:.2f} MB, "
                  f"extra energy {100 * (s.energy_j / problem.base_energy_j - 1):+.2f}% "
                  f"({time.perf_counter() - t1:.1f} s); {solver_quality(s)}")
            if args.decisions:
                print_decisions(s)
        except Infeasible as e:
            print(f"  {f:.2f}x: budget {ram / MB:.2f} MB -> Infeasible: {str(e)[:160]}")
    if args.step_time:
        step_times(case, args)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["resnet18-cifar:1", "bert-tiny:8", "small-cnn-int8:1"])
    p.add_argument("--fractions", nargs="+", type=float, default=[0.5, 0.3])
    p.add_argument("--solver", default="milp")
    p.add_argument("--time-limit", type=float, default=30.0)
    p.add_argument("--device", default="a72")
    p.add_argument("--step-time", type=int, default=0, help="also time N C host steps, fused against unfused")
    p.add_argument("--mip-gap", type=float, help="the MILP's relative gap, on the total energy (default 1 %%)")
    p.add_argument("--decisions", action="store_true", help="also list what each schedule recomputes and pages")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default 0: et.compile's default SGD)")
    args = p.parse_args(argv)
    for case in args.cases:
        run_case(case, args)


if __name__ == "__main__":
    main()
