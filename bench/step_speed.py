"""Training-step time of the C backend against PyTorch eager, one thread (--threads: more).

    PYTHONPATH=src python bench/step_speed.py [--model mbv2-w0.35] [--size 128] [--batch 1,8]
        [--schemes full,last8] [--repeats 30] [--no-int8] [--torch-compile] [--no-fma]
        [--kernels blas|portable|both] [--threads 1] [--build auto|serial|threaded|both]
        [--ort-python PATH] [--no-ort] [--cflags="-DNAME=VALUE ..."] [--profile] [--json-only] [--lr 0.001]

For each scheme (Full, LastK(8)) on `et.models.get(model, num_classes=10)` (float32, SGD
lr 0.001 momentum 0.9; before 2026-12-02 lr 0.01, which `--lr 0.01` gives: a step's work does not depend
on it, but at 0.01 ResNet-18 in eval mode blew up on the bench's one batch after about 23 C steps, so from
about 10 repeats on, the default 30 too, it stopped with a NonFiniteLossError): the median wall time of one training step of
- `c`: `et.compile(..., backend="c")`'s `prog.step(x, y)` (the public API: state sync and the
  non-finite check included) and `c_raw`: the library's et_train_step alone;
- `torch`: PyTorch eager, torch.set_num_threads(1), the same model in eval mode (batch norm on
  running statistics, as compiled) with only the trained tensors requiring grad, forward +
  cross-entropy + backward + torch.optim.SGD step;
- `torch_compile` (with --torch-compile): the same step under torch.compile.
The runs alternate (C, torch, C, torch, ...) so that a shared machine's load hits both alike,
in a new random order each repeat (seeded), so that no system always follows the same one (a step
right after PyTorch's finds the caches cold, one right after its own warm: with the order rotated by
one each repeat, the raw C step always ran right after the public one and was timed warm);
with one thread each row also gives the medians of the calling thread's CPU time (`*_cpu_ms`,
the GFLOP/s are computed from them), which a loaded machine disturbs less than wall time; and every
row gives each system's fastest repeat (`*_min_ms`, wall time), which a neighbour's load on a shared
machine can only push up.
With the paper's model file (../shared/assets/tiny-training/mbv2-w0.35.pkl), also the int8 step (quantize="int8", SGD
at --lr without momentum) in C against the reference runtime; its row gives the public step's first and last
losses (`loss_first`, `loss_last`). Before 2026-12-04 the int8 step ran at lr 0.05, at which it blew up on the
bench's one random batch within about ten steps (loss 2.4 -> 40-70) and, from then on, took about 30 instead of
52 ms at batch 8 (this session's AMD EPYC): most gradient rows were zero, and the kernels skip a zero row's sums.
Every int8 figure measured before then was mostly of that state; --lr 0.05 gives it again. The C library is built with the
backend's default flags (explicit FMA in the float GEMM / convolution kernels), or without
FMA (--no-fma). Convolutions and dense layers run on the host's BLAS (backends/c/blas.py,
MKL or scipy-openblas32) where installed: --kernels portable builds the dependency-free kernels instead,
--kernels both builds the two libraries and times them side by side (`c` and `c_portable`).
--threads N runs PyTorch on N threads and the C library on N threads; the default is one. Which C library
(--build, the `c_build` of each row): `auto` (default) is the serial default library at --threads 1 (as in the
tables before the threaded build: its kernels serial, its BLAS on one thread) and the threaded library
(host.OPENMP_CFLAGS, CRunner threads=N: its kernels' parallel loops and GEMM tiles on N threads, results bit for
bit the same at any N) above; `serial` / `threaded` force one; `both` times the threaded library (`c`, `c_raw`)
and the serial default one (`c_serial_raw`, whose BLAS alone runs on EDGETRAIN_BLAS_THREADS=N threads: MKL's or
OpenBLAS's own threading, its bits depending on N) side by side. PyTorch and the C library share one libgomp
(PyTorch's, loaded by `import torch`), whose idle threads spin between parallel loops: on a busy shared machine
run with OMP_WAIT_POLICY=passive in the environment (they then sleep; spinning made 2 threads several times
slower there), on a quiet one without (on 2 quiet cores passive made mbv2's 2-thread step 40 ms against 26 ms
spinning). With one thread there are no idle threads: --threads 1 rows are unaffected.
Each row gives the convolution and
dense-layer FLOPs of the step (2 x MACs of conv2d*, linear*, matmul nodes), their GFLOP/s in the
raw C step and in PyTorch, and this core's single-thread sgemm peak (bench/sgemm_peak.py, same
BLAS; the first JSON line names its kernels, `sgemm_kernels`). Prints JSON lines and a markdown table.

--profile: for each row (float and int8), one more build of the same program with host.PROFILE_FLAG, run for the same
warm-up and repeats after the timed ones (raw steps, not interleaved), whose library clocks every node of the
training graph (CRunner.node_seconds): the row's `profile_ms` gives the milliseconds per step of each kind of
node, the convolutions by kind (dense kxk, pointwise 1x1, depthwise, grouped; "int8 ..." in an int8 program) and
pass (forward, input gradient, weight gradient, the weight gradient fused with its update), and `profile_step_ms` the wall time of
those steps; a table per row follows the main one. The clocks add two clock_gettime calls per node.

ONNX Runtime training side by side (`ort`, float rows): bench/ort_step.py, run in a subprocess by
the python of a venv holding onnx 1.17.0 and onnxruntime-training 1.19.2 (--ort-python, default
DEFAULT_ORT_VENV/bin/python under edgetrain's cache directory), on the same model, weights and
batch: batch norm folded into the convolutions before export (ORT's training graph would switch
it to batch statistics), ORT's SGD (without momentum: its artifacts offer no momentum), one
thread, CPU-time medians; its first-step loss is checked against eager's (`ort_loss_rel_diff`).
It runs after the in-process systems, not interleaved with them. Make the venv with

    python -m venv ~/.cache/edgetrain/ort-venv
    ~/.cache/edgetrain/ort-venv/bin/pip install torch==2.13.0 onnx==1.17.0 onnxruntime-training==1.19.2 scipy

(scipy: edgetrain, imported from where this bench imports it to build the model, needs it). Without the
venv the bench says so and leaves the column empty.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import edgetrain as et
from edgetrain.backends.c.blas import compile_flags as blas_flags, describe as blas_describe
from edgetrain.backends.c.cache import cache_root
from edgetrain.backends.c.host import DEFAULT_CFLAGS, PROFILE_FLAG, to_c_program
from edgetrain.ops import get_op
from edgetrain.ops.qgradupdate import GRAD_UPDATE_OP, split_attrs as split_grad_update

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sgemm_peak import kernels as sgemm_kernels, sgemm_peak_gflops  # noqa: E402

#: the ops whose MACs count as the step's GEMM work
GEMM_OPS = ("conv2d", "conv2d_grad_input", "conv2d_grad_weight", "linear", "linear_grad_weight", "matmul")
#: weight gradients fused with their update (issue 21): their gradient's MACs count, not the update's
FUSED_GRAD_OPS = ("conv2d_grad_weight_update", "linear_grad_weight_update")

SCHEMES = {"full": et.Full(), "last8": et.LastK(8), "bias": et.BiasOnly()}
ASSETS = Path(__file__).resolve().parents[1] / ".." / "shared" / "assets" / "tiny-training"
#: where the ONNX Runtime training venv is looked for (under edgetrain's cache directory)
DEFAULT_ORT_VENV = "ort-venv"
#: seconds the ORT subprocess may take (export, artifacts and the timed steps)
ORT_TIMEOUT = 1800
#: the largest relative difference of ORT's first-step loss from eager's that counts as equal (float32
#: sums in another order; batch norm folded into the weights)
ORT_LOSS_RTOL = 1e-4


def _median_ms(ts):
    return 1e3 * statistics.median(ts)


def _wall_ms(times: dict) -> dict:
    """Each system's median wall time (`<k>_ms`) and fastest repeat (`<k>_min_ms`), in ms."""
    out = {}
    for k, ts in times.items():
        out[f"{k}_ms"] = round(_median_ms(ts), 3)
        out[f"{k}_min_ms"] = round(1e3 * min(ts), 3)
    return out


