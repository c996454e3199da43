"""The paper's three int8 models as Cortex-M firmware: flash, SRAM, measured stack and
instructions per training step under QEMU, beside the paper's figures.

    PYTHONPATH=src python bench/mcu_size.py [--models mbv2-w0.35 ...] [--scheme 49kb]
        [--target cortex-m7|cortex-m4|rv32imafc|rv32imc] [--steps 2] [--no-run] [--no-icount] [--breakdown [N]] [--code [N]] [--check-host] [--out DIR]
        [--backward float|integer] [--opt O2|O3|Os|O1]

For each model: `from_tiny_training(..., num_classes=10)` at 128x128, compiled with
quantize="int8", the paper's sparse update scheme (default "49kb" of
../shared/assets/tiny-training/schemes.json) and SGD(lr=0.01); `cortexm.emit_firmware` (what `emit_c(target=...)` calls) writes a
firmware project (`--backward integer`: the backward and the updates in integers only) that trains on
`--steps` embedded samples (seeded random images and labels),
`make` links it into the 1 MiB flash / 256 KiB SRAM regions (a program that does not fit fails
to link: reported as such), and QEMU (mps2-an500 for the Cortex-M7) runs it: the losses, the
stack high-water mark (stack painting) and, with a TCG plugin, the guest instructions of each
step by class (loads, stores, multiplies, DSP SIMD, divides, taken and not-taken branches,
floating point, ...; Thumb-2 or RV32, the target's decoder) and per function. QEMU has no timing
model: the cycles are estimated from the classes with the target's cost table
(edgetrain.backends.c.cycles: the Arm TRMs' cycles per class, or CORE-V CV32E40P / CV32E40X's
for RISC-V; zero-wait-state memory, no dual issue; its docstring says what else it leaves out),
and the time per step is cycles / 216e6 s. --breakdown N prints the N functions (kernels)
with the most estimated cycles in the first step, with their counts by class. --code N prints
model.o's N largest functions (firmware_flash.model_functions: the model code by function) with
their estimated cycles in the first step, and how much of the model code ran under 1 % of the
step's cycles or not at all: where smaller code would cost the step least.

--opt Os (or O1, O3) compiles the firmware's model.c at that level instead of the default -O2
(cortexm.DEFAULT_OPT; the project is written to <model>-<target>-Os beside the default one):
what a flash-bound build would give, code against cycles.

--check-host also builds the host C program (`emit_c(target="host")`) and checks that its loss
lines equal the firmware's, as text.

Columns (KB = 1024 B): flash = code + read-only data (frozen weights, samples) + .data image,
and by kind (backends/c/firmware_flash.py, from the ELF's symbols): frozen weights, the trained
weights' initial values, the embedded samples (test data: a device reads its sensor), the int8
layers' per-channel requantization multipliers and shifts, the kernels' other constant tables,
model.o's code, and the rest (startup, main, newlib's printf, libgcc), and the sum of the last four
(code and tables: all but the weights and the samples; issue 35's figure), and beside the
requantization arrays the model file's own per-channel weight scales (float32) that they encode;
its ratio to the frozen weights (prog.memory's flash_bytes, the issue's figure) and to all
weights (frozen + trained), with and without the samples (the final table), and its distance
from issue 20's bound (FLASH_BOUND times the frozen weights);
SRAM = .data + .bss (arena, trained weights) + heap and stack reserves (cortexm.build sizes
the stack to its static bound, backends/c/stack_bound.py, and drops the heap when nothing
allocates); stack = measured high-water mark beside the static bound and its deepest chain;
prog.memory peak = the compiler's planned peak (arena + trained weights).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import edgetrain as et
from edgetrain.backends.c import cortexm, cycles
from edgetrain.backends.c.export import emit_c
from edgetrain.backends.c.firmware_flash import flash_contents, model_functions
from edgetrain.backends.c.stack_bound import StackBoundError, stack_bound
from edgetrain.data.assets import require_assets
from edgetrain.models import from_tiny_training
from edgetrain.quantize import SPEC_ATTR

RES, KB = 128, 1024
MODELS = ("mbv2-w0.35", "proxyless-w0.3", "mcunet-5fps")
PAPER_MHZ = 216  # the paper's STM32F746 (Cortex-M7)
# the paper's engine measured on the board (ms per image at 216 MHz), in millions of cycles
PAPER_MCYCLES = {"mbv2-w0.35": 80.6, "proxyless-w0.3": 95.7, "mcunet-5fps": 117.9}
#: issue 20's flash target: at most this many times the frozen weights
FLASH_BOUND = 1.3
# classes shown in the breakdown table (the others are summed into "rest")
SHOWN = ("other", "load", "store", "mul", "mac", "simd", "div", "branch_taken", "fp")


def scheme_of(table: dict, model: str, label: str):
    s = table["schemes"][model][label]
    return et.Sparse(bias_last=s["bias_last"], weights={int(k): v for k, v in s["weights"].items() if v})


def samples(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((1, 3, RES, RES)).astype(np.float32), np.array([int(rng.integers(10))]))
            for _ in range(n)]


#: the levels --opt offers (gcc's -O<level>)
OPT_LEVELS = ("O2", "O3", "Os", "O1")


def opt_flag(level: str) -> str:
    """gcc's flag for an --opt level."""
    if level not in OPT_LEVELS:
        raise ValueError(f"--opt {level!r}: use one of {', '.join(OPT_LEVELS)}")
    return "-" + level


