"""Measured RAM of a scheduled training step run by the standalone host binary, beside the
schedule's modelled peak and PyTorch eager's peak for the same step (issue 21).

    PYTHONPATH=src python bench/standalone_rss.py [--cases resnet18-cifar:1 resnet18-cifar:8 bert-tiny:8]
        [--fractions 1 0.5 0.3] [--steps 1] [--time-limit 60] [--mip-gap 0.01] [--no-grads] [--work DIR]
        [--out results.jsonl]

A case is `model:batch` (a zoo model; "resnet18-imagenet": the zoo's resnet18, torchvision's
architecture, with 1000 classes at 224 x 224; or "bert-base": transformers'
BertForSequenceClassification from its default config, random init, sequence 128). Each is
compiled for float32 training
(full update, SGD without momentum), timed; for each fraction f the program is scheduled on
the A72 profile with ram = fixed_ram + f * activation_bytes (f = 1: plain back-propagation,
no schedule), applied, emitted as a host project with its weights in weights.bin
(`emit_c(..., embed_weights=False, graphs=("train", "grad"))`; "train" only with --no-grads),
built with `make main` and run under /usr/bin/time -v for --steps steps, paging to a real file,
then (`--save-grads`) saving the gradients of the next sample at the trained weights. Every
emit, build and run is timed and each measurement runs in its own process, so the RSS is that
step's alone:

- the schedule (MILP, --mip-gap on the total energy, --time-limit): its extra energy over
  plain back-propagation, the solver's status, gap and solve time;
- modelled: the schedule's peak (problem.fixed_ram + its activation peak);
- before_steps: the binary's RSS after loading its weights, before the first step (the fixed
  runtime overhead is this minus the state bytes it loaded);
- measured: the binary's peak RSS (VmHWM, printed by the binary before the gradients are
  computed) and /usr/bin/time's maximum (which includes the gradients' run);
- bit_equal_to_plain: the weights the binary saved after the steps equal, bit for bit, the
  unscheduled binary's (f = 1 runs first); grads_bit_equal_to_plain: its gradients too (the
  scheduled gradient graph: remat/apply.gradient_graph);
- kernels: "blas" when main links the host BLAS (project.blas_make; EDGETRAIN_BLAS=0: "portable");
  run_s: the binary's wall time (loading the weights, the steps, saving); step_s: the median
  step's wall time (printed by the binary);
- torch: PyTorch eager's peak RSS for one SGD step of the same model and batch, in a fresh
  interpreter (`--torch-case`), and its RSS before the step (interpreter, torch, model).

Prints one JSON line per (case, fraction) and a table row.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore", category=FutureWarning)
SEQ = 128
NUM_CLASSES = 10


def peak_rss_kb() -> int:
    """This process's peak RSS (VmHWM, KiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return -1


def make_case(case: str):
    """(model in eval mode, input batch, labels) of `model:batch`, seeded."""
    name, batch = case.split(":")
    batch = int(batch)
    torch.manual_seed(0)
    if name == "resnet18-imagenet":  # the zoo's resnet18 (torchvision's architecture), ImageNet's 1000 classes
        import edgetrain as et

        x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
        return et.models.get("resnet18", num_classes=1000).eval(), x, torch.arange(batch) % 1000
    if name == "bert-base":
        sys.modules.setdefault("torchvision", None)  # transformers' image utilities import a torchvision
        from transformers import BertConfig, BertForSequenceClassification  # built for another torch

        cfg = BertConfig(num_labels=NUM_CLASSES)
        cfg._attn_implementation = "eager"

        class Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = BertForSequenceClassification(cfg)

            def forward(self, ids):
                return self.bert(input_ids=ids).logits

        model, x = Logits(), torch.randint(0, cfg.vocab_size, (batch, SEQ))
    else:
        import edgetrain as et

        model, x = et.models.get(name, num_classes=NUM_CLASSES), et.models.example_input(name, batch=batch)
    y = torch.arange(batch) % NUM_CLASSES
    return model.eval(), x, y


def torch_step(case: str) -> dict:
    """Run in a fresh interpreter: one eager SGD step; RSS before it and at its peak."""
    model, x, y = make_case(case)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = peak_rss_kb()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return {"torch_before_kb": before, "torch_peak_kb": peak_rss_kb()}


