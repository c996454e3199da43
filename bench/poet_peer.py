"""Peer measurement: POET's own MILP (github ShishirPatil/poet) solved with HiGHS / CBC through PuLP.

Runs in a separate virtual environment that has POET's dependencies, never edgetrain's:

    python3 -m venv /tmp/poet-venv
    /tmp/poet-venv/bin/pip install "numpy<2.4" pandas matplotlib loguru toposort graphviz pulp highspy==1.15.1
    /tmp/poet-venv/bin/python bench/poet_peer.py --poet-src /tmp/poet-src --time-limit 400

numpy < 2.4: POET multiplies PuLP variables by 1-element arrays (``cost[i]`` of a (T, 1) vector),
which numpy 2.4 no longer converts to a float. Measured with PuLP 3.3.2, HiGHS (highspy) 1.15.1.

``--poet-src`` is an extracted checkout of POET; it is imported from there (nothing of it lives in
this repository). POET's package ``__init__`` imports gurobipy, so the ``poet`` package is
registered here without running it and only the modules that build the graph and the PuLP model
are imported. The model is POET's ``POETSolver`` unchanged; only the PuLP solver object it
solves with is swapped (POET offers Gurobi and CBC; HiGHS is PuLP's ``pulp.HiGHS``).

One JSON line per run on stdout (progress on stderr). Fields: the problem (model, platform, ram
budget, runtime factor), its size (T nodes, edges, variables, constraints), the solve (solver,
status, HiGHS model status, gap, seconds to build the PuLP model and to solve it), and the
schedule found: POET's objective (energy, J), the baseline (every node computed once, no
paging: POET's energy without a memory budget), the relative extra energy, recomputations
(sum R minus T), page-ins and page-outs, compute time used versus its budget.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time
import types
import uuid as _uuid


def parse_bytes(text: str) -> int:
    """'3MB' -> 3_000_000 (decimal units, as POET's README: --ram-budget 3000000)."""
    t = text.strip().upper()
    for suffix, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
        if t.endswith(suffix):
            return int(round(float(t[: -len(suffix)]) * scale))
    return int(t)


def import_poet(src: str):
    """Register POET's package from ``src`` without executing its __init__ (which needs gurobipy)."""
    pkg_dir = os.path.join(os.path.abspath(src), "poet")
    if not os.path.isfile(os.path.join(pkg_dir, "poet_solver.py")):
        raise SystemExit(f"--poet-src {src!r}: no poet/poet_solver.py there")
    pkg = types.ModuleType("poet")
    pkg.__path__ = [pkg_dir]
    sys.modules["poet"] = pkg
    os.environ.setdefault("MPLBACKEND", "Agg")
    import poet.utils.checkmate.core.graph_builder as graph_builder
    import poet.util as util
    import poet.poet_solver as poet_solver

    return util, poet_solver, graph_builder


def make_uuid_deterministic(graph_builder) -> None:
    """POET's GraphBuilder names nodes with uuid4 and topologically sorts sets of them, so the
    order of nodes at the same depth (hence the plain schedule and the MILP) changes from run to
    run. Counter-based UUIDs make the order repeatable (node creation order breaks ties)."""
    counter = itertools.count(1)
    graph_builder.uuid = types.SimpleNamespace(
        uuid4=lambda: _uuid.UUID(int=next(counter)), UUID=_uuid.UUID
    )


def plain_peak_bytes(g) -> int:
    """Peak of the plain schedule (each node once, in order, each output freed after its last use)
    in POET's memory model: outputs of all nodes, parameters not counted."""
    last_use = {i: i for i in range(g.size)}
    for u, v in g.edge_list:
        last_use[u] = max(last_use[u], v)
    peak = 0
    for k in range(g.size):
        live = sum(g.cost_ram[i] for i in range(k + 1) if last_use[i] >= k)
        peak = max(peak, live)
    return int(peak)


def build(util, args):
    chipset, net = util.get_chipset_and_net(
        platform=args.platform, model=args.model, batch_size=args.batch_size
    )
    g, cpu_j, pin_j, pout_j = util.make_dfgraph_costs(net=net, device=chipset)
    return chipset, g, cpu_j, pin_j, pout_j


def run_one(poet_solver, pl, problem, args, ram: int, solver_name: str) -> dict:
    _chipset, g, cpu_j, pin_j, pout_j = problem
    T = g.size
    total_runtime = sum(g.cost_cpu.values())
    runtime_budget = args.runtime_ratio * total_runtime
    t0 = time.perf_counter()
    solver = poet_solver.POETSolver(
        g=g,
        cpu_power_cost_vec_joule=cpu_j,
        pagein_power_cost_vec_joule=pin_j,
        pageout_power_cost_vec_joule=pout_j,
        ram_budget_bytes=ram,
        runtime_budget_ms=runtime_budget,
        paging=True,
        remat=True,
        solver="pulp-cbc",
        time_limit_s=args.time_limit,
        solve_threads=args.threads,
    )
    if solver_name == "highs":
        solver.solver = pl.HiGHS(msg=args.msg, timeLimit=args.time_limit, threads=args.threads)
    elif solver_name == "cbc":
        solver.solver = pl.PULP_CBC_CMD(msg=args.msg, timeLimit=args.time_limit, threads=args.threads)
    else:
        raise SystemExit(f"unknown solver {solver_name!r} (highs, cbc)")
    build_s = time.perf_counter() - t0
    m = solver.m
    n_vars = len(m.variables())
    n_cons = len(m.constraints)
    print(f"[poet_peer] {solver_name} ram={ram}: built {n_vars} vars / {n_cons} cons in {build_s:.1f}s",
          file=sys.stderr, flush=True)

    t1, c1 = time.perf_counter(), time.process_time()
    sol = solver.solve()
    solve_s, solve_cpu_s = time.perf_counter() - t1, time.process_time() - c1

    baseline = float(cpu_j.sum())
    out = {
        "peer": "poet",
        "model": args.model,
        "platform": args.platform,
        "batch_size": args.batch_size,
        "solver": solver_name,
        "threads": args.threads,
        "time_limit_s": args.time_limit,
        "ram": ram,
        "runtime_ratio": args.runtime_ratio,
        "T": T,
        "edges": len(g.edge_list),
        "variables": n_vars,
        "constraints": n_cons,
        "build_s": round(build_s, 2),
        "solve_s": round(solve_s, 2),
        "solve_cpu_s": round(solve_cpu_s, 2),  # this process's CPU time (CBC runs as a child: not in it)
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "pulp_status": pl.LpStatus[m.status],
        "feasible": bool(sol.feasible),
        "baseline_energy_j": baseline,
    }
    highs = getattr(m, "solverModel", None)
    if solver_name == "highs" and highs is not None:
        info = highs.getInfo()
        out["highs_status"] = highs.modelStatusToString(highs.getModelStatus())
        out["mip_gap"] = float(info.mip_gap)
        out["mip_dual_bound"] = float(info.mip_dual_bound)
        out["mip_nodes"] = int(info.mip_node_count)
        out["highs_run_s"] = round(float(highs.getRunTime()), 2)
        out["highs_objective"] = float(info.objective_function_value)
    # Not m.objective.value(): POET's coefficients are 1-element numpy arrays, and PuLP's value()
    # adds into the expression's constant in place, so each call returns more (2x on the second).
    if sol.feasible:
        def val(v):
            x = v.value()
            return 0.0 if x is None else x

        R = [[round(val(v)) for v in row] for row in solver.R]
        MIn = [[round(val(v)) for v in row] for row in solver.MIn]
        MOut = [[round(val(v)) for v in row] for row in solver.MOut]
        cpu = sum(R[t][i] * float(cpu_j[i, 0]) for t in range(T) for i in range(T))
        page = sum(MIn[t][i] * float(pin_j[i, 0]) + MOut[t][i] * float(pout_j[i, 0])
                   for t in range(T) for i in range(T))
        used = sum(R[t][i] * g.cost_cpu[i] for t in range(T) for i in range(T))
        objective = cpu + page
        costly = sum(R[t][i] for t in range(T) for i in range(T) if t != i and float(cpu_j[i, 0]) > 0)
        out.update(
            objective_j=objective,
            energy_cpu_j=cpu,
            energy_page_j=page,
            extra_energy=objective / baseline - 1.0,
            recomputations=sum(map(sum, R)) - T,
            recomputations_nonzero_cost=costly,  # the others recompute 0-FLOP nodes (the input)
            page_ins=sum(map(sum, MIn)),
            page_outs=sum(map(sum, MOut)),
            compute_time_used=used,
            compute_time_budget=runtime_budget,
            max_U=max(max(val(v) for v in row) for row in solver.U),
        )
    else:
        out["objective_j"] = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--poet-src", required=True, help="extracted POET checkout (has poet/poet_solver.py)")
    ap.add_argument("--time-limit", type=float, default=400.0, help="seconds per solve")
    ap.add_argument("--ram", action="append", default=None,
                    help="RAM budget, e.g. 3MB or 1400000 (repeatable; default 3MB and 1.4MB)")
    ap.add_argument("--runtime-ratio", type=float, default=7.6,
                    help="compute-time budget as a multiple of one plain pass (POET's runtime_budget)")
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--platform", default="a72")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--solver", action="append", default=None, help="highs | cbc (repeatable; default highs)")
    ap.add_argument("--threads", type=int, default=None, help="solver threads (default: the solver's own)")
    ap.add_argument("--msg", action="store_true", help="show the solver log")
    ap.add_argument("--info", action="store_true", help="print the graph summary only, solve nothing")
    args = ap.parse_args(argv)

    util, poet_solver, graph_builder = import_poet(args.poet_src)
    make_uuid_deterministic(graph_builder)
    import pulp as pl

    problem = build(util, args)
    _chipset, g, cpu_j, _pin, _pout = problem
    order = ",".join(g.node_names[i] for i in range(g.size))
    summary = {
        "peer": "poet",
        "info": True,
        "model": args.model,
        "platform": args.platform,
        "batch_size": args.batch_size,
        "T": g.size,
        "forward_nodes": len(g.vfwd),
        "edges": len(g.edge_list),
        "forward_activation_bytes": int(sum(g.cost_ram[i] for i in g.vfwd)),
        "all_outputs_bytes": int(sum(g.cost_ram.values())),
        "plain_peak_bytes": plain_peak_bytes(g),
        "parameter_bytes_not_counted": int(g.cost_ram_parameters),
        "plain_runtime": float(sum(g.cost_cpu.values())),
        "baseline_energy_j": float(cpu_j.sum()),
        "node_order_sha1": hashlib.sha1(order.encode()).hexdigest()[:12],
        "pulp": pl.__version__,
    }
    print(json.dumps(summary), flush=True)
    if args.info:
        return 0
    rams = [parse_bytes(r) for r in (args.ram or ["3MB", "1.4MB"])]
    for solver_name in args.solver or ["highs"]:
        for ram in rams:
            print(json.dumps(run_one(poet_solver, pl, problem, args, ram, solver_name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