def project_dir(out: Path, model: str, target: str, level: str) -> Path:
    """The firmware project's folder: <model>-<target>, with -<level> added for a level other than the
    default (a build at -Os does not overwrite the -O2 one)."""
    name = f"{model}-{target}"
    return out / (name if opt_flag(level) == cortexm.DEFAULT_OPT else f"{name}-{level}")


def opt_label(r: dict, fmt: str) -> str:
    """`fmt` with row r's level in it, for a row built at a level other than the default; else ""."""
    level = r.get("opt", cortexm.DEFAULT_OPT)
    return "" if level == cortexm.DEFAULT_OPT else fmt.format(level)


def host_lines(prog, data, out: Path) -> list[str]:
    emit_c(prog, out, "host", data)
    r = subprocess.run("make -s main && ./main", shell=True, cwd=out, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"host build failed: {r.stderr[-2000:]}")
    return [l for l in r.stdout.splitlines() if l.startswith("step ")]


def measure(model: str, args, table: dict) -> dict:
    path = require_assets(f"tiny-training/{model}.pkl")
    t0 = time.time()
    net = from_tiny_training(path, num_classes=10)
    prog = et.compile(net, (torch.zeros(1, 3, RES, RES),),
                      update=scheme_of(table, model, args.scheme), quantize="int8", optimizer=et.SGD(lr=0.01),
                      backward=args.backward)
    opt = opt_flag(args.opt)
    row = {"model": model, "scheme": args.scheme, "target": args.target, "backward": args.backward, "opt": opt,
           "planned_peak_kb": prog.memory.peak_bytes / KB, "planned_flash_kb": prog.memory.flash_bytes / KB,
           "compile_s": time.time() - t0,
           # the model file's own per-output-channel weight scales (float32): the data that the
           # requantization multipliers encode, with the layers' input and output scales folded in
           "model_w_scales_kb": sum(s.w_scales.nbytes for s in getattr(net, SPEC_ATTR).values()) / KB,
           "paper_peak_kb": table["paper_peak_kb_sparse_reorder"][model],
           "paper_ms_per_image": table["paper_latency_ms_per_image_stm32f746"][model]}
    data = samples(args.steps)
    d = project_dir(Path(args.out), model, args.target, args.opt)
    cortexm.emit_firmware(prog, d, args.target, data, opt=opt)
    try:
        elf = cortexm.build(d, jobs=2)
    except cortexm.CortexMError as e:
        row["link_error"] = str(e).strip().splitlines()[-3:]
        return row
    run = None
    if not args.no_run:
        t0 = time.time()
        run = cortexm.run_qemu(d, args.target, icount=not args.no_icount)
        row.update(qemu_s=time.time() - t0, exit_code=run.exit_code, steps=list(run.step_lines))
        if run.instructions_per_step:
            row["instructions_per_step"] = list(run.instructions_per_step)
        if run.cycles_per_step:  # a target with a cycle table (the Cortex-M)
            row["cycles_per_step"] = [round(c) for c in run.cycles_per_step]
            row["ms_at_216mhz"] = 1e3 * float(np.mean(run.cycles_per_step)) / (PAPER_MHZ * 1e6)
            first = run.counts_per_step[0]
            row["classes_first_step"] = first.total.as_dict()
            row["words_first_step"] = first.total.words
            row["functions_first_step"] = [
                {"function": name, "instructions": c.instructions, "cycles": round(cy), "classes": c.as_dict(),
                 "words": c.words}
                for name, c, cy in cycles.breakdown(first, args.target, top=None)]
    size = cortexm.firmware_size(elf, run, args.target)
    row.update(flash_kb=size.flash / KB, sram_kb=size.sram / KB, sram_used_kb=size.sram_used / KB,
               text_kb=size.text / KB, rodata_kb=size.rodata / KB, data_kb=size.data / KB, bss_kb=size.bss / KB,
               stack_reserve_kb=size.stack_reserve / KB, heap_reserve_kb=size.heap_reserve / KB,
               stack_high_water_b=size.stack_high_water, stack_bound_b=size.stack_bound)
    try:
        row["stack_chain"] = stack_bound(elf).describe()
    except StackBoundError as err:
        row["stack_chain"] = f"no static bound: {err}"
    row.update(flash_ratios(flash_contents(d, size.flash), prog.memory.flash_bytes))
    row["model_code_functions"] = [{"function": f, "bytes": b} for f, b in model_functions(d).items()]
    if args.check_host and run is not None:
        host = host_lines(prog, data, Path(args.out) / f"{model}-host")
        row["host_lines_equal"] = host == list(run.step_lines)
    return row