def torch_step_fn(model, prog, x, y, lr, momentum, compiled=False):
    trained = set(prog.trainable)
    names = {k: v for k, v in prog.state_aliases.items()}
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


def cflags(args, portable: bool = False) -> tuple:
    """The C library's compiler flags: the backend's default, without ET_FLOAT_FMA (--no-fma),
    without the BLAS (`portable`)."""
    base = tuple(f for f in DEFAULT_CFLAGS if not (args.no_fma and f == "-DET_FLOAT_FMA") and f not in blas_flags())
    base += tuple(args.cflags.split())  # --cflags: an experiment's macros (ET_DNNL_PIECE, ...)
    return base if portable else base + blas_flags()  # the BLAS asked for explicitly (opt-in by default)


def threaded(args) -> bool:
    """Whether `c` / `c_raw` run on the threaded library (--build; auto: above one thread)."""
    return args.build in ("threaded", "both") or (args.build == "auto" and args.threads > 1)


def c_program(args, compiled, portable: bool = False, serial: bool = False, extra: tuple = ()):
    """The C program of `compiled`: the threaded library on --threads threads (threaded(args), not `serial`),
    else the serial default library (its BLAS on EDGETRAIN_BLAS_THREADS threads); `extra`: more flags."""
    if threaded(args) and not serial:
        return to_c_program(compiled, cflags(args, portable) + ("-fopenmp",) + extra, threads=args.threads)
    return to_c_program(compiled, cflags(args, portable) + extra)


