"""Contribution analysis of the paper's three int8 models on CIFAR-10 at 128x128, and the
budgeted search (update="auto") on the result.

    PYTHONPATH=src python bench/contribution.py [--models mbv2-w0.35 ...] [--train 2000] [--test 2000]
        [--epochs 2] [--lr 0.001] [--batch 8] [--seed 0] [--last-layers 20] [--budgets 128KB 160KB]
        [--ray [ADDRESS]] [--results DIR]

For each model (`from_tiny_training(..., num_classes=10, seed)`: the paper's ImageNet
weights, a new classifier) `edgetrain.sparse.analyze_contributions` fine-tunes, in float32
PyTorch, the classifier alone (the baseline) and the classifier plus one piece: the biases
of the last k layers (k every 4 up to twice the analysed layers) or one analysed layer's
weights at 1/8, 1/4, 1/2 or all of its channels (the channels compile(quantize="int8")
trains), the latter over a bias-only update (the bias depth with the largest gain, as in the
paper: --weight-base). Data: a seeded class-balanced subset of each CIFAR-10 split, upsampled to
128x128. The table goes to docs/results/contrib-<model>.json.

With --budgets, the search of `compile(update="auto", budget=Budget(sram=B),
quantize="int8", contributions=table)` (SGD without momentum, as the paper's engine) for
each budget, sharing one cache of compiled pieces across budgets
(`sparse.search_scheme`), and the chosen scheme's real top-1 with the same trainer
beside the table's prediction.

With --ray, each fine-tune (of the analysis and of the chosen schemes' top-1) is a Ray task:
on a local Ray using every core, or on the cluster at ADDRESS (`ray start --head`); the
table is the same bit for bit (docs/scale.md). With --results DIR, each fine-tune is
appended to DIR/contrib-<model>.jsonl as it finishes and a rerun skips those already there.

Prints one JSON line per model (and per budget), then a markdown summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

MODELS = ("mbv2-w0.35", "proxyless-w0.3", "mcunet-5fps")
RES, KB = 128, 1024
OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
TOP = 8  # options listed per model


def load_data(n_train: int, n_test: int, seed: int):
    from edgetrain.data import load_cifar10
    from edgetrain.app.demo import to_mcu_input

    xtr, ytr = load_cifar10("train", n_train, seed=seed)
    xte, yte = load_cifar10("test", n_test, seed=seed)
    return (to_mcu_input(xtr, RES), ytr), (to_mcu_input(xte, RES), yte)


def analyse(name: str, path: Path, train, test, args):
    from edgetrain.models import from_tiny_training
    from edgetrain.sparse import FineTune, analyze_contributions

    model = from_tiny_training(path, num_classes=10, seed=args.seed)
    config = FineTune(epochs=args.epochs, batch=args.batch, lr=args.lr, momentum=args.momentum, seed=args.seed,
                      threads=args.threads)
    t0 = time.perf_counter()

    def progress(label, top1):
        print(f"  {name}: {label}: top-1 {100 * top1:.1f}% ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)

    return analyze_contributions(model, train, test, name=name, last=args.last_layers, config=config,
                                 bias_ks=args.bias_ks, weight_base=args.weight_base, meta={"dataset": "cifar10", "resolution": RES},
                                 progress=progress, executor=args.executor, results=results_file(args, name))


def results_file(args, name: str):
    return None if args.results is None else args.results / f"contrib-{name}.jsonl"


def search(name: str, path: Path, table, budgets, train, test, args) -> list[dict]:
    import edgetrain as et
    from edgetrain.models import from_tiny_training
    from edgetrain.sparse import CostCache, FineTune, scheme_accuracies, search_scheme
    from edgetrain.sparse.search import InfeasibleBudget

    model = from_tiny_training(path, num_classes=10, seed=args.seed)

    def compile_scheme(scheme):  # what compile(update="auto", quantize="int8", optimizer=...) compiles
        return et.compile(model, (torch.zeros(1, 3, RES, RES),), update=scheme, quantize="int8",
                          optimizer=et.SGD(lr=0.01))

    cache = CostCache(compile_scheme)  # one per model: each piece is compiled once for all budgets
    rows, chosen = [], {}
    for b in budgets:
        row = {"model": name, "budget": b}
        t0 = time.perf_counter()
        try:
            _, s = search_scheme(table, et.Budget(sram=b).sram, cache, args.search)
        except InfeasibleBudget as err:
            rows.append({**row, "error": str(err)})
            continue
        chosen[b] = s.scheme
        rows.append({**row, "scheme": {"bias_last": s.scheme.bias_last, "weights": s.scheme.weights},
                     "predicted_gain": s.predicted_gain, "predicted_top1": s.predicted_accuracy,
                     "predicted_peak_kb": s.predicted_peak / KB, "peak_kb": s.peak / KB,
                     "base_peak_kb": s.base_peak / KB, "exact_gain": s.exact.gain,
                     "exact_s": s.exact.seconds, "evolutionary_gain": s.evolutionary.gain,
                     "evolutionary_s": s.evolutionary.seconds, "rounds": len(s.rounds),
                     "compiles": s.compiles, "search_s": time.perf_counter() - t0})
    if chosen and not args.no_accuracy:
        config = FineTune(epochs=args.epochs, batch=args.batch, lr=args.lr, momentum=args.momentum, seed=args.seed,
                          threads=args.threads)
        acc = scheme_accuracies(model, chosen, train, test, config=config, executor=args.executor,
                                results=results_file(args, name))
        for r in rows:
            if r["budget"] in acc:
                r["top1"] = acc[r["budget"]]
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--train", type=int, default=2000, help="training images")
    p.add_argument("--test", type=int, default=2000, help="test images")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--last-layers", type=int, default=20, help="analyse the weights of this many last layers")
    p.add_argument("--bias-ks", type=int, nargs="+", help="bias depths k (default: every 4 up to 2x --last-layers)")
    p.add_argument("--weight-base", type=lambda v: v if v == "best" else int(v), default="best",
                   help="weight gains over training the biases of this many last layers "
                        "('best': the analysed depth with the largest gain; 0: over the classifier alone)")
    p.add_argument("--budgets", nargs="*", default=[], help="run update='auto' at these SRAM budgets, e.g. 128KB")
    p.add_argument("--search", choices=("exact", "evolutionary"), default="exact")
    p.add_argument("--no-accuracy", action="store_true", help="with --budgets: skip the chosen schemes' top-1")
    p.add_argument("--from-json", action="store_true", help="reuse docs/results/contrib-<model>.json")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run the fine-tunes as Ray tasks: on a local Ray, or on the cluster at ADDRESS (HOST:PORT)")
    p.add_argument("--results", type=Path, metavar="DIR",
                   help="append each fine-tune to DIR/contrib-<model>.jsonl as it finishes; a rerun skips those")
    args = p.parse_args(argv)
    args.executor = None
    if args.ray is not None:
        from edgetrain.scale import RayExecutor
        args.executor = RayExecutor(address=None if args.ray == "local" else args.ray)

    from edgetrain.data.assets import default_assets_dir
    from edgetrain.sparse import ContributionTable

    assets = default_assets_dir()
    if assets is None:
        raise SystemExit("needs the shared assets (the paper's int8 models and CIFAR-10): set EDGETRAIN_ASSETS=DIR or put shared/assets beside the checkout")
    t0 = time.perf_counter()
    train, test = load_data(args.train, args.test, args.seed)
    print(json.dumps({"data_s": round(time.perf_counter() - t0, 1), "train": len(train[1]), "test": len(test[1])}))
    summary = []
    for name in args.models:
        path = assets / "tiny-training" / f"{name}.pkl"
        out = args.out / f"contrib-{name}.json"
        if args.from_json:
            table = ContributionTable.load(out)
        else:
            table = analyse(name, path, train, test, args)
            table.save(out)
        print(json.dumps({"model": name, "base_top1": table.base_accuracy, "seconds": table.meta.get("seconds"),
                          "top": table.top(TOP), "table": str(out)}), flush=True)
        summary.append(f"| {name} | {100 * table.base_accuracy:.1f} | {table.meta.get('seconds')} | "
                       + ", ".join(f"{d} {100 * g:+.1f}" for d, g in table.top(TOP)) + " |")
        for r in search(name, path, table, args.budgets, train, test, args):
            print(json.dumps(r), flush=True)
            if "error" in r:
                summary.append(f"| {name} @ {r['budget']} | – | – | {r['error']} |")
            else:
                acc = f"real top-1 {100 * r['top1']:.1f}, " if "top1" in r else ""
                summary.append(f"| {name} @ {r['budget']} | {acc}summed gain {100 * r['predicted_gain']:+.1f} | "
                               f"{r['search_s']:.0f} | {r['scheme']}: peak {r['peak_kb']:.1f} KB (predicted "
                               f"{r['predicted_peak_kb']:.1f}), gain exact {100 * r['exact_gain']:+.1f} / "
                               f"evolutionary {100 * r['evolutionary_gain']:+.1f} |")
    print()
    print("| model | top-1 % (classifier only) | seconds | largest gains (points of top-1) |")
    print("|---|---|---|---|")
    print("\n".join(summary))
    if args.executor is not None:
        args.executor.close()
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