def flash_ratios(fc, frozen_planned: int) -> dict:
    """The flash by kind (firmware_flash.py) and its ratios to the frozen weights (as
    prog.memory plans them) and to all weights (frozen + the trained ones' initial values),
    with and without the embedded samples."""
    out = {f"flash_{k}_kb": v / KB for k, v in fc.as_dict().items() if k != "total"}
    out.update(flash_no_samples_kb=fc.without_samples / KB, weights_kb=fc.weights / KB, flash_program_kb=fc.program / KB,
               flash_per_frozen=fc.total / frozen_planned, flash_no_samples_per_frozen=fc.without_samples / frozen_planned,
               flash_per_weights=fc.total / fc.weights, flash_no_samples_per_weights=fc.without_samples / fc.weights)
    return out


def show(r: dict) -> None:
    print(f"\n{r['model']} ({r['scheme']} scheme, {r['target']}{opt_label(r, ', {}')}, {r['backward']} backward): prog.memory peak {r['planned_peak_kb']:.1f} KB, "
          f"frozen weights {r['planned_flash_kb']:.1f} KB; paper: {r['paper_peak_kb']} KB peak, "
          f"{r['paper_ms_per_image']} ms/image at {PAPER_MHZ} MHz")
    if "link_error" in r:
        print("  does not link:", " | ".join(r["link_error"]))
        return
    print(f"  flash {r['flash_kb']:.1f} KB (text {r['text_kb']:.1f}, rodata {r['rodata_kb']:.1f}, data {r['data_kb']:.1f})"
          f"; SRAM {r['sram_kb']:.1f} KB (data {r['data_kb']:.1f}, bss {r['bss_kb']:.1f}, heap {r['heap_reserve_kb']:.1f}, "
          f"stack reserve {r['stack_reserve_kb']:.1f})")
    print(f"  stack bound (static, exception frame included; the reserve is it + the guard word): {r['stack_chain']}")
    print(f"  flash holds: frozen weights {r['flash_frozen_weights_kb']:.1f} KB, trained weights' initial values "
          f"{r['flash_trained_weights_kb']:.1f}, samples {r['flash_samples_kb']:.1f}, requantization multipliers "
          f"and shifts {r['flash_requant_kb']:.1f}, other constant tables {r['flash_constants_kb']:.1f}, model code "
          f"{r['flash_model_code_kb']:.1f}, other (startup, main, newlib, libgcc) {r['flash_other_kb']:.1f}; without the "
          f"samples {r['flash_no_samples_kb']:.1f} KB")
    print(f"  code and tables (all but the weights and the samples) {r['flash_program_kb']:.1f} KB, "
          f"{r['flash_program_kb'] - r['flash_requant_kb']:.1f} KB without the requantization arrays (the model file's "
          f"per-channel weight scales, which they encode: {r['model_w_scales_kb']:.1f} KB of float32)")
    print(f"  flash / frozen weights {r['flash_per_frozen']:.2f}x ({r['flash_no_samples_per_frozen']:.2f}x without the "
          f"samples); / all weights ({r['weights_kb']:.1f} KB) {r['flash_per_weights']:.2f}x "
          f"({r['flash_no_samples_per_weights']:.2f}x)")
    bound = FLASH_BOUND * r["planned_flash_kb"]
    print(f"  issue 20's bound, {FLASH_BOUND}x the frozen weights: {bound:.1f} KB; flash {r['flash_kb'] - bound:+.1f} KB "
          f"from it ({r['flash_no_samples_kb'] - bound:+.1f} KB without the samples)")
    if "exit_code" in r:
        print(f"  QEMU: exit {r['exit_code']} in {r['qemu_s']:.0f} s; stack high water {r['stack_high_water_b']} B; "
              f"SRAM with the measured stack {r['sram_used_kb']:.1f} KB")
        for l in r["steps"]:
            print("   ", l)
    if "instructions_per_step" in r and "cycles_per_step" not in r:
        print(f"  per step: {', '.join(f'{i / 1e6:.1f} M' for i in r['instructions_per_step'])} instructions "
              f"({r['target']}: no cycle table)")
    if "cycles_per_step" in r:
        ins, cyc = r["instructions_per_step"], r["cycles_per_step"]
        paper = PAPER_MCYCLES.get(r["model"]) if r["target"] == "cortex-m7" else None  # measured on an M7
        print(f"  per step: {', '.join(f'{i / 1e6:.1f} M' for i in ins)} instructions, "
              f"{', '.join(f'{c / 1e6:.1f} M' for c in cyc)} estimated {r['target']} cycles "
              f"({np.mean(cyc) / np.mean(ins):.2f} cycles/instruction) -> {r['ms_at_216mhz']:.0f} ms at {PAPER_MHZ} MHz "
              f"(paper: {r['paper_ms_per_image']} ms" + (f", {paper} M cycles: {np.mean(cyc) / 1e6 / paper:.2f}x)" if paper else ")"))
        total = r["classes_first_step"]
        print("  by class (first step): " + ", ".join(f"{k} {v / 1e6:.1f} M" for k, v in total.items() if v)
              + f"; words moved by multiple loads/stores {r['words_first_step'] / 1e6:.1f} M")
    if "functions_first_step" in r and r.get("breakdown"):
        show_breakdown(r["functions_first_step"][:r["breakdown"]], sum(r["cycles_per_step"][:1]))
    if r.get("code"):
        show_code(code_rows(r), r["code"], sum(r["cycles_per_step"][:1]) if "cycles_per_step" in r else None)
    if "host_lines_equal" in r:
        print(f"  host C losses equal to the firmware's as text: {r['host_lines_equal']}")


