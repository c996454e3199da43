"""How far float32 gradients of a model lie from float64, per implementation and input seed: the
C backend and the reference runtime in float32 against the float64 reference, and PyTorch's own
float32 autograd against its float64 (docs/benchmarks.md, seg.tv_fcn_resnet50).

    PYTHONPATH=src python bench/float32_sensitivity.py [--model seg.tv_fcn_resnet50] [--seeds 1 2 3]

The model is tests/realmodels/families.py's (weights from torch.manual_seed(0)); each seed draws
its input (torch.randn with that generator seed, the family's input shape) and labels. Prints,
per seed, the largest relative error over the parameter gradients (max |a - b| / max |b| per
tensor) of: C vs the float32 reference, C vs float64, float32 reference vs float64, PyTorch
float32 vs PyTorch float64.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.realmodels (the families)


def worst(a: dict, b: dict) -> tuple[float, str]:
    errs = {k: float(np.abs(np.asarray(a[k], np.float64) - b[k]).max() / max(np.abs(b[k]).max(), 1e-30)) for k in b}
    k = max(errs, key=errs.get)
    return errs[k], k


def torch_grads(model, x, y) -> dict:
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return {k: p.grad.double().numpy().copy() for k, p in model.named_parameters()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="seg.tv_fcn_resnet50")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args(argv)
    import edgetrain as et
    from edgetrain.backends.c.host import to_c_program
    from tests.realmodels.families import FAMILIES

    fam = FAMILIES[args.model]
    torch.manual_seed(0)
    m64 = fam.make().double().eval()
    m32 = copy.deepcopy(m64).float()
    for seed in args.seeds:
        g = torch.Generator().manual_seed(seed)
        x64 = fam.input(g)
        with torch.no_grad():
            y = torch.randint(0, m64(x64).shape[-1], (x64.shape[0],), generator=g)
        x32 = x64.float()
        prog = et.compile(m32, (x32,), loss="cross_entropy", update=et.Full())
        ref32 = prog.gradients(x32.numpy(), y.numpy())
        c32 = to_c_program(prog).gradients(x32.numpy(), y.numpy())
        ref64 = et.compile(m64, (x64,), loss="cross_entropy", update=et.Full()).gradients(x64.numpy(), y.numpy())
        t64, t32 = torch_grads(m64, x64, y), torch_grads(m32, x32, y)
        rows = {"C vs float32 reference": worst(c32, ref32), "C vs float64": worst(c32, ref64),
                "float32 reference vs float64": worst(ref32, ref64), "PyTorch float32 vs float64": worst(t32, t64)}
        print(f"seed {seed}: " + "; ".join(f"{k} {e:.1e} ({n})" for k, (e, n) in rows.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