def gemm_flops(prog) -> int:
    """2 x the MACs of the training step's convolutions and dense layers, the weight gradients
    fused with their update included (their cost's MACs less the update's 2 per weight)."""
    macs = 0
    for n in prog.train_graph.nodes:
        if n.op in GEMM_OPS:
            macs += get_op(n.op).cost(n).macs
        elif n.op in FUSED_GRAD_OPS:
            macs += get_op(n.op).cost(n).macs - 2 * n.inputs[2].type.numel
    return 2 * macs


#: the convolution passes of the training graph, as --profile names them (float and int8 programs)
CONV_PASSES = {"conv2d": "forward", "conv2d_grad_input": "input gradient", "conv2d_grad_weight": "weight gradient",
               "conv2d_grad_weight_update": "weight gradient + update"}
INT8_CONV_PASSES = {"qconv2d": "forward", "qconv2d_grad_input": "input gradient",
                    "qconv2d_dw_grad_input": "input gradient", "qconv2d_grad_weight": "weight gradient",
                    "qconv2d_grad_weight_update": "weight gradient + update"}


def _conv_kind(ws, groups: int) -> str:
    o, cg, kh, kw = ws
    return ("depthwise" if cg == 1 and groups == o else "grouped") if groups > 1 else \
        ("pointwise" if kh == kw == 1 else "dense")


def node_kind(node) -> str:
    """--profile's name for `node`: a convolution by its kind and pass ("depthwise conv, forward"; an int8
    program's "int8 depthwise conv, forward"), else its op."""
    a = node.attrs
    if node.op in INT8_CONV_PASSES:
        if node.op == GRAD_UPDATE_OP:
            a = split_grad_update(a)[0]
        ws = a.get("weight_shape") or node.inputs[1].type.shape
        return f"int8 {_conv_kind(ws, int(a.get('groups', 1)))} conv, {INT8_CONV_PASSES[node.op]}"
    if node.op not in CONV_PASSES:
        return node.op
    fused = node.op.endswith("_update")
    ws = a.get("gw_weight_shape" if fused else "weight_shape") or node.inputs[2 if fused else 1].type.shape
    return f"{_conv_kind(ws, int(a.get('gw_groups' if fused else 'groups', 1)))} conv, {CONV_PASSES[node.op]}"


