"""Top-1 accuracy after on-device fine-tuning from one pretrained model: float32 vs int8
without QAS vs int8 with QAS, for the same update scheme, data, order and epochs.

    PYTHONPATH=src python bench/accuracy.py --task cifar10 [--train 5000] [--test 2000]
                                            [--epochs 1] [--seeds 0] [--jobs 2]
    PYTHONPATH=src python bench/accuracy.py --task fashion [--train 10000] [--test 2000] ...
        [--schemes SCHEME ...] [--precisions "int8 QAS" "int8 QAS integer" ...]

Tasks:
- cifar10: the paper's int8 ImageNet-pretrained MobileNetV2-0.35
  (../shared/assets/tiny-training/mbv2-w0.35.pkl, `from_tiny_training(num_classes=10)`: a
  new classifier from the seed) on CIFAR-10 (../shared/assets/cifar10-jpg.zip, a seeded
  class-balanced subset of each split), images upsampled to 128x128 as in the paper;
  batch 8, SGD lr 0.001 (Full: 1e-4, as 1e-3 collapses this batch-norm-free network in
  PyTorch too), momentum 0.9. Float32 runs train the float model whose weights are the
  published int8 weights times their scales.
  Schemes: Full (float32 only), LastK(1) (the classifier), BiasOnly, and the paper's
  sparse scheme for 99 KB (`edgetrain.app.demo.MBV2_SPARSE_99KB`).
- fashion: DigitNet pretrained on MNIST (weights in the package), batch norm folded into its
  convolutions (as on the device: the float32 runs then train the same tensors as the
  int8 ones), on Fashion-MNIST (Debian `dataset-fashion-mnist`; first N of each split),
  batch 16, lr 0.005, momentum 0.9.
  Schemes: Full, LastK(1), BiasOnly.

int8 runs compile with quantize="int8" (batch norm folded, calibration on the first 64
training images for scales not published) and train with integer SGD (stochastic
rounding); QAS on or off is the only difference between them. "int8 QAS integer" is int8 with QAS
and backward="integer": gradients, loss and SGD in integers only (quantize/integer_backward.py). Every run of one seed sees
the same images in the same order.

Prints one JSON line per run, then (unless --json-only) a markdown table of the mean
top-1 over seeds (and each seed's value).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
warnings.filterwarnings("ignore", category=RuntimeWarning)


@dataclass(frozen=True)
class Task:
    batch: int
    lr: float
    momentum: float
    train: int
    test: int
    schemes: tuple[str, ...]
    int8_schemes: tuple[str, ...]
    lr_by_scheme: tuple[tuple[str, float], ...] = ()

    def lr_for(self, scheme_name: str) -> float:
        return dict(self.lr_by_scheme).get(scheme_name, self.lr)


TASKS = {
    "cifar10": Task(8, 0.001, 0.9, 5000, 2000, ("Full", "LastK(1)", "BiasOnly", "Sparse(paper 99KB)"),
                    ("LastK(1)", "BiasOnly", "Sparse(paper 99KB)"), (("Full", 1e-4),)),
    "fashion": Task(16, 0.005, 0.9, 10000, 2000, ("Full", "LastK(1)", "BiasOnly"), ("Full", "LastK(1)", "BiasOnly")),
}
#: "int8 QAS integer": int8 with QAS and backward="integer" (the backward and the update in integers only)
PRECISIONS = ("float32", "int8 no QAS", "int8 QAS", "int8 QAS integer")


def scheme(name: str):
    import edgetrain as et
    from edgetrain.app.demo import MBV2_SPARSE_99KB

    return {"Full": et.Full(), "LastK(1)": et.LastK(1), "BiasOnly": et.BiasOnly(),
            "Sparse(paper 99KB)": et.Sparse(**MBV2_SPARSE_99KB)}[name]


def fold_batchnorm_modules(model):
    """A copy of `model` with each BatchNorm2d that follows a Conv2d in an nn.Sequential
    folded into the convolution (which gains a bias) and replaced by nn.Identity: the float
    model the int8 program trains (a device has no batch norm), so that a float32 scheme
    trains the same tensors as the int8 one (a conv's bias, not a BN's scale and shift)."""
    import copy

    import torch
    from torch import nn

    model = copy.deepcopy(model).eval()
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            conv, bn = seq[i], seq[i + 1]
            if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)):
                continue
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            folded = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                               conv.dilation, conv.groups, bias=True)
            with torch.no_grad():
                folded.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
                bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
                folded.bias.copy_(bn.bias + (bias - bn.running_mean) * scale)
            seq[i], seq[i + 1] = folded, nn.Identity()
    return model


_DATA: dict = {}


def data(task: str, n_train: int, n_test: int, seed: int):
    """(model factory, x_train, y_train, x_test, y_test), cached per process."""
    key = (task, n_train, n_test, seed)
    if key in _DATA:
        return _DATA[key]
    if task == "cifar10":
        from edgetrain.data.assets import default_assets_dir
        from edgetrain.data.cifar import load_cifar10
        from edgetrain.app.demo import MBV2_FILE, to_mcu_input
        from edgetrain.models import from_tiny_training

        assets = default_assets_dir()
        if assets is None:
            raise SystemExit("cifar10 needs the shared assets (the paper's models and CIFAR-10): set EDGETRAIN_ASSETS=DIR or put shared/assets beside the checkout")
        xtr, ytr = load_cifar10("train", n_train, seed=seed)
        xte, yte = load_cifar10("test", n_test, seed=seed)
        path = assets / MBV2_FILE
        out = (lambda: from_tiny_training(path, num_classes=10, seed=seed), to_mcu_input(xtr), ytr,
               to_mcu_input(xte), yte)
    else:
        from edgetrain.data import load_fashion_mnist
        from edgetrain.app.demo import normalise, pretrained_digitnet

        xtr, ytr = load_fashion_mnist("train", n_train)
        xte, yte = load_fashion_mnist("test", n_test)
        out = (lambda: fold_batchnorm_modules(pretrained_digitnet()), normalise(xtr), ytr, normalise(xte), yte)
    _DATA.clear()
    _DATA[key] = out
    return out


def run(job: dict) -> dict:
    import torch

    import edgetrain as et
    from edgetrain.program import NonFiniteLossError

    torch.set_num_threads(1)
    t = TASKS[job["task"]]
    make_model, xtr, ytr, xte, yte = data(job["task"], job["train"], job["test"], job["seed"])
    int8 = job["precision"] != "float32"
    t0 = time.perf_counter()
    prog = et.compile(make_model(), (torch.from_numpy(xtr[:t.batch]),), loss="cross_entropy",
                      update=scheme(job["scheme"]), quantize="int8" if int8 else None,
                      optimizer=et.SGD(lr=job.get("lr") or t.lr_for(job["scheme"]), momentum=t.momentum,
                                       qas=job["precision"].startswith("int8 QAS"), seed=job["seed"]),
                      calibration=[xtr[:64]] if int8 else None,
                      backward="integer" if job["precision"] == "int8 QAS integer" else "float")

    def top1():
        return float((prog.predict(xte).argmax(1) == yte).mean())

    before = top1()
    rng = np.random.default_rng(job["seed"])
    steps, diverged, losses = len(xtr) // t.batch, None, []
    t1 = time.perf_counter()
    for epoch in range(job["epochs"]):
        order = rng.permutation(len(xtr))
        for s in range(steps):
            idx = order[s * t.batch:(s + 1) * t.batch]
            try:
                losses.append(prog.step(xtr[idx], ytr[idx]))
            except NonFiniteLossError as err:
                diverged = str(err)
                break
        if diverged:
            break
    train_s = time.perf_counter() - t1
    after = top1()
    return {**job, "batch": t.batch, "lr": job.get("lr") or t.lr_for(job["scheme"]), "momentum": t.momentum,
            "before": before, "after": after,
            "steps": len(losses), "diverged": diverged, "final_loss": float(np.mean(losses[-50:])),
            "train_s_per_image": train_s / max(1, len(losses) * t.batch), "peak_kb": prog.memory.peak_bytes / 1024,
            "total_s": time.perf_counter() - t0}


def table(rows: list[dict], task: str) -> str:
    t = TASKS[task]
    out = ["| update scheme | lr | float32 | int8 without QAS | int8 with QAS | int8 with QAS, integer backward | "
           "peak KB (float32 / int8 / integer) |", "|---|---|---|---|---|---|---|"]

    def cell(scheme_name, precision):
        rs = [r for r in rows if r["scheme"] == scheme_name and r["precision"] == precision]
        if not rs:
            return "–", None
        vals = [r["after"] for r in rs]
        text = f"{100 * np.mean(vals):.1f}"
        if len(vals) > 1:
            text += " (" + ", ".join(f"{100 * v:.1f}" for v in vals) + ")"
        if any(r["diverged"] for r in rs):
            text += " diverged"
        return text, rs[0]["peak_kb"]

    for s in t.schemes:
        cells = [cell(s, p) for p in PRECISIONS]
        peaks = " / ".join(f"{c[1]:,.0f}" for c in (cells[0], cells[2], cells[3]) if c[1] is not None)
        lrs = sorted({r["lr"] for r in rows if r["scheme"] == s})
        out.append(f"| {s} | {', '.join(f'{v:g}' for v in lrs)} | " + " | ".join(c[0] for c in cells) + f" | {peaks} |")
    before = sorted({(r['precision'] != 'float32', round(100 * r['before'], 1)) for r in rows})
    out.append("")
    out.append("top-1 % on the test images after fine-tuning (mean over seeds; each seed in brackets). "
               "Before fine-tuning: " + ", ".join(f"{'int8' if q else 'float32'} {b}" for q, b in before) + ".")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--train", type=int, help="training images (default: the task's)")
    p.add_argument("--test", type=int, help="test images (default: the task's)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--schemes", nargs="+", help="only these of the task's schemes")
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, help="only these (default: all)")
    p.add_argument("--lr", type=float, help="learning rate for every run (default: the task's, per scheme)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="runs in parallel (processes)")
    p.add_argument("--json-only", action="store_true")
    p.add_argument("--table-from", nargs="+", metavar="LOG",
                   help="print the table of the JSON lines in these files (earlier runs) instead of running")
    args = p.parse_args(argv)
    t = TASKS[args.task]
    if args.table_from:
        latest = {}  # a later run of the same scheme, precision and seed replaces an earlier one
        for f in args.table_from:
            for r in (json.loads(line) for line in open(f) if line.startswith("{")):
                if r["task"] == args.task:
                    latest[r["scheme"], r["precision"], r["seed"]] = r
        print(table(list(latest.values()), args.task))
        return 0
    jobs = [{"task": args.task, "scheme": s, "precision": prec, "seed": seed, "epochs": args.epochs,
             "train": args.train or t.train, "test": args.test or t.test, "lr": args.lr}
            for seed in args.seeds for s in t.schemes if not args.schemes or s in args.schemes
            for prec in (PRECISIONS if s in t.int8_schemes else PRECISIONS[:1])
            if not args.precisions or prec in args.precisions]
    rows = []
    with get_context("spawn").Pool(args.jobs) as pool:
        for r in pool.imap_unordered(run, jobs):
            print(json.dumps(r), flush=True)
            rows.append(r)
    if not args.json_only:
        print()
        print(table(rows, args.task))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
