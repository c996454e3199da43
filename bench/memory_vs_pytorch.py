"""Peak training memory of edgetrain's compiled program vs PyTorch eager: same model, same
weights, same trained parameters, same step, measured in one run.

    PYTHONPATH=src python bench/memory_vs_pytorch.py [--model mbv2-w0.35] [--size 128]
                                                     [--classes 10] [--json-only]

A zoo model (`et.models.get(model, num_classes=classes)`, deterministic weights), input
1x3xSIZExSIZE float32 (seed 0), batch 1, one label (seed 0), cross-entropy, one SGD step
(lr 0.01), for the update schemes Full(), LastK(1) and BiasOnly(). For each:

- edgetrain: `prog.memory` (its static plan; `peak_bytes` = `arena_bytes` +
  `trainable_bytes`, the arena being at least the live peak `activation_bytes`), and one
  `prog.step` to show it runs, whose loss is reported;
- PyTorch eager: `torch_memory.measure_torch_step` on a fresh copy of the same model,
  training exactly the tensors in `prog.trainable`: the peak of live tensor storage
  created during the step (input and label held throughout, activations, saved tensors,
  gradients, temporaries), metered op by op with a TorchDispatchMode, plus the same
  trained weights. Its first-step loss must match edgetrain's (identical weights).

Prints one JSON line per scheme, then (unless --json-only) a markdown table, KB = 1024 B.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import edgetrain as et  # noqa: E402
from torch_memory import measure_torch_step  # noqa: E402

# noise from torch.export inside et.compile (pyproject filters the same one for pytest)
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

SCHEMES = {"Full": et.Full, "LastK(1)": lambda: et.LastK(1), "BiasOnly": et.BiasOnly}
SEED, LR = 0, 0.01


def kb(b: int) -> str:
    return f"{b / 1024:,.1f} KB"


def make_input(model: str, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's example input at `size` (images: 1x3xSIZExSIZE, N(0, 1), seed 0) and one
    label drawn from a seeded generator."""
    x = et.models.example_input(model, batch=1, seed=SEED)
    if x.ndim == 4:
        if x.shape[-2:] != (size, size):
            x = torch.randn((1, x.shape[1], size, size), generator=torch.Generator().manual_seed(SEED))
    elif size != x.shape[-1]:
        raise SystemExit(f"--size applies to image models; {model} takes input of shape {tuple(x.shape)}")
    y = torch.randint(0, classes, (1,), generator=torch.Generator().manual_seed(SEED))
    return x, y


def run_scheme(args, label: str) -> dict:
    x, y = make_input(args.model, args.size, args.classes)
    prog = et.compile(et.models.get(args.model, num_classes=args.classes, seed=SEED), (x,), loss="cross_entropy",
                      update=SCHEMES[label](), optimizer=et.SGD(lr=LR))
    partial = [p for p, sel in prog.trainable.items() if sel is not None]
    if partial:  # PyTorch cannot train part of a tensor: it would train (and count) all of it
        print(f"note: {label} trains some channels of {partial}; PyTorch trains those tensors whole", file=sys.stderr)
    model = et.models.get(args.model, num_classes=args.classes, seed=SEED)
    ref = model.state_dict()
    start = prog.state_dict()
    diff = max(float((start[k] - ref[k]).abs().max()) for k in start if k in ref and ref[k].is_floating_point())
    assert diff == 0.0, f"edgetrain's and PyTorch's starting weights differ by {diff}"
    loss = prog.step(x, y)
    pt = measure_torch_step(model, x, y, set(prog.trainable), lr=LR)
    mem = prog.memory
    return {"bench": "memory_vs_pytorch", "model": args.model, "num_classes": args.classes,
            "input": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""), "batch": x.shape[0],
            "update": label, "trained_tensors": len(prog.trainable),
            "edgetrain_peak_bytes": mem.peak_bytes, "edgetrain_activation_bytes": mem.activation_bytes,
            "edgetrain_trainable_bytes": mem.trainable_bytes, "edgetrain_frozen_bytes": mem.frozen_bytes,
            "edgetrain_weight_bytes": mem.weight_bytes, "edgetrain_peak_op": mem.peak_op,
            "torch_peak_bytes": pt["peak_bytes"], "torch_activation_bytes": pt["activation_bytes"],
            "torch_trained_weights_bytes": pt["trained_weights_bytes"], "torch_weights_bytes": pt["weights_bytes"],
            "torch_peak_op": pt["peak_op"], "torch_step_ms": round(pt["step_ms"], 3),
            "ratio": round(pt["peak_bytes"] / mem.peak_bytes, 4),
            "activation_ratio": round(pt["activation_bytes"] / mem.activation_bytes, 4),
            "edgetrain_loss": loss, "torch_loss": pt["first_loss"],
            "loss_abs_diff": abs(loss - pt["first_loss"]), "torch_version": torch.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mbv2-w0.35", help="zoo model name (default mbv2-w0.35)")
    ap.add_argument("--size", type=int, default=128, help="input height and width (default 128)")
    ap.add_argument("--classes", type=int, default=10, help="num_classes of the model (default 10)")
    ap.add_argument("--json-only", action="store_true", help="print only the JSON lines")
    args = ap.parse_args(argv)
    torch.manual_seed(SEED)
    rows = []
    for label in SCHEMES:
        row = run_scheme(args, label)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if not args.json_only:
        r0 = rows[0]
        print(f"\n{args.model}, num_classes={args.classes}, input {'x'.join(map(str, r0['input']))} {r0['dtype']}, "
              f"batch {r0['batch']}, cross-entropy, one SGD step (lr {LR}); first-step loss edgetrain "
              f"{r0['edgetrain_loss']:.6f} vs PyTorch {r0['torch_loss']:.6f}; KB = 1024 B\n")
        print("| update | edgetrain peak | of which activations | trained weights | PyTorch peak "
              "| of which activations | PyTorch / edgetrain |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['update']} | {kb(r['edgetrain_peak_bytes'])} | {kb(r['edgetrain_activation_bytes'])} "
                  f"| {kb(r['edgetrain_trainable_bytes'])} | {kb(r['torch_peak_bytes'])} "
                  f"| {kb(r['torch_activation_bytes'])} | {r['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
