"""The RAM of a decoder's training step run by the standalone host binary, modelled beside measured,
with its frozen weights mapped from the weights file or read into RAM, and under a remat schedule
at a smaller budget (issue 32, deliverable 4).

    PYTHONPATH=src python bench/lm_memory.py [--family llama|qwen2] [--hidden 576] [--layers 30] [--heads 9]
        [--kv-heads 3] [--intermediate 1536] [--vocab 49152] [--no-tie] [--seq 256] [--batch 1]
        [--scheme qv|lora] [--fractions 1 0.5] [--steps 2] [--time-limit 120] [--mip-gap 0.01]
        [--blas | --no-blas] [--work DIR] [--out results.jsonl]

The defaults are SmolLM2-135M's shape (LlamaConfig: hidden 576, 30 layers, 9 heads, 3 KV heads,
intermediate 1536, vocab 49,152, tied embeddings; random init), sequence 256, batch 1. The model
returns its logits; the loss is "sequence_cross_entropy" over the (N, T, V) logits with random
labels. --scheme qv trains the q_proj / v_proj weights only (requires_grad False on everything
else: update=et.Full() respects it); --scheme lora: et.LoRA(rank=8, targets=("q_proj", "v_proj")).
SGD without momentum.

For each fraction f the program is scheduled on the A72 profile with
ram = fixed_ram + f * activation_bytes (f = 1: plain back-propagation, no schedule), applied,
emitted as a host project with its weights in weights.bin (graphs=("train",)), built with
`make main` (MAP_WEIGHTS=1: the frozen weights mapped and their pages dropped after use; at f = 1
also a copy built with MAP_WEIGHTS=0, which reads them into RAM) and run for --steps steps in its
own process. Each row:

- modelled: weights_file.host_step_ram: arena + state held in RAM (trained weights, optimizer
  state) + the frozen window (memory/frozen_window.py: the most frozen bytes resident at once)
  when mapped, else + every frozen byte; `schedule_peak`: the schedule's own peak
  (problem.fixed_ram, frozen weights included, + its activation peak);
- before_steps: the binary's RSS after loading, before the first step; overhead: that minus the
  state it read into RAM (the runtime, libc, the BLAS);
- measured: the binary's peak RSS (VmHWM); ratio: measured / (modelled + overhead);
- bit_equal: the weights it saved after the steps equal, bit for bit, those of the first row
  (f = 1, mapped);
- step_s: the median step's wall time; the losses.

Prints one JSON line per row and a table.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]


def _torchvision_schemas():
    """transformers imports torchvision, whose build here needs these op schemas first
    (tests/realmodels/conftest.py explains)."""
    for name in ("nms", "qnms"):
        try:
            torch.library.define(f"torchvision::{name}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:
            pass


class Logits(torch.nn.Module):
    """A causal LM returning the logits of every position."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids).logits


def make_model(a):
    """(model, ids, labels) of the arguments' decoder, random init (seeded)."""
    _torchvision_schemas()
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, lm_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[a.family]
    cfg = cfg_cls(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                  num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate, vocab_size=a.vocab,
                  max_position_embeddings=max(2 * a.seq, 64), tie_word_embeddings=not a.no_tie)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Logits(lm_cls(cfg)).eval()
    if a.scheme == "qv":
        for n, p in model.named_parameters():
            p.requires_grad_(n.endswith(("q_proj.weight", "v_proj.weight")))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    labels = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    return model, ids, labels


