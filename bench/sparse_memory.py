"""Peak training SRAM of the paper's three int8 models, batch 1, 128x128: full update and
the paper's released sparse schemes, with and without operator reordering, beside the
paper's own figures.

    PYTHONPATH=src python bench/sparse_memory.py [--models mbv2-w0.35 ...] [--json-only]
        [--no-search] [--no-accuracy] [--train 2000] [--test 2000]

For each model (`from_tiny_training(..., num_classes=10)`, the paper's int8 weights and
scales, a new 10-way classifier) and each scheme (Full, and every scheme in
../shared/assets/tiny-training/schemes.json), `compile(..., quantize="int8")` with SGD
without momentum (as the paper's engine) and reports, in KB (1024 B):
- `reordered`: `prog.memory.peak_bytes` = the planned arena (every tensor at a fixed
  offset, best-fit packing, in-place reuse) + the trained weights held in SRAM (of a
  weight trained on some channels, those channels; the rest stays in flash), for the
  compiled order (each update applied as soon as its gradient exists, memory-aware node
  order, frozen expansion + depthwise convolutions fused);
- `plain`: the same accounting for the order without reordering: the backward graph in
  autodiff order with every update at the end (all gradients held until then), arena
  planned the same way;
- `flash`: the frozen int8 weights (read-only).
The paper's figures for the same models and resolution (full; sparse; sparse + reorder,
for a scheme it does not name) are printed under each model.

Searched schemes (unless --no-search): for each paper scheme, the budgeted search of
compile(update="auto", quantize="int8") with a budget equal to that scheme's reordered
peak (the same budget, in our engine's accounting), on the contribution table in
docs/results/contrib-<model>.json (made by bench/contribution.py), exact solver, one cache
of compiled pieces per model (`sparse.search_scheme`); the evolutionary search's summed
gain at the same budget is reported beside it.

Accuracy (unless --no-accuracy): top-1 on CIFAR-10 (seeded class-balanced subsets of each
split, --train / --test images, upsampled to 128x128) after fine-tuning each scheme with
the contribution analysis's trainer (`sparse.scheme_accuracies`: float32 PyTorch, the
table's epochs, batch, lr and momentum, the channels compile() trains), beside the
classifier alone; Full at a tenth of that lr, as bench/accuracy.py (at lr 1e-3 full
fine-tuning of this batch-norm-free network collapses).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch

import edgetrain as et
from edgetrain.data.assets import default_assets_dir
from edgetrain.ir import ram_inputs
from edgetrain.memory import plan_memory, trained_channel_bytes
from edgetrain.models import from_tiny_training
from edgetrain.sparse import ContributionTable, CostCache, FineTune, scheme_accuracies, search_scheme
from edgetrain.sparse.search import InfeasibleBudget

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

MODELS = ("mbv2-w0.35", "proxyless-w0.3", "mcunet-5fps")
RES, KB = 128, 1024
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
FULL_LR_FACTOR = 0.1  # bench/accuracy.py: Full fine-tunes at lr 1e-4 where the others use 1e-3


def schemes_for(model: str, table: dict) -> dict:
    out = {"full": et.Full()}
    for label, s in table["schemes"][model].items():
        out[label] = et.Sparse(bias_last=s["bias_last"], weights={int(k): v for k, v in s["weights"].items() if v})
    return out


def compile_int8(path, scheme):
    return et.compile(from_tiny_training(path, num_classes=10), (torch.zeros(1, 3, RES, RES),), update=scheme,
                      quantize="int8", optimizer=et.SGD(lr=0.01))


def measure(model: str, label: str, scheme, path, prog=None) -> dict:
    prog = prog if prog is not None else compile_int8(path, scheme)
    ram = ram_inputs(prog.stages["updates"])
    plain = plan_memory(prog.stages["updates"], ram, list(prog.trainable),
                        trained_channel_bytes(prog.trainable, prog.state))
    mem = prog.memory
    return {"model": model, "scheme": label, "reordered_kb": mem.peak_bytes / KB, "arena_kb": mem.arena_bytes / KB,
            "trainable_kb": mem.trainable_bytes / KB, "plain_kb": plain.peak_bytes / KB,
            "plain_arena_kb": plain.arena_bytes / KB, "flash_kb": mem.flash_bytes / KB,
            "peak_op": mem.peak_op, "fits_256kb_sram": mem.peak_bytes <= 256 * KB,
            "fits_1mb_flash": mem.flash_bytes <= 1024 * KB, "bias_last": getattr(scheme, "bias_last", None),
            "weights": {str(k): v for k, v in getattr(scheme, "weights", {}).items()}}


def searched(model: str, path, rows: list[dict], table: ContributionTable) -> list[dict]:
    """update="auto" at each paper scheme's reordered peak: the compiled program's row."""
    cache = CostCache(lambda scheme: compile_int8(path, scheme))
    out = []
    for r in [r for r in rows if r["scheme"] != "full"]:
        budget = round(r["reordered_kb"] * KB)
        t0 = time.perf_counter()
        try:
            prog, info = search_scheme(table, budget, cache, "exact")
        except InfeasibleBudget as err:
            out.append({"model": model, "scheme": f"searched @ {r['scheme']}", "error": str(err)})
            continue
        row = measure(model, f"searched @ {r['scheme']}", info.scheme, path, prog)
        row.update({"budget_kb": budget / KB, "predicted_gain": info.predicted_gain,
                    "predicted_peak_kb": info.predicted_peak / KB, "evolutionary_gain": info.evolutionary.gain,
                    "evolutionary_scheme": str(info.evolutionary.scheme), "search_s": time.perf_counter() - t0,
                    "compiles": info.compiles})
        out.append(row)
    return out


def accuracies(path, rows: list[dict], schemes: dict, table: ContributionTable, data) -> dict:
    """{row label: top-1} with the analysis trainer, plus "classifier only"."""
    meta = table.meta
    config = FineTune(epochs=meta["epochs"], batch=meta["batch"], lr=meta["lr"], momentum=meta["momentum"],
                      seed=meta["seed"], threads=meta.get("threads"))
    net = from_tiny_training(path, num_classes=10, seed=meta["seed"])
    runs = {"classifier only": et.Sparse()}
    runs.update({r["scheme"]: schemes[r["scheme"]] for r in rows if "error" not in r and r["scheme"] != "full"})
    acc = scheme_accuracies(net, runs, *data, config=config)
    if "full" in schemes:
        acc.update(scheme_accuracies(net, {"full": et.Full()}, *data,
                                     config=replace(config, lr=config.lr * FULL_LR_FACTOR)))
    return acc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--json-only", action="store_true")
    p.add_argument("--no-search", action="store_true", help="skip the searched schemes")
    p.add_argument("--no-accuracy", action="store_true", help="skip the top-1 of each scheme")
    p.add_argument("--train", type=int, default=2000, help="training images for the accuracy column")
    p.add_argument("--test", type=int, default=2000, help="test images for the accuracy column")
    args = p.parse_args(argv)
    assets = default_assets_dir()
    if assets is None:
        raise SystemExit("needs the shared assets (the paper's int8 models): set EDGETRAIN_ASSETS=DIR or put shared/assets beside the checkout")
    table = json.loads((assets / "tiny-training" / "schemes.json").read_text())
    data = None
    if not args.no_accuracy:
        from contribution import load_data  # bench/contribution.py: the analysis's data

        data = load_data(args.train, args.test, 0)
    rows = []
    for model in args.models:
        path = assets / "tiny-training" / f"{model}.pkl"
        schemes = schemes_for(model, table)
        mine = [measure(model, label, scheme, path) for label, scheme in schemes.items()]
        contrib = None
        if not args.no_search or not args.no_accuracy:
            contrib = ContributionTable.load(RESULTS / f"contrib-{model}.json")
        if not args.no_search:
            found = searched(model, path, mine, contrib)
            mine += found
            schemes.update({r["scheme"]: et.Sparse(bias_last=r["bias_last"],
                                                   weights={int(k): v for k, v in r["weights"].items()})
                            for r in found if "error" not in r})
        if not args.no_accuracy:
            acc = accuracies(path, mine, schemes, contrib, data)
            for r in mine:
                r["top1"] = acc.get(r["scheme"])
            mine.append({"model": model, "scheme": "classifier only", "top1": acc["classifier only"]})
        for r in mine:
            print(json.dumps(r), flush=True)
        rows += mine
    if args.json_only:
        return 0
    print("\n| model | scheme | plain (no reorder) | reordered | of which arena / trainable | flash | top-1 % |")
    print("|---|---|---:|---:|---|---:|---:|")
    for m in args.models:
        for r in (r for r in rows if r["model"] == m):
            top1 = "–" if r.get("top1") is None else f"{100 * r['top1']:.1f}"
            if "reordered_kb" not in r:
                print(f"| {m} | {r['scheme']} | {r.get('error', '')} | | | | {top1} |")
                continue
            name = r["scheme"] + (f": {r['bias_last']} biases, weights {r['weights']}" if "budget_kb" in r else "")
            print(f"| {m} | {name} | {r['plain_kb']:,.0f} | {r['reordered_kb']:,.0f} | "
                  f"{r['arena_kb']:,.0f} / {r['trainable_kb']:,.0f} | {r['flash_kb']:,.0f} | {top1} |")
        print(f"| {m} | *paper* | full {table['paper_peak_kb_full'][m]:,}, sparse {table['paper_peak_kb_sparse'][m]} "
              f"| sparse {table['paper_peak_kb_sparse_reorder'][m]} | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