def profile_row(args, compiled, xin, yin) -> dict:
    """--profile: milliseconds per raw step of each node_kind in a build with PROFILE_FLAG, and the steps' wall time."""
    prog = c_program(args, compiled, portable=args.kernels == "portable", extra=(PROFILE_FLAG,))
    for _ in range(args.warmup):
        prog.runner.raw_step(xin, yin)
    before = prog.runner.node_seconds("train")
    t = time.perf_counter()
    for _ in range(args.repeats):
        prog.runner.raw_step(xin, yin)
    wall = (time.perf_counter() - t) / args.repeats
    per = (prog.runner.node_seconds("train") - before) / args.repeats
    kinds: dict = {}
    for node, sec in zip(prog.runner.c_layout.graphs["train"].graph.nodes, per):
        kind = node_kind(node)
        kinds[kind] = kinds.get(kind, 0.0) + float(sec)
    ms = {k: round(v * 1e3, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}
    return {"profile_step_ms": round(wall * 1e3, 3), "profile_ms": ms}


def profile_table(row) -> str:
    """A row's --profile figures as markdown: each kind's milliseconds per step and share of the step."""
    step = row["profile_step_ms"]
    lines = [f"{row['model']} {row['size']}x{row['size']} b{row['batch']} {row['scheme']}: {step:.2f} ms per "
             f"profiled step", "", "| nodes | ms per step | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.3f} | {100 * v / step:.1f} % |" for k, v in row["profile_ms"].items() if v >= 0.0005]
    rest = step - sum(row["profile_ms"].values())
    lines.append(f"| outside the nodes (the call, the loss's return) | {rest:.3f} | {100 * rest / step:.1f} % |")
    return "\n".join(lines)


def bench_float(args, name, scheme_key, batch, out):
    lr, mom = args.lr, 0.9
    model = et.models.get(args.model, num_classes=10).eval()
    x = torch.randn(batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    y = np.arange(batch) % 10
    compiled = et.compile(model, (x,), update=SCHEMES[scheme_key], optimizer=et.SGD(lr=lr, momentum=mom))
    t0 = time.perf_counter()
    prog = c_program(args, compiled, portable=args.kernels == "portable")
    build_s = time.perf_counter() - t0
    xin = np.ascontiguousarray(x.numpy())
    yin = np.ascontiguousarray(y.astype(np.int64))
    tmodel = et.models.get(args.model, num_classes=10).eval()
    tstep = torch_step_fn(tmodel, prog, x, y, lr, mom)
    runs = {"c": lambda: prog.step(x, y), "c_raw": lambda: prog.runner.raw_step(xin, yin), "torch": tstep}
    if args.kernels == "both":
        old = to_c_program(et.compile(model, (x,), update=SCHEMES[scheme_key], optimizer=et.SGD(lr=lr, momentum=mom)),
                           cflags(args, portable=True))
        runs["c_portable_raw"] = lambda: old.runner.raw_step(xin, yin)
    if args.build == "both":
        ser = c_program(args, et.compile(model, (x,), update=SCHEMES[scheme_key], optimizer=et.SGD(lr=lr, momentum=mom)),
                        portable=args.kernels == "portable", serial=True)
        runs["c_serial_raw"] = lambda: ser.runner.raw_step(xin, yin)
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
    cpu = {k: [] for k in runs}
    # a new order each repeat, so that every system follows every other alike (a step right after
    # PyTorch's finds the caches cold, one right after its own warm); a rotation kept each system's
    # predecessor fixed
    order, rng = list(runs.items()), np.random.default_rng(0)
    try:
        for _ in range(args.warmup):
            for f in runs.values():
                f()
        for _ in range(args.repeats):
            for j in rng.permutation(len(order)):
                k, f = order[j]
                t, tc = time.perf_counter(), time.thread_time()
                f()
                times[k].append(time.perf_counter() - t)
                cpu[k].append(time.thread_time() - tc)
    except et.NonFiniteLossError as err:  # a run that blew up times no step of the model: stop, say so
        raise SystemExit(f"step_speed: {args.model} b{batch} {scheme_key} blew up at lr {lr} after {args.warmup} "
                         f"warm-up and {len(times['c'])} timed repeats ({err}); give a smaller --lr or fewer "
                         "--repeats") from None
    flops = gemm_flops(prog)
    row = {"model": args.model, "size": args.size, "batch": batch, "scheme": scheme_key, "dtype": "float32",
           "kernels": prog.runner.kernels, "c_build": "threaded" if threaded(args) else "serial",
           "threads": args.threads, "build_s": round(build_s, 1),
           "trained_weights": int(sum(prog.state[p].size for p in prog.trainable)), "gemm_gflop": round(flops / 1e9, 3)}
    row.update(_wall_ms(times))
    if args.threads == 1:  # this thread's CPU time: the other agents' load on a shared machine left out
        for k, ts in cpu.items():
            row[f"{k}_cpu_ms"] = round(_median_ms(ts), 3)
    for k in ("c_raw", "c_portable_raw", "c_serial_raw", "torch"):
        if f"{k}_ms" in row:
            row[f"{k}_gflops"] = round(flops / row.get(f"{k}_cpu_ms", row[f"{k}_ms"]) / 1e6, 1)
    if args.ort_exe is not None:
        row.update(ort_row(args, args.ort_exe, model, prog, x, y, lr))
    row["speedup_vs_torch"] = round(row.get("torch_cpu_ms", row["torch_ms"]) / row.get("c_cpu_ms", row["c_ms"]), 2)
    if "torch_compile_ms" in row:
        row["speedup_vs_torch_compile"] = round(row["torch_compile_ms"] / row["c_ms"], 2)
    if args.profile:  # after the timed runs, so that its build and steps do not disturb them
        row.update(profile_row(args, et.compile(model, (x,), update=SCHEMES[scheme_key],
                                                  optimizer=et.SGD(lr=lr, momentum=mom)), xin, yin))
    out.append(row)
    print(json.dumps(row), flush=True)


def ort_python(args):
    """The ORT venv's python, or None (with a message saying how to make it)."""
    exe = Path(args.ort_python) if args.ort_python else cache_root() / DEFAULT_ORT_VENV / "bin" / "python"
    if exe.exists():
        return exe
    print(f"# ONNX Runtime training: skipped (no {exe}); make it with: python -m venv {exe.parent.parent} && "
          f"{exe.parent}/pip install torch==2.13.0 onnx==1.17.0 onnxruntime-training==1.19.2 scipy", file=sys.stderr)
    return None


def ort_row(args, exe, model, prog, x, y, lr) -> dict:
    """bench/ort_step.py's figures for this model, weights, batch and trained set (module docstring)."""
    aliases = prog.state_aliases  # torch name -> program name, as torch_step_fn reads it
    trained = [k for k, _ in model.named_parameters() if aliases.get(k, k) in prog.trainable]
    with tempfile.TemporaryDirectory(prefix="et-ort-") as d:
        work = Path(d)
        job = {"model": args.model, "lr": lr, "trained": trained, "repeats": args.repeats, "warmup": args.warmup}
        (work / "job.json").write_text(json.dumps(job))
        np.save(work / "x.npy", np.ascontiguousarray(x.numpy()))
        np.save(work / "y.npy", np.asarray(y, dtype=np.int64))
        torch.save(model.state_dict(), work / "state.pt")
        src = Path(et.__file__).resolve().parents[1]  # the edgetrain this bench imported
        env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
        r = subprocess.run([str(exe), str(Path(__file__).resolve().parent / "ort_step.py"), str(work)], env=env,
                           capture_output=True, text=True, timeout=ORT_TIMEOUT)
    if r.returncode != 0:
        print(f"# ONNX Runtime training failed:\n{r.stderr[-3000:]}", file=sys.stderr)
        return {}
    row = json.loads(r.stdout.strip().splitlines()[-1])
    if row["ort_loss_rel_diff"] > ORT_LOSS_RTOL:  # not the same model or weights: say so beside the figures
        print(f"# ONNX Runtime training: first-step loss {row['ort_first_loss']} != eager's {row['eager_first_loss']}",
              file=sys.stderr)
    return row


def bench_int8(args, scheme_key, out):
    from edgetrain.models import from_tiny_training

    path = ASSETS / f"{args.model}.pkl"
    if not path.exists():
        print(f"# int8: skipped (no {path})", file=sys.stderr)
        return
    model = from_tiny_training(path, num_classes=10)
    b = args.int8_batch
    x = torch.randn(b, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    y = np.arange(3, 3 + b) % 10
    opt = et.SGD(lr=args.lr)
    def compiled():
        return et.compile(model, (x,), update=SCHEMES[scheme_key], quantize="int8", optimizer=opt)

    t0 = time.perf_counter()
    prog = c_program(args, compiled())  # the threaded library on --threads threads where threaded(args)
    build_s = time.perf_counter() - t0
    runner = prog.runner
    g = runner.compiled.train_graph
    xin, yin = runner.input_bytes(g, x, training=True), np.ascontiguousarray(runner.label_feed(g, y))
    losses: list = []
    runs = {"c": lambda: losses.append(prog.step(x, y)), "c_raw": lambda: runner.raw_step(xin, yin)}
    if not args.no_reference:
        ref = compiled()
        runs["reference"] = lambda: ref.step(x, y)
    if args.build == "both":
        serial = c_program(args, compiled(), serial=True).runner
        runs["c_serial_raw"] = lambda: serial.raw_step(xin, yin)
    times = {k: [] for k in runs}
    for _ in range(max(1, args.warmup // 2)):
        for f in runs.values():
            f()
    for _ in range(max(3, args.repeats // 3)):
        for k, f in runs.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    row = {"model": args.model + " (tiny-training int8)", "size": args.size, "batch": b, "scheme": scheme_key,
           "dtype": "int8", "c_build": "threaded" if threaded(args) else "serial", "threads": args.threads,
           "build_s": round(build_s, 1), "lr": args.lr, "loss_first": round(losses[0], 4),
           "loss_last": round(losses[-1], 4)}
    row.update(_wall_ms(times))
    if "reference_ms" in row:
        row["speedup_vs_reference"] = round(row["reference_ms"] / row["c_ms"], 2)
    if args.profile:  # after the timed runs, as for the float rows
        row.update(profile_row(args, compiled(), xin, yin))
    out.append(row)
    print(json.dumps(row), flush=True)


def table(rows, peak) -> str:
    """Markdown: the CPU-time medians where measured (one thread), else wall time."""
    def ms(r, k):
        return r.get(f"{k}_cpu_ms", r.get(f"{k}_ms", ""))

    serial = any("c_serial_raw_ms" in r for r in rows)  # --build both: the serial library's column
    lines = [f"single-thread sgemm peak: {peak} GFLOP/s" if peak else "single-thread sgemm peak: no BLAS", "",
             "| model | batch | scheme | dtype | C step (ms) | C raw (ms) | " + ("C serial raw (ms) | " if serial else "") +
             "C portable raw (ms) | PyTorch eager (ms) | "
             "torch.compile (ms) | ONNX Runtime training (ms) | reference (ms) | speedup | "
             "GFLOP/s C raw / portable / eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if serial else "")]
    for r in rows:
        sp = r.get("speedup_vs_torch", r.get("speedup_vs_reference"))
        gf = " / ".join(str(r.get(f"{k}_gflops", "")) for k in ("c_raw", "c_portable_raw", "torch"))
        ser = f"{ms(r, 'c_serial_raw')} | " if serial else ""
        lines.append(f"| {r['model']} {r['size']}x{r['size']} | {r.get('batch', 1)} | {r['scheme']} | {r['dtype']} | "
                     f"{ms(r, 'c')} | {ms(r, 'c_raw')} | {ser}{ms(r, 'c_portable_raw')} | {ms(r, 'torch')} | "
                     f"{ms(r, 'torch_compile')} | {ms(r, 'ort')} | {ms(r, 'reference')} | {f'{sp}x' if sp else ''} | {gf} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mbv2-w0.35")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--schemes", default="full,last8")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-int8", action="store_true")
    ap.add_argument("--int8-batch", type=int, default=1, help="batch of the int8 step (default 1, the paper's)")
    ap.add_argument("--no-reference", action="store_true", help="leave the int8 step's reference runtime out")
    ap.add_argument("--torch-compile", action="store_true")
    ap.add_argument("--no-fma", action="store_true",
                    help="build the C library without explicit fused multiply-adds (the emitted projects' numerics)")
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes of the float steps")
    ap.add_argument("--kernels", choices=("blas", "portable", "both"), default="blas",
                    help="the host library's convolutions and dense layers: the BLAS (where installed), the "
                         "dependency-free kernels, or both side by side")
    ap.add_argument("--threads", type=int, default=1, help="threads of the C library (BLAS and kernels) and of PyTorch")
    ap.add_argument("--build", choices=("auto", "serial", "threaded", "both"), default="auto",
                    help="the C library: auto = the serial default at --threads 1, the threaded one above; both = "
                         "the threaded one (c, c_raw) and the serial default (c_serial_raw) side by side")
    ap.add_argument("--ort-python", default="", help="the python of the ONNX Runtime training venv (default: "
                    f"{DEFAULT_ORT_VENV}/bin/python under edgetrain's cache directory)")
    ap.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime training out")
    ap.add_argument("--cflags", default="", help="more compiler flags for the C libraries, space-separated (an "
                    "experiment's macros, e.g. --cflags=-DET_DNNL_PIECE=16; every build of the run gets them)")
    ap.add_argument("--profile", action="store_true", help="per row, the milliseconds per step of each kind "
                    "of node, from one more build that clocks every node (host.PROFILE_FLAG)")
    ap.add_argument("--lr", type=float, default=0.001, help="the SGD learning rate (the float steps' with momentum 0.9, the int8 step's without); "
                    "a float step's work does not depend on it, an int8 step's does (a run that blows up skips "
                    "most gradient sums); a float run that blows up is stopped (default 0.001)")
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args(argv)
    if not (args.lr > 0 and np.isfinite(args.lr)):
        ap.error(f"--lr must be a positive number, got {args.lr}")
    args.ort_exe = None if args.no_ort else ort_python(args)
    os.environ["EDGETRAIN_BLAS_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    peak = sgemm_peak_gflops(threads=args.threads)
    peak = round(peak, 1) if peak else None
    print(json.dumps({"sgemm_peak_gflops": peak, "sgemm_kernels": sgemm_kernels(), "threads": args.threads,
                      "kernels": blas_describe(cflags(args, portable=args.kernels == "portable"))}), flush=True)
    rows = []
    keys = [k for k in args.schemes.split(",") if k]
    for b in (int(v) for v in args.batch.split(",") if v):
        for k in keys:
            bench_float(args, args.model, k, b, rows)
    if not args.no_int8:
        for k in keys:
            bench_int8(args, k, rows)
    if not args.json_only:
        print()
        print(table(rows, peak))
        for r in rows:
            if "profile_ms" in r:
                print()
                print(profile_table(r))


if __name__ == "__main__":
    main()
