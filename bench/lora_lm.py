"""A decoder's LoRA training step at a published model's size: PyTorch eager + peft (the peer) beside
edgetrain's standalone host binary with its frozen base stored float32, int8 or int4, peak RSS, seconds
per step and the loss, on 1 and 2 threads, and the smallest RAM budget POET's schedule meets with the
int4 base, executed (issue 32, deliverable 5).

    PYTHONPATH=src python bench/lora_lm.py [--case smollm2-135m|qwen2.5-0.5b|tiny] [--threads 1 2] [--steps 3]
        [--peer-dtypes float32 bfloat16] [--frozen none int8 int4] [--smallest int4|none] [--time-limit 120]
        [--mapped-weights off|on|both]
        [--work DIR] [--out docs/results/lora-lm.jsonl]
    PYTHONPATH=src python bench/lora_lm.py --tables docs/results/lora-lm.jsonl [--max-load 2]   # saved rows

A case is a transformers config with a published model's sizes and random init (seeded):
"smollm2-135m" (LlamaConfig: hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536, vocab 49,152,
tied embeddings), "qwen2.5-0.5b" (Qwen2Config: hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate
4864, vocab 151,936, tied embeddings); "tiny" (hidden 64, 2 layers, vocab 512, sequence 16) is for tests.
LoRA rank 8, alpha 16 on q_proj / v_proj, sequence 256, batch 1, SGD lr 1e-3 without momentum, the causal
LM loss with labels = the input ids (Hugging Face's: logits[:, :-1] against ids[:, 1:]).

Every measurement runs in a fresh process of its own, so its peak RSS (VmHWM) is that configuration's:
- peer (`--worker`, this script): PyTorch eager + peft (get_peft_model, `model(ids, labels=ids).loss`,
  backward, torch.optim.SGD), float32 and bfloat16 (the model cast before peft), torch.set_num_threads(t);
  `import_kb` is the process's RSS after importing torch / transformers / peft, before the model exists;
  its adapters start equal to edgetrain's (prog.state_dict() loaded with set_peft_model_state_dict), so
  the losses of the two match step for step up to float32 rounding (bfloat16: its own rounding);
- edgetrain: `et.compile(..., loss="causal_lm", update=et.LoRA(8, 16, ("q_proj", "v_proj")), frozen=...)`
  emitted as a host project (weights in weights.bin, frozen weights mapped and released after use),
  built with `make main` (the host BLAS) and run as ./main with EDGETRAIN_BLAS_THREADS (the runtime's
  BLAS thread count; OPENBLAS_NUM_THREADS / OMP_NUM_THREADS too) = t: the peak RSS it prints (VmHWM) and
  `modelled_kb` (weights_file.host_step_ram: arena + RAM state + the frozen window);
- smallest: with the --smallest storage, the smallest `ram` POET's MILP (et.schedule, the A72 profile)
  meets: its proven lower bound (greedy.ram_lower_bound) if a schedule exists there, else the smallest
  RAM its min-RAM model finds (the Infeasible message), scheduled, applied, emitted and executed on one
  thread. `budget` is that ram in POET's account (the frozen weights counted whole: the A72 profile holds
  them in RAM); the binary maps them, so its measured RSS is below it. With --mapped-weights on (or both),
  the MILP pages the frozen weights too (build_problem's mapped_weights, remat/weights.py: each resident
  only where the schedule says, read again from the weights file otherwise) and the binary drops their
  pages where the schedule says: row schedule "smallest-mapped".

step_s is the median over --steps steps after one warm-up step; losses are every step's (warm-up first).
One JSON line per row (to --out when given) and a table.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CASES = {
    "smollm2-135m": dict(family="llama", hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152,
                         seq=256),
    "qwen2.5-0.5b": dict(family="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                         vocab=151936, seq=256),
    "tiny": dict(family="llama", hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, vocab=512, seq=16),
}
BATCH, LR, RANK, ALPHA, TARGETS = 1, 1e-3, 8, 16, ("q_proj", "v_proj")


def vm_hwm_kb() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def vm_rss_kb() -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def make_model(case: str):
    """(Logits-wrapped causal LM, ids) of `case`, random init seeded (bench/lm_memory.py's builder)."""
    import lm_memory

    a = argparse.Namespace(**CASES[case], batch=BATCH, no_tie=False, scheme="lora")
    model, ids, _ = lm_memory.make_model(a)
    return model, ids


def peer_worker(case: str, dtype: str, threads: int, steps: int, adapters: str = "") -> dict:
    """PyTorch eager + peft: one configuration, in this (fresh) process; `adapters`: a file of the
    initial adapters (prog.state_dict() of edgetrain's program) loaded into the peft model, so both
    start from the same point."""
    import torch

    torch.set_num_threads(threads)
    import lm_memory

    lm_memory._torchvision_schemas()
    import peft
    import transformers  # noqa: F401  (imported before the model, so import_kb counts it)

    import_kb = vm_rss_kb()
    model, ids = make_model(case)
    lm = model.lm.to(getattr(torch, dtype)).train()
    lm = peft.get_peft_model(lm, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                 target_modules=list(TARGETS)))
    if adapters:
        sd = {k.replace("base_model.model.lm.", "base_model.model.", 1): v.to(getattr(torch, dtype))
              for k, v in torch.load(adapters).items()}
        res = peft.set_peft_model_state_dict(lm, sd)
        if res.unexpected_keys:
            raise RuntimeError(f"adapters not loaded: {res.unexpected_keys[:3]}")
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=LR)
    times, losses = [], []
    for i in range(steps + 1):
        t = time.perf_counter()
        loss = lm(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t
        if i:  # the first step warms up
            times.append(dt)
        losses.append(round(float(loss), 6))
    return {"step_s": round(statistics.median(times), 3), "peak_rss_kb": vm_hwm_kb(), "import_kb": import_kb,
            "losses": losses}


def run_peer(case: str, dtype: str, threads: int, steps: int, adapters: str = "") -> dict:
    r = subprocess.run([sys.executable, __file__, "--case", case, "--worker", dtype, str(threads), str(steps)]
                       + (["--adapters", adapters] if adapters else []), capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"peer worker {case} {dtype} {threads} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_binary(d: Path, threads: int, steps: int) -> dict:
    """./main for 1 + `steps` steps in its own process on `threads` BLAS threads."""
    env = {**os.environ, **{k: str(threads) for k in ("EDGETRAIN_BLAS_THREADS", "OPENBLAS_NUM_THREADS",
                                                       "OMP_NUM_THREADS")}}
    r = subprocess.run(["./main", "weights.bin", "samples.bin", "--steps", str(steps + 1)], cwd=d, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{d}/main failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    times = [float(v) for v in re.findall(r"elapsed_s \d+ (\S+)", r.stdout)]
    return {"step_s": round(statistics.median(times[1:] or times), 3),
            "peak_rss_kb": int(re.search(r"peak_rss_kb (\d+)", r.stdout).group(1)),
            "before_steps_kb": int(re.search(r"rss_before_steps_kb (\d+)", r.stdout).group(1)),
            "losses": [round(float(v), 6) for v in re.findall(r"loss (\S+)", r.stdout)]}


def build(prog, ids, d: Path) -> dict:
    """Emit `prog` as a host project in `d` (weights in weights.bin), `make main` with mapped frozen
    weights; the modelled RAM of its step."""
    from edgetrain.backends.c.layout import build_layout
    from edgetrain.backends.c.weights_file import host_step_ram

    t = time.perf_counter()
    x = ids.numpy()
    prog.emit_c(d, target="host", samples=[(x, x)], embed_weights=False, graphs=("train",))
    subprocess.run(["make", "-s", "-B", "main", "MAP_WEIGHTS=1"], cwd=d, check=True, capture_output=True)
    ram = host_step_ram(build_layout(prog, ("train",)), mapped=True)
    return {"build_s": round(time.perf_counter() - t, 2), "modelled_kb": ram["modelled"] // 1024,
            "arena_kb": ram["arena"] // 1024, "frozen_window_kb": ram["frozen_window"] // 1024,
            "frozen_kb": ram["frozen"] // 1024}


def smallest_schedule(et, prog, time_limit: float, mip_gap: float, mapped_weights: bool = False):
    """(schedule, facts): POET's schedule at the smallest ram it meets (module docstring); with
    `mapped_weights`, the frozen weights paged too (remat/weights.py)."""
    from edgetrain.devices import get_device
    from edgetrain.remat.build import build_problem
    from edgetrain.remat.greedy import ram_lower_bound
    from edgetrain.remat.plan import Infeasible

    problem = build_problem(prog, get_device("a72"), mapped_weights=mapped_weights)
    lb = ram_lower_bound(problem)
    facts = {"fixed_ram": problem.fixed_ram, "activation_bytes": problem.activation_bytes, "lower_bound": lb,
             "mapped_weights": mapped_weights}
    kw = dict(device="a72", time_limit=time_limit, mip_rel_gap=mip_gap, mapped_weights=mapped_weights)
    t = time.perf_counter()
    try:
        sched, ram = et.schedule(prog, ram=lb, **kw), lb
    except Infeasible as e:
        if e.smallest_ram is None:
            raise RuntimeError(f"no schedule at the lower bound {lb:,} and no smallest RAM reported: {e}") from e
        ram = e.smallest_ram
        facts["infeasible_at_lower_bound"] = str(e)[:300]
        sched = et.schedule(prog, ram=ram, **kw)
    facts.update(weight_page_ins=sched.weight_page_ins, budget=ram, schedule_s=round(time.perf_counter() - t, 2),
                 schedule_peak=sched.peak_bytes,
                 solver_status=sched.status, gap=round(sched.gap, 5), page_ins=sched.page_ins,
                 recomputations=sched.recomputations,
                 extra_energy=round(sched.energy_j / problem.base_energy_j - 1, 5))
    return sched, facts


def edgetrain_rows(case: str, frozens, threads, steps: int, work: Path, smallest, time_limit: float, mip_gap: float,
                   adapters: Path, mapped_weights=(False,)):
    """Yield one row per (frozen storage, thread count), then the smallest-budget row; the first
    program's initial adapters are saved to `adapters` (peft's key names) for the peer."""
    import torch

    import edgetrain as et

    model, ids = make_model(case)
    for frozen in dict.fromkeys(list(frozens) + ([smallest] if smallest != "skip" else [])):
        t = time.perf_counter()
        prog = et.compile(model, (ids,), loss="causal_lm", update=et.LoRA(rank=RANK, alpha=ALPHA, targets=TARGETS),
                          optimizer=et.SGD(lr=LR), frozen=frozen)
        base = {"system": "edgetrain", "frozen": frozen or "float32", "compile_s": round(time.perf_counter() - t, 2),
                "trained_tensors": len(prog.trainable)}
        initial = {k: v.detach().clone() for k, v in prog.state_dict().items()}  # torch tensors (peft's keys)
        if not adapters.exists():
            adapters.parent.mkdir(parents=True, exist_ok=True)
            torch.save(initial, adapters)
        first = torch.load(adapters)
        base["same_initial_adapters"] = first.keys() == initial.keys() and all(torch.equal(first[k], initial[k])
                                                                               for k in first)
        if frozen in frozens:
            d = work / f"{case}-{frozen or 'float32'}"
            facts = build(prog, ids, d)
            for th in threads:
                yield {**base, **facts, "threads": th, **run_binary(d, th, steps)}
        for mw in (mapped_weights if frozen == smallest else ()):
            sched, sfacts = smallest_schedule(et, prog, time_limit, mip_gap, mw)
            d = work / f"{case}-{frozen or 'float32'}-smallest{'-mapped' if mw else ''}"
            facts = build(prog.apply(sched), ids, d)
            yield {**base, **sfacts, **facts, "threads": 1, "schedule": "smallest-mapped" if mw else "smallest",
                   **run_binary(d, 1, steps)}
        del prog


def table(rows, case: str) -> str:
    """The rows as a markdown table; the ratios are to PyTorch + peft float32 on as many threads
    (peak RSS) and to its step time on as many threads."""
    c = CASES[case]
    peer = {r["threads"]: r for r in rows if r["system"] == "pytorch+peft" and r.get("dtype") == "float32"}
    out = [f"{case}: sequence {c['seq']}, batch {BATCH}, LoRA rank {RANK} alpha {ALPHA} on {'/'.join(TARGETS)}, "
           f"SGD lr {LR:g}",
           "| system | weights | schedule | threads | peak RSS MiB | x PyTorch f32 | modelled MiB | s/step | "
           "x PyTorch f32 time | loss first -> last |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w = r.get("dtype") or r.get("frozen")
        sch = f"{r['schedule']} ({r['budget'] / 2**20:.1f} MiB)" if r.get("schedule", "").startswith("smallest") \
            else "-"
        mod = f"{r['modelled_kb'] / 1024:.1f}" if "modelled_kb" in r else "-"
        p = peer.get(r["threads"])
        rss = f"{r['peak_rss_kb'] / p['peak_rss_kb']:.3f}" if p else "-"
        slow = "time_under_load" in r or (p is not None and "time_under_load" in p)
        speed = f"{r['step_s'] / p['step_s']:.2f}" if p and p["step_s"] and not slow else "-"
        step = f"{r['step_s']:.3f}" + (f" (load {r['time_under_load']:.1f})" if "time_under_load" in r else "")
        out.append(f"| {r['system']} | {w} | {sch} | {r['threads']} | {r['peak_rss_kb'] / 1024:.1f} | {rss} | {mod} | "
                   f"{step} | {speed} | {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} |")
    return "\n".join(out)


def saved_tables(path: Path, max_load=None) -> str:
    """The tables of the rows in `path`: per configuration (case, system, weights, schedule,
    threads) the last row measured at a 1-minute load average of at most `max_load` (any load
    when None); when every row of a configuration was measured above it, the least loaded one,
    its time marked with the load (other jobs on the machine slowed it; its memory figures hold)."""
    last, loaded = {}, {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        key = (r["case"], r["system"], r.get("dtype") or r.get("frozen"), r.get("schedule"), r["threads"])
        if max_load is not None and r.get("loadavg_1m", 0.0) > max_load:
            if key not in loaded or r["loadavg_1m"] <= loaded[key]["loadavg_1m"]:
                loaded[key] = {**r, "time_under_load": r["loadavg_1m"]}
            continue
        last[key] = r
    last.update({k: r for k, r in loaded.items() if k not in last})
    out = []
    for c in dict.fromkeys(k[0] for k in last):
        mine = sorted((r for k, r in last.items() if k[0] == c), key=lambda r: r["system"] != "pytorch+peft")
        out.append(table(mine, c))
    return "\n\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=tuple(CASES), default="smollm2-135m")
    ap.add_argument("--tiny", action="store_true", help="the tiny case (same as --case tiny)")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--peer-dtypes", nargs="*", default=["float32", "bfloat16"], choices=("float32", "bfloat16"))
    ap.add_argument("--frozen", nargs="*", choices=("none", "int8", "int4"), default=["none", "int8", "int4"])
    ap.add_argument("--smallest", choices=("none", "int8", "int4", "skip"), default="int4",
                    help="the frozen storage of the smallest-budget schedule ('skip': none)")
    ap.add_argument("--mapped-weights", choices=("off", "on", "both"), default="off",
                    help="the smallest-budget schedule with the frozen weights paged by the MILP too (on: "
                         "remat/weights.py), as before (off: held in RAM all along), or both")
    ap.add_argument("--time-limit", type=float, default=120.0, help="the MILP's time limit per solve (s)")
    ap.add_argument("--mip-gap", type=float, default=0.01)
    ap.add_argument("--work", default="/tmp/edgetrain-lora-lm")
    ap.add_argument("--out", default=None, help="append the JSON lines here (docs/results/lora-lm.jsonl)")
    ap.add_argument("--tables", metavar="JSONL", help="print the tables of rows this script wrote (no run): of "
                    "rows of one configuration, the last one measured under --max-load")
    ap.add_argument("--max-load", type=float, default=None,
                    help="with --tables: leave out rows measured while the 1-minute load average was above this "
                         "(other jobs on the machine skew their timings)")
    ap.add_argument("--worker", nargs=3, metavar=("DTYPE", "THREADS", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("--adapters", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    case = "tiny" if a.tiny else a.case
    if a.tables:
        print(saved_tables(Path(a.tables), a.max_load))
        return 0
    if a.worker:
        print(json.dumps(peer_worker(case, a.worker[0], int(a.worker[1]), int(a.worker[2]), a.adapters)))
        return 0
    import torch

    head = {"case": case, "seq": CASES[case]["seq"], "batch": BATCH, "steps": a.steps, "lr": LR,
            "lora": f"r{RANK} a{ALPHA} {','.join(TARGETS)}", "cpus": os.cpu_count(), "torch": torch.__version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = []

    def emit(r):
        r = {**r, "loadavg_1m": round(os.getloadavg()[0], 2)}  # other jobs on the machine skew the timings
        rows.append(r)
        print(json.dumps({**head, **r}), flush=True)
        if a.out:
            with open(a.out, "a") as fh:
                fh.write(json.dumps({**head, **r}) + "\n")

    frozens = tuple(None if f == "none" else f for f in a.frozen)
    smallest = None if a.smallest == "none" else a.smallest
    adapters = Path(a.work) / f"{case}-initial-adapters.pt"
    adapters.unlink(missing_ok=True)
    mapped = {"off": (False,), "on": (True,), "both": (False, True)}[a.mapped_weights]
    for r in edgetrain_rows(case, frozens, a.threads, a.steps, Path(a.work), smallest, a.time_limit, a.mip_gap,
                            adapters, mapped):
        emit(r)
    for dtype in a.peer_dtypes:
        for th in a.threads:
            emit({"system": "pytorch+peft", "dtype": dtype, "threads": th,
                  **run_peer(case, dtype, th, a.steps, str(adapters) if adapters.exists() else "")})
    rows.sort(key=lambda r: r["system"] != "pytorch+peft")
    print()
    print(table(rows, case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
