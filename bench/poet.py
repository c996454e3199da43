"""Energy and time of one training step against the RAM budget, for every schedule solver,
on ResNet-18, MobileNetV2 and a BERT-style encoder and the A72 / M4F / M7 profiles.

    PYTHONPATH=src python bench/poet.py [--cases resnet18-cifar:8 resnet18:1:224 ...]
        [--devices a72 m4f m7] [--fractions 1 0.8 0.6 0.5 0.4 0.3] [--solvers milp checkmate ...]
        [--time-limit 60] [--deadline-factor F] [--out docs/results/poet.jsonl] [--charts docs/results]
        [--ray [ADDRESS]]
    PYTHONPATH=src python bench/poet.py --summarize docs/results/poet.jsonl   # the markdown tables

A case is `model:batch[:size]` (a zoo model, its batch, and for image models the input
side, default the zoo's). Each is compiled for float32 training (full update, SGD) and
turned into its schedule problem on each device profile (`schedule.build.build_problem`).
The RAM budget is the weights' RAM (`problem.fixed_ram`: trained weights, and frozen ones
where the device does not read them from flash) plus a fraction of the activation memory
plain back-propagation needs (`problem.activation_bytes`, the no-remat peak); the same
problem goes to every solver (`SOLVERS[name](problem, ram, deadline, time_limit)`).
With --deadline-factor F the deadline is F x the plain step time, as POET's "runtime
factor".

Prints and writes one JSON line per (case, device, fraction, solver): energy and time
relative to plain back-propagation's, the model's peak, recomputations, page traffic,
solve seconds, optimality gap and status ("infeasible" when nothing fits); draws
energy-vs-budget charts per case and device and the time x layer schedule map of the
MILP at the --map-fraction budget (PNG). With --ray, the solves of one case and device run
as Ray tasks (a local Ray using every core, or the cluster at ADDRESS), each printed as it
finishes and written in the grid's order; the rows equal the serial ones except where a
MILP stops at --time-limit (its incumbent then depends on the speed of the core).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

import edgetrain as et
from edgetrain.devices import get_device
from edgetrain.remat.build import build_problem
from edgetrain.reports.schedule_chart import plot_energy_vs_budget, plot_schedule
from edgetrain.remat.plan import Infeasible
from edgetrain.remat.solvers import SOLVERS

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

DEFAULT_CASES = ("resnet18-cifar:8", "resnet18:1:224", "mbv2-w0.35:1", "bert-tiny:8")
DEFAULT_SOLVERS = ("none", "chen", "dtr", "paging", "checkmate", "milp")


def compile_case(case: str):
    name, batch, *size = case.split(":")
    model = et.models.get(name)
    x = et.models.example_input(name, batch=int(batch))
    if size:
        x = torch.randn(int(batch), x.shape[1], int(size[0]), int(size[0]), generator=torch.Generator().manual_seed(0))
    return et.compile(model, (x,))


def solve_piece(shared, piece) -> tuple[dict, object]:
    """One (fraction, solver) of one problem: (its row's measured fields, the schedule when a
    map is to be drawn of it, else None). A piece of scale.run_pieces: runs here or on Ray."""
    problem, deadline, args = shared
    frac, solver, ram = piece
    t0 = time.perf_counter()
    try:
        s = SOLVERS[solver](problem, ram, deadline, args.time_limit)
    except Infeasible as err:
        return dict(status="infeasible", message=str(err)[:200], solve_s=round(time.perf_counter() - t0, 3)), None
    row = dict(status=s.status, energy_rel=s.energy_j / problem.base_energy_j,
               time_rel=s.time_s / problem.base_time_s, energy_j=s.energy_j, time_s=s.time_s,
               peak_bytes=s.peak_bytes, activation_bytes=s.activation_bytes,
               recomputations=s.recomputations, page_ins=s.page_ins,
               page_outs=len(s.page_out), page_in_bytes=s.page_in_bytes,
               page_out_bytes=s.page_out_bytes, solve_s=round(s.solve_s, 3), gap=s.gap)
    assert s.peak_bytes <= ram or solver == "none"
    mapped = solver == "milp" and abs(frac - args.map_fraction) < 1e-9 and args.charts
    return row, (s if mapped else None)


def run(args) -> list[dict]:
    from edgetrain.scale import run_pieces

    rows = []
    out = Path(args.out) if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")
    if args.charts:
        Path(args.charts).mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        prog = compile_case(case)
        for dev_name in args.devices:
            problem = build_problem(prog, get_device(dev_name))
            deadline = args.deadline_factor * problem.base_time_s if args.deadline_factor else None
            series: dict[str, list] = {s: [] for s in args.solvers}
            pieces = {(frac, solver): (frac, solver, problem.fixed_ram + int(frac * problem.activation_bytes))
                      for frac in args.fractions for solver in args.solvers}

            def row_of(key, result, problem=problem, deadline=deadline):
                (frac, solver), (measured, _) = key, result
                return dict(case=case, device=dev_name, fraction=frac, ram=pieces[key][2], solver=solver,
                            units=len(problem.units), stages=len(problem.stages),
                            plain_activation_bytes=problem.activation_bytes, fixed_ram=problem.fixed_ram,
                            deadline_s=deadline, **measured)

            # each solve is independent: printed as it finishes, written in the order of the grid
            done = run_pieces(solve_piece, (problem, deadline, args), pieces, executor=args.executor,
                              progress=lambda key, result: print(json.dumps(row_of(key, result)), flush=True))
            for key, (measured, schedule) in done.items():
                (frac, solver), row = key, row_of(key, (measured, schedule))
                if row["status"] != "infeasible" and row["peak_bytes"] <= row["ram"]:
                    series[solver].append((frac, row["energy_rel"]))
                if schedule is not None:
                    path = Path(args.charts) / f"poet-map-{case.replace(':', '-')}-{dev_name}.png"
                    plot_schedule(schedule, path, title=f"{case} on {dev_name}, activations ≤ {frac:.0%} of plain: "
                                  + schedule.summary().split(": ", 1)[1])
                rows.append(row)
                if out:
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
            if args.charts:
                path = Path(args.charts) / f"poet-energy-{case.replace(':', '-')}-{dev_name}.png"
                plot_energy_vs_budget(series, path, title=f"{case} on {problem.device.title}: energy vs RAM budget")
    return rows


def markdown(rows: list[dict]) -> str:
    """Per case and device, a table: budget fraction x solver -> extra energy, extra time,
    solve seconds (gap) or "infeasible"."""
    out = []
    keys = []
    for r in rows:
        if (r["case"], r["device"]) not in keys:
            keys.append((r["case"], r["device"]))
    for case, dev in keys:
        rs = [r for r in rows if r["case"] == case and r["device"] == dev]
        solvers = list(dict.fromkeys(r["solver"] for r in rs))
        fr = sorted({r["fraction"] for r in rs}, reverse=True)
        r0 = rs[0]
        out.append(f"\n**{case} on {dev}** ({r0['units']} units, {r0['stages']} stages; plain activations "
                   f"{r0['plain_activation_bytes'] / 2**20:.2f} MiB, weights in RAM {r0['fixed_ram'] / 2**20:.2f} MiB): "
                   "extra energy / extra time / solve s (gap)\n")
        out.append("| budget | " + " | ".join(solvers) + " |")
        out.append("|---|" + "---|" * len(solvers))
        for f in fr:
            cells = []
            for sv in solvers:
                r = next((x for x in rs if x["fraction"] == f and x["solver"] == sv), None)
                if r is None:
                    cells.append("")
                elif r["status"] != "infeasible" and r["peak_bytes"] > r["ram"]:
                    cells.append(f"over budget ({r['activation_bytes'] / r['plain_activation_bytes']:.0%})")
                elif r["status"] == "infeasible":
                    cells.append("infeasible")
                else:
                    gap = f" ({r['gap']:.1%})" if r["gap"] else ""
                    cells.append(f"{r['energy_rel'] - 1:+.2%} / {r['time_rel'] - 1:+.1%} / {r['solve_s']:.1f}{gap}"
                                 + (" TL" if r["status"] == "time_limit" else ""))
            out.append(f"| {f:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    ap.add_argument("--devices", nargs="+", default=["a72", "m4f", "m7"])
    ap.add_argument("--fractions", nargs="+", type=float, default=[1.0, 0.8, 0.6, 0.5, 0.4, 0.3])
    ap.add_argument("--solvers", nargs="+", default=list(DEFAULT_SOLVERS), choices=list(SOLVERS))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--deadline-factor", type=float, default=None)
    ap.add_argument("--map-fraction", type=float, default=0.5)
    ap.add_argument("--out", default="docs/results/poet.jsonl")
    ap.add_argument("--charts", default="docs/results")
    ap.add_argument("--summarize", metavar="JSONL", help="only print the markdown tables of a results file")
    ap.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                    help="solve as Ray tasks: on a local Ray, or on the cluster at ADDRESS (HOST:PORT)")
    args = ap.parse_args(argv)
    if args.summarize:
        print(markdown([json.loads(line) for line in Path(args.summarize).read_text().splitlines() if line.strip()]))
        return 0
    torch.manual_seed(0)
    args.executor = None
    if args.ray is not None:
        from edgetrain.scale import RayExecutor
        args.executor = RayExecutor(address=None if args.ray == "local" else args.ray)
    try:
        run(args)
    finally:
        if args.executor is not None:
            args.executor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
