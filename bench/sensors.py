"""Sensor learning on a Cortex-M4 (issue 31): a 1-D CNN and a GRU, pretrained in PyTorch on
half of a UCR/UEA set's classes, fine-tuned on all of them by edgetrain in int8 with QAS and a
sparse update searched under an SRAM budget, emitted as Cortex-M4 firmware and run under QEMU.

    PYTHONPATH=src python bench/sensors.py [--sets BasicMotions PLAID] [--models cnn gru]
        [--budget 64KB] [--epochs 10] [--lr LR] [--seed 0] [--firmware-steps 8] [--data DIR]
        [--backward float|integer] [--finetune-seeds K]

--backward integer runs edgetrain's int8 side with backward="integer" (gradients, loss and SGD
in integers only) everywhere it runs: the search, the lr / headroom choice, the firmware and the
fine-tune.

Per (set, model):
1. data: the set's _TRAIN/_TEST split (`edgetrain.data.timeseries.load_ts`; the sktime 1.2.0
   wheel's files, `pip install --no-deps sktime==1.2.0`, or --data DIR), each dimension
   z-scored with the training split's mean and std; PLAID's variable-length currents
   (100..1344 samples) are cropped/padded to PLAID_LENGTH;
2. pretraining: PyTorch float32 Adam on the training cases of the first half of the classes
   (the model's head already has every class): "before" is its top-1 on the whole test split;
3. the analysis learning rate: of LR_GRID, the one whose classifier-only fine-tune (float32
   PyTorch, the part every sparse scheme trains) scores the best top-1 on a held-out quarter of
   the training split (ties: the smaller lr; never the test split); contribution analysis
   (`et.sparse.analyze_contributions`, float32 PyTorch fine-tunes at batch 1, at that lr) on
   the other three quarters, scored on that held-out quarter;
4. `et.compile(update="auto", budget=Budget(sram=B), quantize="int8", optimizer=SGD(qas=True))`
   with that table, calibrated on CALIBRATION_CASES of the three fitting quarters;
5. each side's fine-tuning learning rate (unless --lr), chosen as a user would, by its own
   training: of LR_GRID, the one whose fine-tune of the chosen scheme on the three quarters
   scores the best top-1 on the held-out quarter (ties: the smaller lr): edgetrain's int8
   program by its own int8 training, PyTorch float32 by its own (`choose_lrs`). One lr for both
   sides does not fit both: int8 weights live on the per-channel scale of the pretrained
   weights, so an lr at which float32 weights grow far beyond that range saturates them. The
   int8 side chooses its `int8_headroom` with its lr, of HEADROOM_GRID (ties: the smaller
   headroom, then the smaller lr): the trained layers' weight scales and output ranges that
   many times wider, room for them to grow;
6. Cortex-M4 firmware of the int8 program at its lr trained on the first --firmware-steps
   training cases under QEMU; its losses are compared, as text, with the host C build's;
7. fine-tuning on every training case, batch 1, --epochs epochs, the case order of
   `numpy.random.default_rng(seed).permutation` per epoch: edgetrain's int8 program (the
   numpy reference runner) and, as the peer, PyTorch float32 SGD on exactly the same
   parameters and channels (`prog.trainable`; `et.sparse.FineTuner`), same data, same order.
Prints one JSON line per row, then a markdown table.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

warnings.filterwarnings("ignore", message=r".*were assigned during export.*")  # nn.GRU's _flat_weights

SETS = ("BasicMotions", "PLAID")
MODELS = ("cnn", "gru")
KB = 1024
#: PLAID's currents are 100..1344 samples at 30 kHz (the longest pads the GRU's unrolled graph
#: to 1344 steps): the first 500 samples hold ~8 mains cycles, enough to tell appliances apart
PLAID_LENGTH = 500
#: pretraining: Adam on the first half of the classes (PyTorch float32)
PRETRAIN_EPOCHS, PRETRAIN_LR, PRETRAIN_BATCH = 60, 3e-3, 8
#: the contribution analysis scores on this share of the training split, held out
VALIDATION_SHARE = 0.25
CALIBRATION_CASES = 16
#: the GRU reads every GRU_POOL-th averaged sample: BasicMotions' 100 steps become 50
GRU_POOL, GRU_HIDDEN = 2, 32
CNN_WIDTH = 32
#: learning rates tried (SGD, batch 1; QAS makes the int8 program's step the same as float's), chosen
#: per (set, model) and per side on the held-out quarter of the training split (`choose_lr`,
#: `choose_lrs`). It reaches down to 0.001: the 1-D CNN's pooled features have a squared norm of
#: ~1,500 on BasicMotions, so at lr 0.01 one batch-1 step already moves a logit by ~15
LR_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
#: int8 headroom tried with each lr on the int8 side (`choose_lrs`): 1 is the calibrated program;
#: float32 grows new-class classifier rows 3-35x and a GRU's input projection ~10x beyond the
#: pretrained int8 ranges (docs/benchmarks.md)
HEADROOM_GRID = (1, 4, 16, 64)


class SensorCNN(nn.Module):
    """1-D CNN: three convolutions along time + ReLU (kernels 5, 3, 3; strides 2, 2, 1), global
    average pool, linear. The convolutions are written as Conv2d with (1, K) kernels on the
    (N, C, 1, L) view, which is exactly how edgetrain lowers nn.Conv1d (frontend/aten_layers.py),
    because the sparse-update layer finder (trainable/layers.py) does not yet see a Conv1d's
    weight (the lowering reads it through a reshape), so update="auto" could train none of them."""

    def __init__(self, dims: int, classes: int, width: int = CNN_WIDTH):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(dims, width, (1, 5), stride=(1, 2)), nn.ReLU(),
                                      nn.Conv2d(width, width, (1, 3), stride=(1, 2)), nn.ReLU(),
                                      nn.Conv2d(width, width, (1, 3)), nn.ReLU())
        self.classifier = nn.Linear(width, classes)

    def forward(self, x):
        return self.classifier(self.features(x.unsqueeze(2)).mean((2, 3)))


class SensorGRU(nn.Module):
    """Average pool by GRU_POOL over time, a one-layer GRU, linear on the last hidden state."""

    def __init__(self, dims: int, classes: int, hidden: int = GRU_HIDDEN):
        super().__init__()
        self.pool = nn.AvgPool1d(GRU_POOL)
        self.gru = nn.GRU(dims, hidden, batch_first=True)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.gru(self.pool(x).transpose(1, 2))
        return self.classifier(out[:, -1])


BUILD = {"cnn": SensorCNN, "gru": SensorGRU}


def load(name: str, data_dir):
    from edgetrain.data.timeseries import load_ts

    train, test = load_ts(data_dir or name, length=PLAID_LENGTH if name == "PLAID" else None)
    mean = train.series.mean(axis=(0, 2))
    std = train.series.std(axis=(0, 2)) + np.float32(1e-6)  # a constant dimension stays finite
    return (train.batch(range(len(train)), None, mean, std), train.labels,
            test.batch(range(len(test)), None, mean, std), test.labels, train.classes)


def pretrain(model: nn.Module, x, y, classes: int, seed: int) -> nn.Module:
    """Adam on the cases of the first half of the classes; the model is left in eval mode."""
    keep = y < (classes + 1) // 2
    xs, ys = torch.from_numpy(x[keep]), torch.from_numpy(y[keep])
    opt = torch.optim.Adam(model.parameters(), lr=PRETRAIN_LR)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(PRETRAIN_EPOCHS):
        order = torch.randperm(len(ys), generator=gen)
        for s in range(0, len(ys), PRETRAIN_BATCH):
            idx = order[s:s + PRETRAIN_BATCH]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
            opt.step()
    return model.eval()


def distinct_pieces(model: nn.Module, x) -> tuple[list[int], list[int]]:
    """(layers, bias depths) of the contribution analysis, one per distinct parameter: a GRU's
    recurrent weight is one layer per time step in the captured graph (trainable/layers.py),
    and analysing each copy would measure the same piece again."""
    from edgetrain.sparse.scheme_layers import scheme_layers

    found = scheme_layers(model, (torch.from_numpy(x),), "int8").layers[:-1]  # the classifier always trains
    layers, seen = [], set()
    for i, layer in enumerate(found):
        if layer.weight not in seen:
            seen.add(layer.weight)
            layers.append(i)
    ks, biases = [], set()
    for k in range(1, len(found) + 1):
        new = set(found[-k].bias) - biases
        if new:
            biases |= new
            ks.append(k)
    return layers, ks


def choose_lr(model: nn.Module, fit, val, grid, epochs: int, seed: int) -> tuple[float, dict]:
    """(lr, {lr: held-out top-1}): the lr of `grid` whose classifier-only fine-tune (float32,
    batch 1, the fine-tuning's epochs and order) scores the best top-1 on `val`; ties: the smaller."""
    import edgetrain as et
    from edgetrain.sparse.finetune import FineTune, FineTuner
    from edgetrain.sparse.scheme_layers import scheme_layers

    classifier = scheme_layers(model, (torch.from_numpy(fit[0][:1]),), "int8").resolve(et.Sparse())
    scores = {lr: FineTuner(model, fit, val, FineTune(epochs=epochs, batch=1, lr=lr, momentum=0.0, seed=seed))
              .accuracy(classifier) for lr in sorted(grid)}
    return max(scores, key=lambda lr: (scores[lr], -lr)), scores


def int8_finetune(model: nn.Module, scheme, x, y, lr: float, headroom: float, epochs: int, seed: int, calib,
                  backward: str = "float"):
    """edgetrain's int8 program of `scheme` (QAS, calibrated on `calib`, `headroom`, `backward`)
    fine-tuned on (x, y): batch 1, `epochs`, the case order of default_rng(seed) per epoch."""
    import edgetrain as et

    prog = et.compile(model, (torch.from_numpy(x[:1]),), update=scheme, quantize="int8",
                      optimizer=et.SGD(lr=lr, qas=True, seed=seed), calibration=calib, int8_headroom=headroom,
                      backward=backward)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for i in rng.permutation(len(y)):
            prog.step(x[i:i + 1], y[i:i + 1])
    return prog


def choose_lrs(model: nn.Module, scheme, fit, val, grid, epochs: int, seed: int, calib,
               headrooms=(1,), backward: str = "float") -> dict:
    """{"edgetrain": (lr, {lr: held-out top-1}), "torch": (...), "headroom": (H, {(lr, H): top-1})}:
    for each side, the lr of `grid` whose fine-tune of `scheme` on `fit` (batch 1, `epochs`, the
    order of default_rng(seed)) scores the best top-1 on `val`, by that side's own training:
    edgetrain's int8 program (QAS, calibrated on `calib`) and PyTorch float32 on the parameters the
    program trains; ties: the smaller lr. The int8 side chooses its headroom of `headrooms` with
    its lr (ties: the smaller headroom, then the smaller lr); its {lr: top-1} is at that headroom."""
    from edgetrain.sparse.finetune import FineTune, FineTuner

    int8, peer = {}, {}
    for lr in sorted(grid):
        for h in sorted(headrooms):
            prog = int8_finetune(model, scheme, *fit, lr, h, epochs, seed, calib, backward)
            int8[lr, h] = top1(prog.predict, *val)
        peer[lr] = FineTuner(model, fit, val, FineTune(epochs=epochs, batch=1, lr=lr, momentum=0.0, seed=seed)
                             ).accuracy(dict(prog.trainable))
    lr, h = max(int8, key=lambda k: (int8[k], -k[1], -k[0]))
    best = lambda scores: max(scores, key=lambda lr: (scores[lr], -lr))  # noqa: E731
    return {"edgetrain": (lr, {lr_: int8[lr_, h] for lr_ in sorted(grid)}), "torch": (best(peer), peer),
            "headroom": (h, int8)}


def top1(predict, x, y) -> float:
    return float((np.concatenate([predict(x[i:i + 1]) for i in range(len(x))]).argmax(-1) == y).mean())


def host_step_lines(prog, samples, d: Path) -> list[str]:
    prog.emit_c(d, target="host", samples=samples)
    subprocess.run(["make", "-s", "main"], cwd=d, check=True, capture_output=True)
    r = subprocess.run(["./main"], cwd=d, check=True, capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if line.startswith("step ")]


def run(set_name: str, model_name: str, args) -> dict:
    import edgetrain as et
    from edgetrain.backends.c import cortexm
    from edgetrain.sparse.finetune import FineTune, FineTuner

    xtr, ytr, xte, yte, classes = load(set_name, args.data)
    torch.manual_seed(args.seed)
    model = pretrain(BUILD[model_name](xtr.shape[1], len(classes)), xtr, ytr, len(classes), args.seed)
    before = top1(lambda b: model(torch.from_numpy(b)).detach().numpy(), xte, yte)
    # lr and contribution analysis on the training split: fine-tune on 3/4, score on the held-out 1/4
    perm = np.random.default_rng([args.seed, 1]).permutation(len(ytr))
    n_val = max(1, int(len(ytr) * VALIDATION_SHARE))
    val, fit = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    t0 = time.perf_counter()
    grid = LR_GRID if args.lr is None else (args.lr,)
    lr, lr_val = choose_lr(model, (xtr[fit], ytr[fit]), (xtr[val], ytr[val]), grid, args.epochs, args.seed)
    tune = FineTune(epochs=args.epochs, batch=1, lr=lr, momentum=0.0, seed=args.seed)
    layers, bias_ks = distinct_pieces(model, xtr[:1])
    table = et.sparse.analyze_contributions(model, (xtr[fit], ytr[fit]), (xtr[val], ytr[val]),
                                            name=f"{set_name}-{model_name}", config=tune, layers=layers,
                                            bias_ks=bias_ks)
    t_analysis = time.perf_counter() - t0
    calib = [xtr[i:i + 1] for i in perm[n_val:n_val + CALIBRATION_CASES]]  # the held-out quarter stays unseen
    t0 = time.perf_counter()
    example = (torch.from_numpy(xtr[:1]),)
    searched = et.compile(model, example, update="auto", budget=et.Budget(sram=args.budget), quantize="int8",
                          optimizer=et.SGD(lr=lr, qas=True, seed=args.seed), contributions=table, calibration=calib,
                          backward=args.backward)
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    headrooms = HEADROOM_GRID if args.headroom is None else (args.headroom,)
    if args.lr is None:
        lrs = choose_lrs(model, searched.scheme, (xtr[fit], ytr[fit]), (xtr[val], ytr[val]), LR_GRID, args.epochs,
                         args.seed, calib, headrooms, args.backward)
    else:
        lrs = {"edgetrain": (args.lr, {}), "torch": (args.lr, {}), "headroom": (headrooms[0], {})}
    t_lrs = time.perf_counter() - t0
    lr_int8, lr_torch = lrs["edgetrain"][0], lrs["torch"][0]
    headroom, grid_scores = lrs["headroom"]
    prog = et.compile(model, example, update=searched.scheme, quantize="int8",
                      optimizer=et.SGD(lr=lr_int8, qas=True, seed=args.seed), calibration=calib,
                      int8_headroom=headroom, backward=args.backward)
    assert prog.memory.peak_bytes == searched.memory.peak_bytes, "the scheme compiled alone differs from the search's"
    # firmware: the first training cases, on the chip and in the host C build
    samples = [(xtr[i:i + 1], ytr[i:i + 1]) for i in perm[:args.firmware_steps]]
    with tempfile.TemporaryDirectory() as tmp:
        host = host_step_lines(prog, samples, Path(tmp) / "host")
        fw = cortexm.run_firmware(prog, Path(tmp) / "m4", "cortex-m4", samples)
    same = list(fw.run.step_lines) == host
    # fine-tuning: edgetrain int8 (reference runner) vs PyTorch float32, same parameters and order
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        for i in rng.permutation(len(ytr)):
            prog.step(xtr[i:i + 1], ytr[i:i + 1])
    t_train = time.perf_counter() - t0
    after = top1(prog.predict, xte, yte)
    if lr_torch != lr_int8:  # edgetrain int8 at PyTorch's lr (and the chosen headroom), for the record
        other = int8_finetune(model, prog.scheme, xtr, ytr, lr_torch, headroom, args.epochs, args.seed, calib,
                              args.backward)
        after_at_torch_lr = top1(other.predict, xte, yte)
    else:
        after_at_torch_lr = after
    # the int8 program without headroom, at the lr it would choose alone (the table's earlier figure)
    plain = [k for k in grid_scores if k[1] == 1]
    lr_plain = max(plain, key=lambda k: (grid_scores[k], -k[0]))[0] if plain else None
    if headroom == 1 or lr_plain is None:
        after_plain = after if headroom == 1 else None
    else:
        after_plain = top1(int8_finetune(model, prog.scheme, xtr, ytr, lr_plain, 1, args.epochs, args.seed,
                                         calib, args.backward).predict, xte, yte)
    peer = {lr_: FineTuner(model, (xtr, ytr), (xte, yte), replace(tune, lr=lr_)).accuracy(dict(prog.trainable))
            for lr_ in {lr_torch, lr_int8}}  # its own lr, and edgetrain's
    # --finetune-seeds K: the same program fine-tuned with K case orders and rounding seeds (0..K-1)
    by_seed = [top1(int8_finetune(model, prog.scheme, xtr, ytr, lr_int8, headroom, args.epochs, s, calib,
                                  args.backward).predict, xte, yte) for s in range(args.finetune_seeds)]
    return {"bench": "sensors", "set": set_name, "model": model_name, "backward": args.backward,
            "classes": len(classes),
            "pretrain_classes": (len(classes) + 1) // 2, "train": len(ytr), "test": len(yte),
            "input": list(xtr.shape[1:]), "scheme": str(prog.scheme), "budget": args.budget,
            "peak_sram_bytes": int(prog.memory.peak_bytes), "firmware_sram_bytes": int(fw.size.sram),
            "firmware_sram_used_bytes": int(fw.size.sram_used), "firmware_flash_bytes": int(fw.size.flash),
            "cycles_per_step": fw.size.cycles_per_step, "firmware_steps": args.firmware_steps,
            "firmware_losses_equal_host": same, "firmware_losses": list(fw.run.losses),
            "top1_before": before, "top1_edgetrain_int8": after, "top1_torch_float32": peer[lr_torch],
            "top1_torch_float32_at_edgetrain_lr": peer[lr_int8],
            "top1_edgetrain_int8_at_torch_lr": after_at_torch_lr,
            "int8_headroom": headroom, "lr_edgetrain_no_headroom": lr_plain if headroom != 1 else lr_int8,
            "top1_edgetrain_int8_no_headroom": after_plain, "top1_edgetrain_int8_by_finetune_seed": by_seed,
            "validation_top1_edgetrain_by_lr_headroom": {f"{k[0]:g}/{k[1]:g}": v for k, v in grid_scores.items()},
            "epochs": args.epochs, "lr_analysis": lr, "lr_analysis_validation_top1": lr_val,
            "lr_edgetrain": lr_int8, "lr_torch": lr_torch, "lr_validation_top1_edgetrain": lrs["edgetrain"][1],
            "lr_validation_top1_torch": lrs["torch"][1],
            "contribution_weight_base": table.weight_base, "contributions_top": table.top(6),
            "search_fallback": searched.search.fallback if searched.search else "",
            "seconds": {"analysis": round(t_analysis, 1), "lr_choice": round(t_lrs, 1),
                                                              "compile": round(t_compile, 1),
                                                              "edgetrain_train": round(t_train, 1)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", nargs="+", default=list(SETS))
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--budget", default="64KB")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, help=f"one learning rate for the analysis and both sides (default: chosen of "
                                            f"{LR_GRID} on the held-out quarter of the training split, per side)")
    p.add_argument("--headroom", type=float, help=f"one int8 headroom for the int8 side (default: chosen of "
                                                  f"{HEADROOM_GRID} with its lr)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--firmware-steps", type=int, default=8)
    p.add_argument("--data", help="a folder holding SET_TRAIN.ts and SET_TEST.ts (default: the sktime wheel's)")
    p.add_argument("--finetune-seeds", type=int, default=0, metavar="K",
                   help="also fine-tune the chosen int8 program with case orders and rounding seeds 0..K-1 and "
                        "report each top-1 and their mean (default 0: none)")
    p.add_argument("--backward", choices=("float", "integer"), default="float",
                   help="the int8 side's backward: float32 gradients (default) or integers only")
    args = p.parse_args(argv)
    rows = []
    for s in args.sets:
        for m in args.models:
            row = run(s, m, args)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| set | model | scheme (searched under " + args.budget + ") | lr int8 / float32 | int8 headroom | "
          "peak SRAM | firmware SRAM / flash | QEMU = host | top-1 before | edgetrain int8 | "
          "edgetrain int8 without headroom | PyTorch float32 | PyTorch float32 at the int8 lr |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        plain = r["top1_edgetrain_int8_no_headroom"]
        print(f"| {r['set']} | {r['model']} | {r['scheme']} | {r['lr_edgetrain']:g} / {r['lr_torch']:g} | "
              f"{r['int8_headroom']:g} | {r['peak_sram_bytes'] / KB:.1f} KB | "
              f"{r['firmware_sram_bytes'] / KB:.1f} KB / {r['firmware_flash_bytes'] / KB:.1f} KB | "
              f"{'yes' if r['firmware_losses_equal_host'] else 'NO'} | {r['top1_before']:.3f} | "
              f"{r['top1_edgetrain_int8']:.3f} | "
              + ("-" if plain is None else f"{plain:.3f} (lr {r['lr_edgetrain_no_headroom']:g})")
              + f" | {r['top1_torch_float32']:.3f} | {r['top1_torch_float32_at_edgetrain_lr']:.3f} |")
    for r in rows:
        seeds = r["top1_edgetrain_int8_by_finetune_seed"]
        if seeds:
            print(f"\n{r['set']} {r['model']}, {r['backward']} backward: edgetrain int8 top-1 over fine-tune seeds "
                  f"0..{len(seeds) - 1}: mean {np.mean(seeds):.3f} ({', '.join(f'{v:.3f}' for v in seeds)})")
    return 0 if all(r["firmware_losses_equal_host"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