def run_binary(d: Path, steps: int) -> dict:
    cmd = ["./main", "weights.bin", "samples.bin", "--steps", str(steps), "--save", "trained.bin"]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{d}/main failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    step_s = sorted(float(v) for v in re.findall(r"elapsed_s \d+ (\S+)", r.stdout))
    return {"run_s": round(time.perf_counter() - t, 2),
            "before_steps_kb": int(re.search(r"rss_before_steps_kb (\d+)", r.stdout).group(1)),
            "measured_kb": int(re.search(r"peak_rss_kb (\d+)", r.stdout).group(1)),
            "released_bytes": int(re.search(r"released_weight_bytes (\d+)", r.stdout).group(1)),
            "mapped": re.search(r"mapped_weights (\d)", r.stdout).group(1) == "1",
            "step_s": round(step_s[len(step_s) // 2], 3) if step_s else None,
            "losses": [float(v) for v in re.findall(r"loss (\S+)", r.stdout)]}


def rows(a):
    """Yield one row per (fraction, mapped) as soon as it is measured."""
    import edgetrain as et
    from edgetrain.backends.c.layout import build_layout
    from edgetrain.backends.c.weights_file import host_step_ram, read_weights
    from edgetrain.devices import get_device
    from edgetrain.remat.build import build_problem
    from edgetrain.remat.plan import Infeasible

    model, ids, labels = make_model(a)
    update = et.Full() if a.scheme == "qv" else et.LoRA(rank=8, alpha=16, targets=("q_proj", "v_proj"))
    t = time.perf_counter()
    prog = et.compile(model, (ids,), loss="sequence_cross_entropy", update=update, optimizer=et.SGD(lr=0.01))
    compile_s = round(time.perf_counter() - t, 2)
    del model
    problem = build_problem(prog, get_device("a72"))
    fixed, act = problem.fixed_ram, problem.activation_bytes
    samples = [(ids.numpy(), labels.numpy())]
    work, first = Path(a.work), None
    base = {"family": a.family, "hidden": a.hidden, "layers": a.layers, "vocab": a.vocab, "seq": a.seq,
            "scheme": a.scheme, "compile_s": compile_s, "fixed_ram": fixed, "activation_bytes": act}
    for f in a.fractions:
        row = {**base, "fraction": f}
        t = time.perf_counter()
        try:
            sched = None if f >= 1 else et.schedule(prog, device="a72", ram=fixed + int(f * act),
                                                    time_limit=a.time_limit, mip_rel_gap=a.mip_gap)
        except Infeasible as e:
            yield {**row, "status": f"infeasible: {e}"}
            continue
        if sched is not None:
            row.update(schedule_s=round(time.perf_counter() - t, 2), solver_status=sched.status,
                       gap=round(sched.gap, 5), recomputations=sched.recomputations, page_ins=sched.page_ins,
                       extra_energy=round(sched.energy_j / problem.base_energy_j - 1, 5))
        run_prog = prog if sched is None else prog.apply(sched)
        row["schedule_peak"] = fixed + act if sched is None else sched.peak_bytes
        layout = build_layout(run_prog, ("train",))
        d = work / f"f{f}"
        t = time.perf_counter()
        run_prog.emit_c(d, target="host", samples=samples, embed_weights=False, graphs=("train",))
        row["emit_s"] = round(time.perf_counter() - t, 2)
        builds = [(d, True)]
        if f >= 1:  # the same project reading its frozen weights into RAM
            shutil.rmtree(d.with_name(d.name + "-unmapped"), ignore_errors=True)
            builds.append((Path(shutil.copytree(d, d.with_name(d.name + "-unmapped"))), False))
        for dd, mapped in builds:
            r = dict(row)
            t = time.perf_counter()
            subprocess.run(["make", "-s", "-B", "main", f"MAP_WEIGHTS={int(mapped)}"]
                           + ([] if a.blas else ["BLAS=0"]), cwd=dd, check=True, capture_output=True)
            r["make_s"] = round(time.perf_counter() - t, 2)
            model_ram = host_step_ram(layout, mapped=mapped)
            r.update(modelled=model_ram["modelled"], arena=model_ram["arena"], ram_state=model_ram["ram_state"],
                     frozen=model_ram["frozen"], frozen_window=model_ram["frozen_window"])
            r.update(run_binary(dd, a.steps))
            loaded = model_ram["ram_state"] + (0 if mapped else model_ram["frozen"])
            r["overhead_kb"] = r["before_steps_kb"] - loaded // 1024
            r["ratio"] = round(r["measured_kb"] * 1024 / (r["modelled"] + r["overhead_kb"] * 1024), 3)
            trained = read_weights(dd / "trained.bin")
            if first is None:
                first = trained
            else:
                r["bit_equal"] = trained.keys() == first.keys() and all(np.array_equal(trained[k], first[k])
                                                                        for k in first)
            r["status"] = "ok"
            yield r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("llama", "qwen2"), default="llama")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--no-tie", action="store_true", help="an lm_head of its own (default: tied to the embedding)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--scheme", choices=("qv", "lora"), default="qv")
    ap.add_argument("--fractions", nargs="+", type=float, default=[1.0, 0.5])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--mip-gap", type=float, default=0.01)
    ap.add_argument("--blas", action=argparse.BooleanOptionalAction, default=True,
                    help="link the host BLAS (--no-blas: the portable kernels)")
    ap.add_argument("--work", default="/tmp/edgetrain-lm-memory")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    mb = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    print("| f | mapped | modelled MB (arena + RAM state + frozen) | schedule peak MB | before steps MB | "
          "measured MB | overhead MB | ratio | step s | bit equal |")
    for r in rows(a):
        print(json.dumps(r), flush=True)
        if a.out:
            with open(a.out, "a") as fh:
                fh.write(json.dumps(r) + "\n")
        if r["status"] != "ok":
            print(f"| {r['fraction']} | {r['status'][:100]} |")
            continue
        frozen = r["frozen_window"] if r["mapped"] else r["frozen"]
        print(f"| {r['fraction']} | {r['mapped']} | {mb(r['modelled'])} ({mb(r['arena'])} + {mb(r['ram_state'])} + "
              f"{mb(frozen)}) | {mb(r['schedule_peak'])} | {mb(r['before_steps_kb'] * 1024)} | "
              f"{mb(r['measured_kb'] * 1024)} | {mb(r['overhead_kb'] * 1024)} | {r['ratio']} | {r['step_s']} | "
              f"{r.get('bit_equal', '-')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
