"""One contribution table computed serially, on a local Ray with 2 workers and (with
--cluster) on a running Ray cluster: the time each took and whether the tables are the same.

    PYTHONPATH=src python bench/scale_ray.py [--model mbv2-w0.35] [--train 400] [--test 400]
        [--last-layers 3] [--ratios 0.25 1.0] [--bias-ks 4 8] [--workers 2]
        [--ways serial local cluster] [--cluster HOST:PORT]

The analysis is bench/contribution.py's (the paper's int8 model on CIFAR-10 at 128x128,
float32 fine-tunes of 2 epochs, batch 8) on a reduced grid so that one run takes minutes.
Prints one JSON line per way, then a markdown row each; the tables are compared on every
measured figure (base top-1, each gain, stderr, weight base: not the seconds in meta).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contribution import MODELS, load_data  # noqa: E402

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


def figures(table) -> tuple:
    return (table.base_accuracy, table.bias_gains, table.weight_gains, table.stderr, table.weight_base)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mbv2-w0.35", choices=MODELS)
    p.add_argument("--train", type=int, default=400)
    p.add_argument("--test", type=int, default=400)
    p.add_argument("--last-layers", type=int, default=3)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.25, 1.0])
    p.add_argument("--bias-ks", type=int, nargs="+", default=[4, 8])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray")
    p.add_argument("--ways", nargs="+", choices=("serial", "local", "cluster"), default=["serial", "local"],
                   help="in this process, on a local Ray of --workers CPUs, on the cluster at --cluster")
    p.add_argument("--cluster", metavar="HOST:PORT", help="the address of a running Ray cluster (ray start --head)")
    args = p.parse_args(argv)
    if "cluster" in args.ways and not args.cluster:
        p.error("--ways cluster needs --cluster HOST:PORT")

    from edgetrain.data.assets import default_assets_dir
    from edgetrain.models import from_tiny_training
    from edgetrain.scale import RayExecutor
    from edgetrain.sparse import FineTune, analyze_contributions

    assets = default_assets_dir()
    if assets is None:
        raise SystemExit("needs the shared assets (the paper's int8 models and CIFAR-10): set EDGETRAIN_ASSETS=DIR")
    train, test = load_data(args.train, args.test, args.seed)
    model = from_tiny_training(assets / "tiny-training" / f"{args.model}.pkl", num_classes=10, seed=args.seed)
    config = FineTune(epochs=args.epochs, seed=args.seed)

    by_name = {"serial": ("serial", lambda: None),
               "local": (f"local Ray, {args.workers} workers", lambda: RayExecutor(num_cpus=args.workers)),
               "cluster": (f"Ray cluster at {args.cluster}", lambda: RayExecutor(address=args.cluster))}
    ways = [by_name[w] for w in args.ways]
    rows, tables = [], []
    for label, make in ways:
        executor = make()
        t0 = time.perf_counter()
        try:
            table = analyze_contributions(model, train, test, name=args.model, last=args.last_layers,
                                          ratios=args.ratios, bias_ks=args.bias_ks, config=config, executor=executor)
        finally:
            if executor is not None:
                executor.close()
        seconds = time.perf_counter() - t0
        tables.append(table)
        runs = 1 + len(args.bias_ks) + args.last_layers * len(args.ratios)
        row = {"way": label, "seconds": round(seconds, 1), "fine_tunes": runs,
               "same_table_as_first": figures(table) == figures(tables[0]),
               "base_top1": table.base_accuracy, "top": table.top(3)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print()
    ref = next((r for r in rows if r["way"] == "serial"), rows[0])
    print(f"| way | seconds | speed-up over {ref['way']} | table equal to the first |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['way']} | {r['seconds']:.0f} | {ref['seconds'] / r['seconds']:.2f}x | "
              f"{'yes' if r['same_table_as_first'] else 'NO'} |")
    return 0 if all(r["same_table_as_first"] for r in rows) else 1


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