def run_binary(d: Path, steps: int, grads: bool) -> dict:
    cmd = ["/usr/bin/time", "-v", "./main", "weights.bin", "samples.bin", "--steps", str(steps), "--pages",
           "pages.bin", "--save", "trained.bin"] + (["--save-grads", "grads.bin"] if grads else [])
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"{d}/main failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    out = {"run_s": round(wall, 2),
           "before_steps_kb": int(re.search(r"rss_before_steps_kb (\d+)", r.stdout).group(1)),
           "measured_kb": int(re.search(r"peak_rss_kb (\d+)", r.stdout).group(1)),
           # with --save-grads, /usr/bin/time's maximum includes the gradients' run after the steps
           "time_v_kb": int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)),
           "losses": [float(v) for v in re.findall(r"loss (\S+)", r.stdout)]}
    step_s = sorted(float(v) for v in re.findall(r"elapsed_s \d+ (\S+)", r.stdout))
    out["step_s"] = round(step_s[len(step_s) // 2], 3)  # the median step's wall time
    m = re.search(r"paged_in_bytes (\d+) paged_out_bytes (\d+)", r.stdout)
    if m:
        out["paged_in"], out["paged_out"] = int(m.group(1)), int(m.group(2))
    return out


def run_case(case: str, fractions, steps: int, time_limit: float, work: Path, torch_rss: dict, grads: bool = True,
             mip_gap: float = 0.01):
    """Yield one row per fraction (module docstring), each as soon as it is measured."""
    import edgetrain as et
    from edgetrain.remat.build import build_problem
    from edgetrain.devices import get_device
    from edgetrain.remat.plan import Infeasible
    from edgetrain.backends.c.weights_file import read_weights

    model, x, y = make_case(case)
    graphs = ("train", "grad") if grads else ("train",)
    t = time.perf_counter()
    prog = et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.01))
    compile_s = time.perf_counter() - t
    problem = build_problem(prog, get_device("a72"))
    fixed, act = problem.fixed_ram, problem.activation_bytes
    plain = plain_grads = None  # the unscheduled binary's weights after the steps, and its gradients
    for f in fractions:
        row = {"case": case, "fraction": f, "compile_s": round(compile_s, 2), "fixed_ram": fixed,
               "activation_bytes": act, **torch_rss}
        ram = fixed + int(f * act)
        t = time.perf_counter()
        try:
            sched = None if f >= 1 else et.schedule(prog, device="a72", ram=ram, time_limit=time_limit,
                                                    mip_rel_gap=mip_gap)
        except Infeasible as e:
            row["status"] = f"infeasible: {e}"
            yield row
            continue
        row["schedule_s"] = round(time.perf_counter() - t, 2)
        if sched is not None:  # the solver's account: status, gap on the total energy, its solve time
            row.update(solver=sched.solver, solver_status=sched.status, gap=round(sched.gap, 5),
                       solve_s=round(sched.solve_s, 2),
                       extra_energy=round(sched.energy_j / problem.base_energy_j - 1, 5),
                       recomputations=sched.recomputations, page_ins=sched.page_ins)
        run_prog = prog if sched is None else prog.apply(sched)
        row["modelled"] = fixed + act if sched is None else sched.peak_bytes
        d = work / f"{case.replace(':', '-')}-{f}"
        t = time.perf_counter()
        run_prog.emit_c(d, target="host", samples=[(x.numpy(), y.numpy())], embed_weights=False, graphs=graphs)
        row["emit_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        subprocess.run(["make", "-s", "-B", "main"], cwd=d, check=True, capture_output=True)
        row["make_s"] = round(time.perf_counter() - t, 2)
        row["kernels"] = "blas" if "BLAS_LDFLAGS" in (d / "Makefile").read_text() else "portable"
        row["state_bytes"] = (d / "weights.bin").stat().st_size
        row.update(run_binary(d, steps, grads))
        row["overhead_kb"] = row["before_steps_kb"] - row["state_bytes"] // 1024
        row["ratio"] = round(row["measured_kb"] * 1024 / (row["modelled"] + row["overhead_kb"] * 1024), 3)
        trained = read_weights(d / "trained.bin")
        got_grads = read_weights(d / "grads.bin") if grads else None
        if sched is None:
            plain, plain_grads = trained, got_grads
        elif plain is not None:
            row["bit_equal_to_plain"] = all(np.array_equal(trained[k], plain[k]) for k in plain)
            if grads:
                row["grads_bit_equal_to_plain"] = got_grads.keys() == plain_grads.keys() and all(
                    np.array_equal(got_grads[k], plain_grads[k]) for k in plain_grads)
        row["status"] = "ok"
        yield row


def solver_cells(row) -> str:
    """extra energy | gap | solve s of a scheduled row ("-" for the unscheduled one)."""
    if "gap" not in row:
        return "- | - | -"
    return f"{100 * row['extra_energy']:+.2f}% | {100 * row['gap']:.2f}% ({row['solver_status']}) | {row['solve_s']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["resnet18-cifar:1", "resnet18-cifar:8", "bert-tiny:8"])
    ap.add_argument("--fractions", nargs="+", type=float, default=[1.0, 0.5, 0.3])
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--work", default="/tmp/edgetrain-standalone-rss")
    ap.add_argument("--out")
    ap.add_argument("--no-grads", action="store_true", help="emit the train graph only (no --save-grads check)")
    ap.add_argument("--mip-gap", type=float, default=0.01, help="the MILP's relative gap (on the total energy)")
    ap.add_argument("--torch-case", help=argparse.SUPPRESS)  # the eager measurement, in a child
    args = ap.parse_args(argv)
    if args.torch_case:
        print(json.dumps(torch_step(args.torch_case)))
        return 0
    work = Path(args.work)
    print("| case | f | modelled MB | before steps MB | measured MB | time -v MB | overhead MB | ratio | "
          "torch MB | compile s | emit s | make s | kernels | step s | extra energy | gap | solve s | "
          "weights / grads = plain |")
    for case in args.cases:
        r = subprocess.run([sys.executable, __file__, "--torch-case", case], capture_output=True, text=True, check=True)
        torch_rss = json.loads(r.stdout.strip().splitlines()[-1])
        for row in run_case(case, args.fractions, args.steps, args.time_limit, work, torch_rss, not args.no_grads,
                            args.mip_gap):
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
            if row["status"] != "ok":
                print(f"| {case} | {row['fraction']} | {row['status'][:80]} |")
                continue
            mb = lambda kb: f"{kb / 1024:.1f}"  # noqa: E731
            print(f"| {case} | {row['fraction']} | {row['modelled'] / 2**20:.1f} | {mb(row['before_steps_kb'])} | "
                  f"{mb(row['measured_kb'])} | {mb(row['time_v_kb'])} | {mb(row['overhead_kb'])} | {row['ratio']} | "
                  f"{mb(row['torch_peak_kb'])} | {row['compile_s']} | {row['emit_s']} | {row['make_s']} | "
                  f"{row['kernels']} | {row['step_s']} | {solver_cells(row)} | {row.get('bit_equal_to_plain', '-')} / {row.get('grads_bit_equal_to_plain', '-')} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
