"""Peak training SRAM of the paper's three int8 models, batch 1, 128x128: full update and
the paper's released sparse schemes, with and without operator reordering, beside the
paper's own figures.

    PYTHONPATH=src python bench/sparse_memory.py [--models mbv2-w0.35 ...] [--json-only]

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
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

import torch

import edgetrain as et
from edgetrain.data.assets import default_assets_dir
from edgetrain.memory import plan_memory, trained_channel_bytes
from edgetrain.models import from_tiny_training
from edgetrain.passes.loss import LABEL
from edgetrain.passes.updates import STEP

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

MODELS = ("mbv2-w0.35", "proxyless-w0.3", "mcunet-5fps")
RES, KB = 128, 1024


def schemes_for(model: str, table: dict) -> dict:
    out = {"full": et.Full()}
    for label, s in table["schemes"][model].items():
        out[label] = et.Sparse(bias_last=s["bias_last"], weights={int(k): v for k, v in s["weights"].items() if v})
    return out


def measure(model: str, label: str, scheme, path) -> dict:
    net = from_tiny_training(path, num_classes=10)
    prog = et.compile(net, (torch.zeros(1, 3, RES, RES),), update=scheme, quantize="int8",
                      optimizer=et.SGD(lr=0.01))
    ram = set(prog.graph_inputs) | {LABEL, STEP}
    plain = plan_memory(prog.stages["updates"], ram, list(prog.trainable),
                        trained_channel_bytes(prog.trainable, prog.state))
    mem = prog.memory
    return {"model": model, "scheme": label, "reordered_kb": mem.peak_bytes / KB, "arena_kb": mem.arena_bytes / KB,
            "trainable_kb": mem.trainable_bytes / KB, "plain_kb": plain.peak_bytes / KB,
            "plain_arena_kb": plain.arena_bytes / KB, "flash_kb": mem.flash_bytes / KB,
            "peak_op": mem.peak_op, "fits_256kb_sram": mem.peak_bytes <= 256 * KB,
            "fits_1mb_flash": mem.flash_bytes <= 1024 * KB}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--json-only", action="store_true")
    args = p.parse_args(argv)
    assets = default_assets_dir()
    if assets is None:
        raise SystemExit("needs ../shared/assets (the paper's int8 models)")
    table = json.loads((assets / "tiny-training" / "schemes.json").read_text())
    rows = []
    for model in args.models:
        for label, scheme in schemes_for(model, table).items():
            r = measure(model, label, scheme, assets / "tiny-training" / f"{model}.pkl")
            print(json.dumps(r), flush=True)
            rows.append(r)
    if args.json_only:
        return 0
    print("\n| model | scheme | plain (no reorder) | reordered | of which arena / trainable | flash |")
    print("|---|---|---:|---:|---|---:|")
    for m in args.models:
        for r in (r for r in rows if r["model"] == m):
            print(f"| {m} | {r['scheme']} | {r['plain_kb']:,.0f} | {r['reordered_kb']:,.0f} | "
                  f"{r['arena_kb']:,.0f} / {r['trainable_kb']:,.0f} | {r['flash_kb']:,.0f} |")
        print(f"| {m} | *paper* | full {table['paper_peak_kb_full'][m]:,}, sparse {table['paper_peak_kb_sparse'][m]} "
              f"| sparse {table['paper_peak_kb_sparse_reorder'][m]} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