def print_table(head: list[str], table: list[list[str]]) -> None:
    """Rows under `head`, indented, the first column left-aligned and the others right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    for line in [head] + table:
        print("    " + "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(line, widths))))


def show_breakdown(rows: list[dict], step_cycles: float) -> None:
    """The functions with the most estimated cycles: share of the step, counts by class (M)."""
    head = ["function", "cycles M", "%", "instr M"] + [f"{k} M" for k in SHOWN] + ["rest M"]
    table = []
    for r in rows:
        cls = r["classes"]
        rest = sum(v for k, v in cls.items() if k not in SHOWN)
        table.append([r["function"][:40], f"{r['cycles'] / 1e6:.2f}", f"{100 * r['cycles'] / step_cycles:.1f}",
                      f"{r['instructions'] / 1e6:.2f}"] + [f"{cls[k] / 1e6:.2f}" for k in SHOWN] + [f"{rest / 1e6:.2f}"])
    print_table(head, table)


def code_rows(r: dict) -> list[dict]:
    """Row r's model code by function, largest first, each with its estimated cycles in the first step
    (0: it did not run; None: the firmware did not run under the cycle count)."""
    ran = r.get("functions_first_step")
    cyc = {f["function"]: f["cycles"] for f in ran} if ran is not None else None
    return [{**f, "cycles": None if cyc is None else cyc.get(f["function"], 0)} for f in r["model_code_functions"]]


#: a function below this share of the step's cycles counts as cold in show_code's summary
COLD_SHARE = 0.01


def code_summary(rows: list[dict], step_cycles: float) -> dict:
    """The model code's bytes in all, in functions that ran under COLD_SHARE of the step's cycles
    (those that did not run included), and in functions that did not run; with their counts."""
    cold = [f for f in rows if f["cycles"] < COLD_SHARE * step_cycles]
    idle = [f for f in rows if f["cycles"] == 0]
    return {"bytes": sum(f["bytes"] for f in rows), "functions": len(rows),
            "cold_bytes": sum(f["bytes"] for f in cold), "cold_functions": len(cold),
            "idle_bytes": sum(f["bytes"] for f in idle), "idle_functions": len(idle)}


def show_code(rows: list[dict], top: int, step_cycles: float | None) -> None:
    """The `top` largest functions of the model code with their share of it and of the step's cycles."""
    total = sum(f["bytes"] for f in rows)
    print(f"  model code by function ({total / KB:.1f} KB in {len(rows)} functions), the {min(top, len(rows))} largest:")
    head = ["function", "bytes", "% code", "cycles M", "% step"]
    table = []
    timed = step_cycles is not None
    for f in rows[:top]:
        table.append([f["function"][:40], str(f["bytes"]), f"{100 * f['bytes'] / total:.1f}",
                      f"{f['cycles'] / 1e6:.2f}" if timed else "-",
                      f"{100 * f['cycles'] / step_cycles:.1f}" if timed else "-"])
    print_table(head, table)
    if timed:
        s = code_summary(rows, step_cycles)
        print(f"  under {100 * COLD_SHARE:.0f} % of the step's cycles: {s['cold_bytes'] / KB:.1f} KB of the model code "
              f"({_functions(s['cold_functions'])}); not run in the step: {s['idle_bytes'] / KB:.1f} KB "
              f"({_functions(s['idle_functions'])})")


