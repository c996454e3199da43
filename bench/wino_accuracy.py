"""How far the host library's Winograd path (runtime/et_float_wino.h) moves a real model's gradients: a
torchvision model (nobody here wrote it), its gradients from the C program against the float32 reference
runtime's and against the float64 program's (the model compiled in float64), with the path off, as
F(2x2, 3x3) or F(4x4, 3x3) on every convolution it can take, and with the library's own thresholds.

    PYTHONPATH=src python bench/wino_accuracy.py [--model resnet18] [--size 64] [--batch 8]
        [--modes off,f2,f4,default] [--gemm chosen|blas|onednn] [--after-step] [--kinks] [--json-only]

The model: torchvision's `--model` (one of its classification models) with 10 classes, in eval mode, random weights (torch seed 0), on a batch of
`--batch` random `--size` x `--size` images, Full update, SGD (lr 0.01, momentum 0.9), gradients at the initial
weights (with `--after-step`: after one step of the C program, its state copied into both references, so all
three start from the same weights). Modes, as the library's build flags (the C program built at graph_lib's quick
flags, on one thread; the path's GEMMs on the library the CPU's rule picks, or `--gemm`'s: et_wino_tune):

- off: -DET_WINO=0, every convolution on the GEMM path (or oneDNN's direct convolution);
- f2: every 3x3 stride-1 convolution of 16 channels or more as F(2x2, 3x3), however few its tiles (EVERY_F2);
- f4: the same as F(4x4, 3x3) (EVERY_F4);
- default: the library's thresholds (F(4x4, 3x3) where a pass has enough 4x4 tiles, else F(2x2, 3x3) where it
  has enough 2x2 tiles and multiply-adds, else the GEMMs).

Each row: the passes on the path (forwards, input gradients and weight gradients of one gradients() call) and
how many of them as F(4x4, 3x3), then the largest relative error over the model's gradients (for each tensor
max |got - ref| / max |ref|; the tensor where it is largest named) against the float32 reference and against
the float64 program. A first row gives the float32 reference's own error against the float64 program (with
`--after-step`, one before each mode's row, at that mode's state). A ReLU
decision within float32 rounding of zero can move a gradient by far more than rounding (tests/backends/c/
kinks.py); the rows name the tensor so such a case shows, and `--kinks` adds the float64 runs of the float32
program's graph with the nearest such decisions flipped (kinks.flipped_runs: each of the 4 nearest alone, then
in pairs): the least error over them, and which flips gave it. Prints JSON lines and a markdown table.
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import json
import sys
from pathlib import Path

import numpy as np
import torch

import edgetrain as et
from edgetrain.backends.c.graph_lib import FAST_CFLAGS
from edgetrain.backends.c.host import to_c_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_memory  # noqa: E402  (the torchvision op schemas its import needs here)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.backends.c import kinks  # noqa: E402
from tests.backends.c.float_agreement import relative_error  # noqa: E402

#: every 3x3 stride-1 convolution of ET_WINO_MIN_CH channels or more on the path, however few its tiles and
#: multiply-adds: as F(2x2, 3x3), and as F(4x4, 3x3)
EVERY_F2 = ("-DET_WINO_MIN_MACS=0", "-DET_WINO_MIN_TILES=1", "-DET_WINO4=0")
EVERY_F4 = ("-DET_WINO_MIN_MACS=0", "-DET_WINO_MIN_TILES=1", "-DET_WINO4_MIN_TILES=1", "-DET_WINO4_GW_MIN_TILES=1")
MODES = {"off": ("-DET_WINO=0",), "f2": EVERY_F2, "f4": EVERY_F4, "default": ()}
#: et_wino_tune's GEMM library for --gemm
GEMMS = {"chosen": 0, "blas": 1, "onednn": 2}


def worst(got: dict, ref: dict) -> tuple[float, str]:
    """(the largest relative error over the tensors, its tensor's name)."""
    errs = {k: relative_error(got[k], ref[k]) for k in ref}
    name = max(errs, key=errs.get)
    return errs[name], name


def flipped(prog, x, y) -> list[tuple[str, dict]]:
    """(the flips, the gradients) of the float64 runs of `prog`'s gradient graph with the nearest kinks flipped
    (the first with none)."""
    g = prog.compiled.grad_graph
    return [(", ".join(map(str, flips)) or "none",
             {k: np.asarray(v, np.float64) for k, v in prog.runner.full_gradients(outputs).items()})
            for flips, outputs, _ in kinks.flipped_runs(g, kinks.feeds_copy(prog, g, x, y))]


def least(got: dict, runs: list[tuple[str, dict]]) -> tuple[float, str]:
    """(the least of worst(got, run) over `runs`, that run's flips)."""
    return min((worst(got, r)[0], flips) for flips, r in runs)


def torchvision_models():
    """torchvision.models, imported after the op schemas its import needs here."""
    lm_memory._torchvision_schemas()
    import torchvision.models as tvm

    return tvm


def rows(args) -> list[dict]:
    torch.manual_seed(0)
    model = getattr(torchvision_models(), args.model)(num_classes=10).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = np.arange(args.batch) % 10

    def compiled(m, xx):
        return et.compile(m, (xx,), update=et.Full(), optimizer=et.SGD(lr=0.01, momentum=0.9))

    p32, p64 = compiled(model, x), compiled(copy.deepcopy(model).double(), x.double())
    base = {"model": args.model, "size": args.size, "batch": args.batch, "gemm": args.gemm,
            "after_step": args.after_step}
    out, refs = [], None
    for mode in args.modes.split(","):
        prog = to_c_program(compiled(model, x), FAST_CFLAGS + MODES[mode])
        lib = prog.runner._lib
        lib.et_wino_convolutions.restype = lib.et_wino_convolutions4.restype = ctypes.c_long
        if lib.et_wino_tune(1, GEMMS[args.gemm]) != 1:
            raise SystemExit(f"--gemm {args.gemm}: this library cannot take it (oneDNN not installed?)")
        if args.after_step:
            prog.step(x, y)
            for k, v in prog.state.items():  # the same weights and optimizer state in both references
                p32.state[k][...] = v
                p64.state[k][...] = v
        if refs is None or args.after_step:  # the references' gradients and their own row, at this state
            refs = ({k: np.asarray(v, np.float64) for k, v in p32.gradients(x, y).items()},
                    {k: np.asarray(v, np.float64) for k, v in p64.gradients(x.double(), y).items()})
            runs = flipped(p32, x, y) if args.kinks else []
            e64, at64 = worst(*refs)
            out.append({**base, "mode": "float32 reference" + (f" (at {mode}'s state)" if args.after_step else ""),
                        "passes": None, "f4": None, "vs_float32": 0.0, "worst_float32": "", "vs_float64": e64,
                        "worst_float64": at64, **kink_fields(refs[0], runs)})
        ref32, ref64 = refs
        n0, n40 = lib.et_wino_convolutions(), lib.et_wino_convolutions4()
        got = prog.gradients(x, y)
        e32, at32 = worst(got, ref32)
        e64, at64 = worst(got, ref64)
        out.append({**base, "mode": mode, "passes": lib.et_wino_convolutions() - n0,
                    "f4": lib.et_wino_convolutions4() - n40,
                    "vs_float32": e32, "worst_float32": at32, "vs_float64": e64, "worst_float64": at64,
                    **kink_fields(got, runs)})
    return out


def kink_fields(got: dict, runs: list[tuple[str, dict]]) -> dict:
    """A row's --kinks fields: its least error over the flipped runs and their flips (none without --kinks)."""
    if not runs:
        return {}
    e, flips = least(got, runs)
    return {"vs_float64_flipped": e, "flips": flips}


def table(rs: list[dict]) -> str:
    kinked = any("flips" in r for r in rs)
    lines = ["| model | GEMMs | mode | passes on the path (F(4x4, 3x3)) | vs float32 reference | vs float64 program |"
             + (" vs float64 run, kinks flipped (flips) |" if kinked else ""),
             "|---|---|---|---:|---:|---:|" + ("---:|" if kinked else "")]
    for r in rs:
        path = "" if r["passes"] is None else f"{r['passes']} ({r['f4']})"
        v32 = "" if r["passes"] is None else f"{r['vs_float32']:.2g} ({r['worst_float32']})"
        at = f"{r['model']} {r['size']}x{r['size']} b{r['batch']}" + (", after a step" if r["after_step"] else "")
        lines.append(f"| {at} | {r['gemm']} | {r['mode']} | {path} | {v32} | "
                     f"{r['vs_float64']:.2g} ({r['worst_float64']}) |"
                     + (f" {r['vs_float64_flipped']:.2g} ({r['flips']}) |" if kinked else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--modes", default="off,f2,f4,default")
    ap.add_argument("--gemm", choices=sorted(GEMMS), default="chosen")
    ap.add_argument("--after-step", action="store_true")
    ap.add_argument("--kinks", action="store_true")
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args(argv)
    bad = [m for m in args.modes.split(",") if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}: choose from {sorted(MODES)}")
    if args.size < 1 or args.batch < 1:
        ap.error("--size and --batch must be at least 1")
    tvm = torchvision_models()
    if args.model not in tvm.list_models(module=tvm):
        ap.error(f"--model {args.model}: not one of torchvision's classification models "
                 f"(torchvision.models.list_models(module=torchvision.models))")
    rs = rows(args)
    for r in rs:
        print(json.dumps(r))
    if not args.json_only:
        print(table(rs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
