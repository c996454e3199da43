"""Peak training memory of edgetrain's compiled program vs PyTorch eager, same model,
same trained parameters, same step, measured in one run.

    python bench/memory_vs_pytorch.py [--model mbv2-w0.35] [--classes 10] [--json-only]

Both peaks are (activations + gradients + temporaries alive at the worst moment of one
training step, batch 1) + the trained weights, which must sit in RAM. edgetrain's figure
is its static plan, which the reference runtime's own byte count equals (tests check it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import edgetrain as et  # noqa: E402
from torch_memory import measure_torch_step  # noqa: E402

SCHEMES = {"Full": et.Full(), "LastK(1)": et.LastK(1), "BiasOnly": et.BiasOnly()}


def kb(b: int) -> str:
    return f"{b / 1024:,.0f} KB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mbv2-w0.35")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for label, scheme in SCHEMES.items():
        model = et.models.get(args.model, num_classes=args.classes)
        x = et.models.example_input(args.model)
        y = torch.tensor([1])
        prog = et.compile(model, (x,), update=scheme, optimizer=et.SGD(lr=0.01))
        loss = prog.step(x, y)
        pt = measure_torch_step(et.models.get(args.model, num_classes=args.classes), x, y, set(prog.trainable))
        row = {"bench": "memory_vs_pytorch", "model": args.model, "classes": args.classes,
               "input": list(x.shape), "update": label,
               "edgetrain_peak_bytes": prog.memory.peak_bytes,
               "edgetrain_activation_bytes": prog.memory.activation_bytes,
               "trained_weight_bytes": prog.memory.trainable_bytes,
               "torch_peak_bytes": pt["peak_bytes"], "torch_activation_bytes": pt["activation_bytes"],
               "ratio": round(pt["peak_bytes"] / prog.memory.peak_bytes, 3),
               "edgetrain_loss": loss, "torch_loss": pt["first_loss"]}
        rows.append(row)
        print(json.dumps(row))
    if not args.json_only:
        print(f"\n{args.model}, {args.classes} classes, input {rows[0]['input']}, float32, one SGD step\n")
        print("| update | edgetrain peak | of which activations | trained weights | PyTorch peak "
              "| of which activations | PyTorch / edgetrain |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['update']} | {kb(r['edgetrain_peak_bytes'])} | {kb(r['edgetrain_activation_bytes'])} "
                  f"| {kb(r['trained_weight_bytes'])} | {kb(r['torch_peak_bytes'])} "
                  f"| {kb(r['torch_activation_bytes'])} | {r['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
