"""The host step on 1, 2, 4, ... threads against PyTorch eager on the same threads (issue 35, item 3).

    PYTHONPATH=src python bench/thread_scaling.py [--threads 1,2,4,8,16] [--models resnet18-cifar:32,mbv2-w0.35:128]
        [--batch 8] [--repeats 9] [--warmup 2] [--int8] [--cflags="-D..."] [--label NAME] [--out rows.jsonl]
        [--time-limit SECONDS]
    PYTHONPATH=src python bench/thread_scaling.py --from rows.jsonl   # the table of rows of several runs

For each model and thread count, one process of bench/step_speed.py with `--threads T --build both`
(batch --batch, Full, float32; with --int8 also the paper's int8 mbv2-w0.35 at the same batch where
its model file is there): the threaded library's public step (`c`) and raw step (`c_raw`), the serial
default library's raw step with its BLAS alone on T threads (`c_serial_raw`), and PyTorch eager on T
threads (`torch`), interleaved in one process. Thread counts above the cores this process may run on are left out (a
thread count the machine lacks measures the scheduler, not the library). Each row is appended to --out
as it comes, so a run stopped by --time-limit keeps what it measured; --from prints the table of such a file
(rows of several runs, each thread count's efficiency against the one-thread row of the same name).

The table gives wall-time medians (ms) and each system's parallel efficiency at T threads, its own
one-thread time over T x its time at T threads (the threaded library's raw step against its own one-thread
raw step; eager against eager's one thread), and how far the public C step is ahead of eager
(eager's time over it). Every figure is wall time, also at one thread, so the rows compare alike.
Run it on a quiet machine: other work on the cores makes the many-thread rows meaningless. Each system
trains one batch over and over at step_speed's learning rate with momentum. At lr 0.01, step_speed's until
2026-12-02, ResNet-18 blew up after 14 public steps with --repeats 15; at lr 0.001, its default since then,
step_speed's ResNet-18 row runs 21 repeats, and a run that still blows up stops with one line that says so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the systems of a row, in the table's order (an int8 row has no `torch`)
KEYS = ("c", "c_raw", "c_serial_raw", "torch")


def step_speed_cmd(model: str, size: int, threads: int, args, int8: bool) -> list:
    cmd = [sys.executable, str(HERE / "step_speed.py"), "--model", model, "--size", str(size),
           "--batch", str(args.batch), "--schemes", "full", "--kernels", "blas", "--no-ort",
           "--repeats", str(args.repeats), "--warmup", str(args.warmup), "--threads", str(threads),
           "--build", "both", "--json-only"]
    if args.cflags:
        cmd += [f"--cflags={args.cflags}"]  # with '=': the flags' leading '-' is not an option
    if int8:
        cmd += ["--int8-batch", str(args.batch), "--no-reference"]
    else:
        cmd += ["--no-int8"]
    return cmd


def run_one(cmd: list, timeout: float) -> list:
    """The JSON lines of one step_speed process (its first line, the BLAS and sgemm peak, included)."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-4000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def efficiency(t1: float | None, t: float | None, threads: int) -> str:
    if not t1 or not t:
        return ""
    return f"{100 * t1 / (threads * t):.0f} %"


def table(rows: list) -> str:
    """Markdown: one line per (model row, threads), with each system's parallel efficiency."""
    lines = ["| step | threads | C step (ms) | C raw (ms) | serial library raw, BLAS on T threads (ms) | "
             "PyTorch eager (ms) | C ahead of eager | C raw efficiency | eager efficiency |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    one = {}
    for r in rows:
        if r["threads"] == 1:
            one[r["name"]] = r
    for r in rows:
        base = one.get(r["name"], {})
        t = r["threads"]
        ahead = f"{r['torch_ms'] / r['c_ms']:.2f}x" if "torch_ms" in r else ""
        cells = [r["name"], str(t)] + [f"{r[f'{k}_ms']:.1f}" if f"{k}_ms" in r else "" for k in KEYS]
        cells += [ahead, efficiency(base.get("c_raw_ms"), r.get("c_raw_ms"), t),
                  efficiency(base.get("torch_ms"), r.get("torch_ms"), t)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2,4,8,16", help="comma-separated thread counts")
    ap.add_argument("--models", default="resnet18-cifar:32,mbv2-w0.35:128", help="comma-separated model:size")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--int8", action="store_true", help="also the paper's int8 mbv2-w0.35 (its model file needed)")
    ap.add_argument("--cflags", default="", help="more compiler flags for the C libraries (step_speed.py --cflags)")
    ap.add_argument("--label", default="", help="a name for this run's rows (the table's step column)")
    ap.add_argument("--out", default="", help="append each row to this JSON-lines file as it comes")
    ap.add_argument("--time-limit", type=float, default=0, help="seconds for the whole run (0: none)")
    ap.add_argument("--from", dest="from_file", default="", help="measure nothing: the table of this --out file")
    args = ap.parse_args(argv)
    if args.from_file:
        with open(args.from_file) as f:
            print(table(sorted((json.loads(line) for line in f if line.strip()),
                               key=lambda r: (r["name"], r["threads"]))))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    counts = [int(v) for v in args.threads.split(",") if v]
    left_out = [t for t in counts if t > cores]
    counts = [t for t in counts if t <= cores]
    if left_out:
        print(f"# left out: {left_out} threads (this machine has {cores} cores)", file=sys.stderr)
    jobs = []
    for spec in (s for s in args.models.split(",") if s):
        model, _, size = spec.partition(":")
        for t in counts:
            jobs.append((model, int(size or 32), t, args.int8 and model == "mbv2-w0.35"))
    start, rows = time.monotonic(), []
    out = open(args.out, "a") if args.out else None
    for model, size, t, int8 in jobs:
        left = args.time_limit - (time.monotonic() - start) if args.time_limit else None
        if left is not None and left <= 0:
            print(f"# time limit: {model} at {t} threads and after left out", file=sys.stderr)
            break
        t0 = time.monotonic()
        try:
            lines = run_one(step_speed_cmd(model, size, t, args, int8), left)
        except subprocess.TimeoutExpired:
            print(f"# time limit: {model} at {t} threads stopped, the rest left out", file=sys.stderr)
            break
        head, got = lines[0], lines[1:]
        for r in got:
            r["name"] = f"{r['model']} {r['size']}x{r['size']} b{r['batch']} {r['scheme']} {r['dtype']}" + (
                f" ({args.label})" if args.label else "")
            r["cflags"] = args.cflags
            r["sgemm_peak_gflops"], r["sgemm_kernels"] = head.get("sgemm_peak_gflops"), head.get("sgemm_kernels")
            r.setdefault("kernels", head.get("kernels"))
            rows.append(r)
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
        print(f"# {model} {t} threads: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    if out:
        out.close()
    rows.sort(key=lambda r: (r["name"], r["threads"]))
    print(f"cores: {cores}; BLAS: {rows[0]['kernels'] if rows else '-'}")
    print(table(rows))


if __name__ == "__main__":
    main()
