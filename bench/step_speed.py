"""Training-step time of the C backend against PyTorch eager, one thread, batch 1.

    PYTHONPATH=src python bench/step_speed.py [--model mbv2-w0.35] [--size 128]
        [--schemes full,last8] [--repeats 30] [--no-int8] [--torch-compile] [--no-fma] [--json-only]

For each scheme (Full, LastK(8)) on `et.models.get(model, num_classes=10)` (float32, SGD
lr 0.01 momentum 0.9): the median wall time of one training step of
- `c`: `et.compile(..., backend="c")`'s `prog.step(x, y)` (the public API: state sync and the
  non-finite check included) and `c_raw`: the library's et_train_step alone;
- `torch`: PyTorch eager, torch.set_num_threads(1), the same model in eval mode (batch norm on
  running statistics, as compiled) with only the trained tensors requiring grad, forward +
  cross-entropy + backward + torch.optim.SGD step;
- `torch_compile` (with --torch-compile): the same step under torch.compile.
The runs alternate (C, torch, C, torch, ...) so that a shared machine's load hits both alike.
With the paper's model file (../shared/assets/tiny-training/mbv2-w0.35.pkl), also the int8 step (quantize="int8", SGD
without momentum) in C against the reference runtime. The C library is built with the
backend's default flags (explicit FMA in the float GEMM / convolution kernels), or without
FMA (--no-fma). Prints JSON lines and a markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import edgetrain as et
from edgetrain.backends.c.host import DEFAULT_CFLAGS, to_c_program

SCHEMES = {"full": et.Full(), "last8": et.LastK(8), "bias": et.BiasOnly()}
ASSETS = Path(__file__).resolve().parents[1] / ".." / "shared" / "assets" / "tiny-training"


def _median_ms(ts):
    return 1e3 * statistics.median(ts)


def torch_step_fn(model, prog, x, y, lr, momentum, compiled=False):
    trained = set(prog.trainable)
    names = {k: v for k, v in prog._aliases.items()}
    params = []
    for k, p in model.named_parameters():
        p.requires_grad_(names.get(k, k) in trained)
        if p.requires_grad:
            params.append(p)
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    yt = torch.as_tensor(y)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), yt)
        loss.backward()
        opt.step()
        return loss

    if compiled:
        cstep = torch.compile(step)
        return cstep
    return step


def cflags(args) -> tuple:
    """The C library's compiler flags: the backend's default, or without ET_FLOAT_FMA."""
    return tuple(f for f in DEFAULT_CFLAGS if not (args.no_fma and f == "-DET_FLOAT_FMA"))


def bench_float(args, name, scheme_key, out):
    lr, mom = 0.01, 0.9
    model = et.models.get(args.model, num_classes=10).eval()
    x = torch.randn(1, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    y = np.array([3])
    t0 = time.perf_counter()
    prog = to_c_program(et.compile(model, (x,), update=SCHEMES[scheme_key], optimizer=et.SGD(lr=lr, momentum=mom)),
                        cflags(args))
    build_s = time.perf_counter() - t0
    xin = np.ascontiguousarray(x.numpy())
    yin = np.ascontiguousarray(y.astype(np.int64))
    tmodel = et.models.get(args.model, num_classes=10).eval()
    tstep = torch_step_fn(tmodel, prog, x, y, lr, mom)
    runs = {"c": lambda: prog.step(x, y), "c_raw": lambda: prog.raw_step(xin, yin), "torch": tstep}
    if args.torch_compile:
        cmodel = et.models.get(args.model, num_classes=10).eval()
        try:
            cstep = torch_step_fn(cmodel, prog, x, y, lr, mom, compiled=True)
            t = time.perf_counter()
            cstep()
            runs["torch_compile"] = cstep
            print(f"# torch.compile warm-up {time.perf_counter() - t:.1f} s", file=sys.stderr)
        except Exception as err:  # noqa: BLE001 - report and go on
            print(f"# torch.compile failed: {type(err).__name__}: {err}", file=sys.stderr)
    times = {k: [] for k in runs}
    for _ in range(args.warmup):
        for f in runs.values():
            f()
    for _ in range(args.repeats):
        for k, f in runs.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    row = {"model": args.model, "size": args.size, "scheme": scheme_key, "dtype": "float32",
           "build_s": round(build_s, 1), "trained_weights": int(sum(prog.state[p].size for p in prog.trainable))}
    for k, ts in times.items():
        row[f"{k}_ms"] = round(_median_ms(ts), 3)
    row["speedup_vs_torch"] = round(row["torch_ms"] / row["c_ms"], 2)
    if "torch_compile_ms" in row:
        row["speedup_vs_torch_compile"] = round(row["torch_compile_ms"] / row["c_ms"], 2)
    out.append(row)
    print(json.dumps(row), flush=True)


def bench_int8(args, scheme_key, out):
    from edgetrain.models import from_tiny_training

    path = ASSETS / f"{args.model}.pkl"
    if not path.exists():
        print(f"# int8: skipped (no {path})", file=sys.stderr)
        return
    model = from_tiny_training(path, num_classes=10)
    x = torch.randn(1, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    y = np.array([3])
    opt = et.SGD(lr=0.05)
    t0 = time.perf_counter()
    prog = to_c_program(et.compile(model, (x,), update=SCHEMES[scheme_key], quantize="int8", optimizer=opt),
                        cflags(args))
    build_s = time.perf_counter() - t0
    ref = et.compile(model, (x,), update=SCHEMES[scheme_key], quantize="int8", optimizer=opt)
    runs = {"c": lambda: prog.step(x, y), "reference": lambda: ref.step(x, y)}
    times = {k: [] for k in runs}
    for _ in range(max(1, args.warmup // 2)):
        for f in runs.values():
            f()
    for _ in range(max(3, args.repeats // 3)):
        for k, f in runs.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    row = {"model": args.model + " (tiny-training int8)", "size": args.size, "scheme": scheme_key, "dtype": "int8",
           "build_s": round(build_s, 1)}
    for k, ts in times.items():
        row[f"{k}_ms"] = round(_median_ms(ts), 3)
    row["speedup_vs_reference"] = round(row["reference_ms"] / row["c_ms"], 2)
    out.append(row)
    print(json.dumps(row), flush=True)


def table(rows) -> str:
    lines = ["| model | scheme | dtype | C step (ms) | C raw (ms) | PyTorch eager (ms) | torch.compile (ms) | "
             "reference (ms) | speedup |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = r.get("speedup_vs_torch", r.get("speedup_vs_reference"))
        lines.append(f"| {r['model']} {r['size']}x{r['size']} | {r['scheme']} | {r['dtype']} | {r['c_ms']} | "
                     f"{r.get('c_raw_ms', '')} | {r.get('torch_ms', '')} | {r.get('torch_compile_ms', '')} | "
                     f"{r.get('reference_ms', '')} | {sp}x |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mbv2-w0.35")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--schemes", default="full,last8")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-int8", action="store_true")
    ap.add_argument("--torch-compile", action="store_true")
    ap.add_argument("--no-fma", action="store_true",
                    help="build the C library without explicit fused multiply-adds (the emitted projects' numerics)")
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    keys = [k for k in args.schemes.split(",") if k]
    for k in keys:
        bench_float(args, args.model, k, rows)
    if not args.no_int8:
        for k in keys:
            bench_int8(args, k, rows)
    if not args.json_only:
        print()
        print(table(rows))


if __name__ == "__main__":
    main()
