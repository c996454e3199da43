"""Pretrain the demo's DigitNet on MNIST in float32 PyTorch (the "cloud" step) and save
its weights, which the repository ships for `edgetrain demo` on a fresh machine:

    python scripts/pretrain_digitnet.py    # ~1 min on 2 cores; writes the file below

Deterministic (fixed seeds, single-threaded data order). The saved file is an .npz of the
model's state_dict arrays (no pickle), loaded by edgetrain.app.demo.pretrained_digitnet().
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edgetrain.data.mnist import load_mnist
from edgetrain.app.demo import normalise
from edgetrain.models.digitnet import DigitNet

OUT = Path(__file__).resolve().parents[1] / "src" / "edgetrain" / "models" / "weights" / "digitnet-mnist.npz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.manual_seed(0)
    x, y = load_mnist("train")
    xt, yt = load_mnist("test")
    x, xt = torch.from_numpy(normalise(x)), torch.from_numpy(normalise(xt))
    y, yt = torch.from_numpy(y), torch.from_numpy(yt)
    model = DigitNet()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    steps = args.epochs * (len(x) // args.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    gen = torch.Generator().manual_seed(0)
    t0 = time.time()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x), generator=gen)
        for i in range(len(x) // args.batch):
            idx = order[i * args.batch:(i + 1) * args.batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            acc = (model(xt).argmax(1) == yt).float().mean().item()
        print(f"epoch {epoch + 1}: test accuracy {acc:.4f} ({time.time() - t0:.0f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    tmp.replace(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} B)")


if __name__ == "__main__":
    main()