def _functions(n: int) -> str:
    return f"{n} function" + ("" if n == 1 else "s")


def flash_table(rows: list[dict]) -> None:
    """The flash of every model against its weights, as a markdown table."""
    print("\n| model | flash | without samples | frozen weights | all weights | flash / frozen | without samples / frozen "
          "| flash / all weights | without samples / all weights | requantization arrays | other constants | model code "
          "| other | code and tables |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "flash_kb" not in r:
            continue
        print(f"| {r['model']}{opt_label(r, ' ({})')} | {r['flash_kb']:.1f} KB | {r['flash_no_samples_kb']:.1f} KB | {r['planned_flash_kb']:.1f} KB "
              f"| {r['weights_kb']:.1f} KB | {r['flash_per_frozen']:.2f}x | {r['flash_no_samples_per_frozen']:.2f}x "
              f"| {r['flash_per_weights']:.2f}x | {r['flash_no_samples_per_weights']:.2f}x | {r['flash_requant_kb']:.1f} KB "
              f"| {r['flash_constants_kb']:.1f} KB | {r['flash_model_code_kb']:.1f} KB | {r['flash_other_kb']:.1f} KB "
              f"| {r['flash_program_kb']:.1f} KB |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--scheme", default="49kb")
    ap.add_argument("--target", default="cortex-m7", choices=sorted(cortexm.FIRMWARE_TARGETS))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--backward", choices=("float", "integer"), default="float",
                    help="the int8 program's backward: float32 (default) or integers only (backward='integer')")
    ap.add_argument("--opt", choices=OPT_LEVELS, default=cortexm.DEFAULT_OPT.lstrip("-"),
                    help="compile the firmware's model.c at -O<OPT> (default %(default)s)")
    ap.add_argument("--no-run", action="store_true")
    ap.add_argument("--no-icount", action="store_true")
    ap.add_argument("--breakdown", type=int, nargs="?", const=10, default=0, metavar="N",
                    help="print the N functions with the most estimated cycles (default 10)")
    ap.add_argument("--code", type=int, nargs="?", const=20, default=0, metavar="N",
                    help="print the model code's N largest functions with their cycles (default 20)")
    ap.add_argument("--check-host", action="store_true")
    ap.add_argument("--out", default="/tmp/edgetrain-mcu")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    if cortexm.missing_tools(args.target):
        print("missing tools:", ", ".join(cortexm.missing_tools(args.target)), file=sys.stderr)
        return 2
    table = json.loads(require_assets("tiny-training/schemes.json").read_text())
    rows = []
    for m in args.models:
        r = measure(m, args, table)
        r["breakdown"], r["code"] = args.breakdown, args.code
        show(r)
        sys.stdout.flush()
        rows.append(r)
    flash_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
