"""One 3x3 stride-1 layer at a time: the host library's Winograd path (runtime/et_float_wino.h: F(4x4, 3x3) where
a pass has enough 4x4 tiles, else F(2x2, 3x3); --cflags=-DET_WINO4=0 for F(2x2, 3x3) only) against the library's
other path (oneDNN's direct convolution, or the GEMM path without oneDNN), and its GEMMs on the BLAS against
oneDNN's matmul.

    PYTHONPATH=src python bench/wino_layers.py [--layers 64:32,128:16,256:8,512:4] [--batch 8]
        [--repeats 15] [--warmup 2] [--threads 1] [--cflags="-DNAME=VALUE ..."] [--json-only]

For each layer C:S, a net of two C -> C 3x3 convolutions (padding 1, no bias) with a ReLU between, on a batch
of C x S x S inputs, then a linear layer to 10 classes, compiled for the C backend (Full, SGD with momentum
0.9, lr 0.001) with host.PROFILE_FLAG, whose library clocks every node. Three settings of one library
(et_wino_tune, set before each step): `direct` (the path off), `wino_blas` (on, its GEMMs on the BLAS),
`wino_onednn` (on, its GEMMs on oneDNN's matmul; where oneDNN is installed), one raw step each in turn per
repeat. Each row gives a pass's median milliseconds per convolution: the forward (both convolutions'
mean), the input gradient (the second's: the first's input needs none) and the weight gradient (both
convolutions' mean, fused with its update or not, as the compiler chose), and which library the CPU's rule
(et_wino_gemm_lib) picks. A layer the path does not take (fewer than 64 tiles: 512:4 at batch 8) gives the
same figures in every setting. Medians of the calling thread's wall time, on one thread, or with --threads T
on the threaded library (host.OPENMP_CFLAGS) with T threads. --cflags adds an experiment's macros to the
library (ET_WINO_BLOCK_BYTES, ...). Prints JSON lines and a markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import blas
from edgetrain.backends.c.host import DEFAULT_CFLAGS, OPENMP_CFLAGS, PROFILE_FLAG, to_c_program

#: et_wino_tune's (on, gemm) for each setting
SETTINGS = {"direct": (0, 0), "wino_blas": (1, 1), "wino_onednn": (1, 2)}
PASSES = {"conv2d": "forward", "conv2d_grad_input": "input gradient", "conv2d_grad_weight": "weight gradient",
          "conv2d_grad_weight_update": "weight gradient"}
LIBRARIES = {0: "not taken", 1: "BLAS", 2: "oneDNN matmul"}


def layer_net(channels: int, size: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1, bias=False), nn.ReLU(),
                         nn.Conv2d(channels, channels, 3, 1, 1, bias=False), nn.Flatten(),
                         nn.Linear(channels * size * size, 10))


def measure(channels: int, size: int, args) -> dict:
    torch.manual_seed(0)
    x = torch.randn(args.batch, channels, size, size)
    y = np.arange(args.batch) % 10
    compiled = et.compile(layer_net(channels, size).eval(), (x,), update=et.Full(),
                          optimizer=et.SGD(lr=0.001, momentum=0.9))
    flags = (OPENMP_CFLAGS if args.threads > 1 else DEFAULT_CFLAGS) + tuple(args.cflags.split())
    prog = to_c_program(compiled, flags + (PROFILE_FLAG,), threads=args.threads)
    lib = prog.runner._lib
    g = prog.runner.c_layout.graphs["train"].graph
    tg = prog.compiled.train_graph
    xin, yin = prog.runner.input_bytes(tg, x, training=True), np.ascontiguousarray(prog.runner.label_feed(tg, y))
    settings = [s for s in SETTINGS if s != "wino_onednn" or blas.dnnl() is not None]
    lib.et_wino_tune(1, 0)
    prog.runner.raw_step(xin, yin)
    chosen = LIBRARIES[lib.et_wino_gemms()]
    counts = {p: sum(PASSES.get(n.op) == p for n in g.nodes) for p in set(PASSES.values())}
    times: dict = {s: {p: [] for p in counts} for s in settings}
    for r in range(args.warmup + args.repeats):
        for s in settings:
            assert lib.et_wino_tune(*SETTINGS[s]) == 1
            before = prog.runner.node_seconds("train")
            prog.runner.raw_step(xin, yin)
            per = prog.runner.node_seconds("train") - before
            if r < args.warmup:
                continue
            sums = dict.fromkeys(counts, 0.0)
            for node, sec in zip(g.nodes, per):
                if node.op in PASSES:
                    sums[PASSES[node.op]] += float(sec)
            for p, v in sums.items():
                times[s][p].append(v / counts[p] * 1e3)
    return {"layer": f"{channels}:{size}", "batch": args.batch, "threads": prog.runner.threads,
            "gemm_library_chosen": chosen, "kernels": blas.describe(flags),
            "ms": {s: {p: round(statistics.median(v), 3) for p, v in times[s].items()} for s in settings}}


def table(rows) -> str:
    settings = [s for s in SETTINGS if any(s in r["ms"] for r in rows)]
    lines = ["| layer C:S, batch | pass | " + " | ".join(f"{s} (ms)" for s in settings) + " | GEMMs chosen here |",
             "|---|---|" + "---:|" * len(settings) + "---|"]
    for r in rows:
        for p in ("forward", "input gradient", "weight gradient"):
            vals = " | ".join(f"{r['ms'][s][p]:.3f}" for s in settings)
            lines.append(f"| {r['layer']}, b{r['batch']} | {p} | {vals} | {r['gemm_library_chosen']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="64:32,128:16,256:8,512:4")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cflags", default="")
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1 or args.warmup < 0 or args.batch < 1 or args.threads < 1:
        ap.error("--repeats, --batch and --threads must be positive, --warmup not negative")
    torch.set_num_threads(1)
    rows = []
    for spec in args.layers.split(","):
        channels, size = (int(v) for v in spec.split(":"))
        row = measure(channels, size, args)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if not args.json_only:
        print()
        print(table(rows))


if __name__ == "__main__":
    main()
