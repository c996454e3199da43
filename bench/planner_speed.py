"""Speed of the compiler's planners on the instances the tests check for correctness (speed is
measured here, never asserted in a test): the arena planners on 3,000 random lifetimes,
reorder_for_memory on a 4,000-node training chain and on mbv2-w0.35's training graph, the
exact sparse-update search on a realistic 50-layer instance, and host calibration.
Prints one JSON line (medians of --repeats runs, seconds) and a table row.

    python bench/planner_speed.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' instance builders


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    import edgetrain as et
    from edgetrain.devices.calibrate import calibrate_host
    from edgetrain.ir import ram_inputs
    from edgetrain.memory.arena import plan_arena, plan_arena_first_fit_in_order
    from edgetrain.passes import apply_updates_early
    from edgetrain.passes.reorder import reorder_for_memory
    from edgetrain.sparse.search import solve_exact
    from tests.memory.test_arena import many_lifetimes
    from tests.sparse.test_search import realistic

    lts = many_lifetimes()
    model = et.models.get("mbv2-w0.35", num_classes=10)
    prog = et.compile(model, (torch.randn(1, 3, 64, 64),), update=et.Full())
    g = apply_updates_early(prog.stages["updates"])
    ram = ram_inputs(g)
    groups = realistic()
    with tempfile.TemporaryDirectory() as d:
        out = {
            "plan_arena_3000": _median(lambda: plan_arena(lts), args.repeats),
            "first_fit_3000": _median(lambda: plan_arena_first_fit_in_order(lts), args.repeats),
            "reorder_mbv2_full": _median(lambda: reorder_for_memory(g, ram), args.repeats),
            "solve_exact_realistic": _median(lambda: solve_exact(groups, 128 * 1024), args.repeats),
            "calibrate_host_0.2s": _median(lambda: calibrate_host(seconds=0.2, directory=d), 1),
        }
    print(json.dumps({"bench": "planner_speed", "repeats": args.repeats, "seconds": out}))
    print("| " + " | ".join(out) + " |")
    print("| " + " | ".join(f"{v:.3f} s" for v in out.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
