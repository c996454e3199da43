"""One LoRA training step of a decoder: PyTorch eager + peft (the peer) beside edgetrain's
standalone host binary, peak RSS and seconds per step, in one run (issue 32, deliverable 5).

    PYTHONPATH=src python bench/lora_step.py [--case smollm2-135m|qwen2.5-0.5b] [--threads 1 2]
        [--steps 3] [--peer-dtypes float32 bfloat16] [--work DIR] [--out docs/results/lora-step.jsonl]

A case is a transformers config with a published model's sizes, random init (seeded):
"smollm2-135m" (LlamaConfig: hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536,
vocab 49,152, tied embeddings), "qwen2.5-0.5b" (Qwen2Config: hidden 896, 24 layers, 14 heads,
2 KV heads, intermediate 4864, vocab 151,936, tied embeddings). LoRA rank 8, alpha 16 on
q_proj / v_proj, sequence 256, batch 1, SGD lr 0.01 without momentum, the causal LM loss
(labels = the input ids).

Rows, each measured in a process of its own so its peak RSS (VmHWM) is that configuration's:
- peer: PyTorch eager + peft 0.21 (get_peft_model, `model(ids, labels=ids).loss`, backward,
  torch.optim.SGD), float32 and bfloat16 (the model cast before peft), on each thread count
  (torch.set_num_threads): peak RSS, the median of --steps steps after a warm-up step;
- edgetrain: `et.compile(..., update=et.LoRA(8, 16, ("q_proj", "v_proj")), loss="causal_lm")`
  (frozen=None / "int8" / "int4": the base weights stored float32 or quantized) emitted as a host project (weights in weights.bin, frozen weights mapped: bench/lm_memory.py),
  built with `make main` (the host BLAS) and run with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS
  set to the thread count: its printed peak RSS and median step; and for each --fractions f < 1
  the same program under POET's schedule (with the last --frozen storage) at fixed RAM + f x activation bytes (its MILP with
  --time-limit), executed on one thread.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import lm_memory  # noqa: E402  (make_model, run_binary)

CASES = {
    "smollm2-135m": dict(family="llama", hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152),
    "qwen2.5-0.5b": dict(family="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                         vocab=151936),
    "tiny": dict(family="llama", hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, vocab=512),
}
SEQ, BATCH, LR = 256, 1, 0.01


def _args(case: str, seq: int):
    return argparse.Namespace(**CASES[case], seq=seq, batch=BATCH, no_tie=False, scheme="lora")


def vm_hwm_kb() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def peer_worker(case: str, dtype: str, threads: int, steps: int, seq: int) -> dict:
    """PyTorch eager + peft: one configuration, in this (fresh) process."""
    torch.set_num_threads(threads)
    model, ids, _ = lm_memory.make_model(_args(case, seq))
    import peft

    lm = model.lm.to(getattr(torch, dtype)).train()
    cfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    lm = peft.get_peft_model(lm, cfg)
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=LR)
    times, losses = [], []
    for i in range(steps + 1):
        t = time.perf_counter()
        loss = lm(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i:  # the first step warms up
            times.append(time.perf_counter() - t)
        losses.append(float(loss))
    return {"step_s": round(statistics.median(times), 3), "peak_rss_kb": vm_hwm_kb(), "losses": losses}


def edgetrain_projects(case: str, work: Path, seq: int, fractions, time_limit: float, frozens=(None,)):
    """Compile the LoRA program of `case`; for each fraction f emit and build it (f < 1: under
    POET's schedule at ram = fixed + f * activation bytes on the A72 profile, as
    bench/lm_memory.py does); yield (project dir, facts)."""
    import edgetrain as et
    from edgetrain.backends.c.layout import build_layout
    from edgetrain.backends.c.weights_file import host_step_ram

    from edgetrain.devices import get_device
    from edgetrain.remat.build import build_problem
    from edgetrain.remat.plan import Infeasible

    model, ids, _ = lm_memory.make_model(_args(case, seq))
    for frozen in frozens:
        yield from _projects(et, model, ids, frozen, work, case, fractions if frozen == frozens[-1] else [1.0],
                             time_limit, get_device, build_problem, build_layout, host_step_ram, Infeasible)


def _projects(et, model, ids, frozen, work, case, fractions, time_limit, get_device, build_problem, build_layout,
              host_step_ram, Infeasible):
    t = time.perf_counter()
    prog = et.compile(model, (ids,), loss="causal_lm", update=et.LoRA(rank=8, alpha=16, targets=("q_proj", "v_proj")),
                      optimizer=et.SGD(lr=LR), frozen=frozen)
    compile_s = time.perf_counter() - t
    problem = build_problem(prog, get_device("a72"))
    for f in fractions:
        facts = {"frozen": frozen, "compile_s": round(compile_s, 2), "fraction": f,
                 "trained_tensors": len(prog.trainable)}
        run_prog = prog
        if f < 1:
            t = time.perf_counter()
            try:
                sched = et.schedule(prog, device="a72", ram=problem.fixed_ram + int(f * problem.activation_bytes),
                                    time_limit=time_limit, mip_rel_gap=0.01)
            except Infeasible as err:
                print(f"fraction {f}: {err}", flush=True)
                continue
            run_prog = prog.apply(sched)
            facts.update(schedule_s=round(time.perf_counter() - t, 2), solver_status=sched.status,
                         page_ins=sched.page_ins, recomputations=sched.recomputations,
                         extra_energy=round(sched.energy_j / problem.base_energy_j - 1, 5))
        d = work / f"{case}-{frozen or 'float32'}-f{f}"
        t = time.perf_counter()
        run_prog.emit_c(d, target="host", samples=[(ids.numpy(), ids.numpy())], embed_weights=False,
                        graphs=("train",))
        subprocess.run(["make", "-s", "-B", "main", "MAP_WEIGHTS=1"], cwd=d, check=True, capture_output=True)
        ram = host_step_ram(build_layout(run_prog, ("train",)), mapped=True)
        facts.update(build_s=round(time.perf_counter() - t, 2), modelled_kb=ram["modelled"] // 1024,
                     arena_kb=ram["arena"] // 1024, frozen_window_kb=ram["frozen_window"] // 1024)
        yield d, facts


def run_edgetrain(d: Path, threads: int, steps: int) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "EDGETRAIN_BLAS_THREADS": str(threads)}  # the binary's BLAS reads this one (backends/c/blas.py)
    old = dict(os.environ)
    os.environ.update(env)
    try:
        r = lm_memory.run_binary(d, steps + 1)
    finally:
        os.environ.clear()
        os.environ.update(old)
    return {"step_s": r["step_s"], "peak_rss_kb": r["measured_kb"], "losses": r["losses"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=tuple(CASES), default="smollm2-135m")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=SEQ)
    ap.add_argument("--peer-dtypes", nargs="*", default=["float32", "bfloat16"])
    ap.add_argument("--fractions", nargs="+", type=float, default=[1.0, 0.3],
                    help="edgetrain runs: 1 = plain back-propagation; f < 1: under a POET schedule at "
                         "fixed RAM + f * activation bytes (one thread)")
    ap.add_argument("--frozen", nargs="+", choices=("none", "int8", "int4"), default=["none", "int8", "int4"],
                    help="edgetrain's frozen-weight storage (compile(frozen=...)); the schedules (--fractions < 1) "
                         "run with the last one")
    ap.add_argument("--time-limit", type=float, default=120.0, help="the schedule's MILP time limit (s)")
    ap.add_argument("--work", default="/tmp/lora-step")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", nargs=3, metavar=("DTYPE", "THREADS", "STEPS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(peer_worker(a.case, a.worker[0], int(a.worker[1]), int(a.worker[2]), a.seq)))
        return 0
    rows = []
    base = {"case": a.case, "seq": a.seq, "batch": BATCH, "steps": a.steps, "lora": "r8 a16 q_proj,v_proj"}

    def keep(row):  # each row written as soon as it is measured
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps({**base, **row}) + "\n")

    for dtype in a.peer_dtypes:
        for t in a.threads:
            r = subprocess.run([sys.executable, __file__, "--case", a.case, "--seq", str(a.seq),
                                "--worker", dtype, str(t), str(a.steps)], capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(r.stderr[-3000:])
            keep({"system": "pytorch+peft", "dtype": dtype, "threads": t,
                  **json.loads(r.stdout.strip().splitlines()[-1])})
    frozens = tuple(None if f == "none" else f for f in a.frozen)
    for d, facts in edgetrain_projects(a.case, Path(a.work), a.seq, a.fractions, a.time_limit, frozens):
        for t in a.threads if facts["fraction"] >= 1 else a.threads[:1]:
            keep({"system": "edgetrain", "dtype": "float32", "threads": t, **facts, **run_edgetrain(d, t, a.steps)})
    print(f"\n{a.case}, sequence {a.seq}, batch {BATCH}, LoRA rank 8 on q_proj/v_proj")
    print(f"{'system':14} {'dtype':9} {'frozen':>6} {'schedule':>8} {'threads':>7} {'peak RSS MB':>12} {'s/step':>8}")
    for r in rows:
        f, fz = r.get("fraction", ""), r.get("frozen") or ("" if r["system"] != "edgetrain" else "f32")
        print(f"{r['system']:14} {r['dtype']:9} {fz:>6} {f:>8} {r['threads']:>7} {r['peak_rss_kb'] / 1024:>12.1f} "
              f"{r['step_s']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
