"""Compile time of the C backend: `et.compile` itself and the host library build, cold cache.

    PYTHONPATH=src python bench/compile_time.py [--cases mbv2-full,mbv2-last8,mcunet,resnet18,bert]
        [--real tv.squeezenet1_1,timm.resnet10t] [--repeats 3] [--json-only] [--graphs] [--pch N | --split N]

For each case, `repeats` times with a fresh cache directory ($EDGETRAIN_CACHE set to a new
temporary folder, so no library is reused), the median (wall time unless said) of
- `compile_s`: `et.compile(model, (x,), update=..., backend="reference")` (capture, autodiff,
  passes, memory plan; `compile_cpu_s`: its CPU time);
- `emit_s`: the C sources of the host library (backends/c/emit.py, all three graphs);
- `build_s`: `to_c_program(prog)` less its emit: the C compiler on model.c (and whatever the
  host build compiles besides it), loading the library, et_init;
- `build_cpu_s`: the compilers' CPU time (user + system) in that build: the figure to compare on
  a loaded machine;
- `build_warm_s` (`build_warm_cpu_s`): the same build again with only the host library removed
  from the cache: what a model costs once the kernel object (backends/c/kernel_lib.py) and the
  precompiled headers (backends/c/front_pch.py), built once per machine, are there;
- `c_total_s`: `et.compile` + `to_c_program`, what `et.compile(..., backend="c")` costs cold;
and the size of model.c in KB. `--graphs`: also model.c's size with only the train graph
(`model_c_train_kb`: what `prog.step` runs; a Cortex-M firmware's) and with train and forward
(`model_c_train_forward_kb`: step and predict, no gradients), and the gcc CPU time of building
each of those libraries and the whole one alike, the kernel object cached (`build_all_cpu_s`,
`build_train_cpu_s`, `build_train_forward_cpu_s`): what a host library that emitted only the
graphs a program calls would cost. `c_warm_total_s`: `et.compile` + `to_c_program` with the
kernel object cached (what `et.compile(..., backend="c")` costs after the first use on a
machine). The zoo cases: mbv2-w0.35 Full / LastK(8) at 128x128, mcunet-5fps and
proxyless-w0.3 at 128x128, resnet18-cifar at 32x32, resnet18 at 128x128 (all Full, float32,
batch 1), bert-tiny (16 tokens), ds-cnn and ad-autoencoder at their own inputs: every model
of the zoo. `--real`: models of tests/realmodels/conftest.py BUILDERS (torchvision / timm /
transformers, float64 turned float32 here), Full. Prints one JSON line per case, then a
markdown table. Wall times on a shared machine include other processes' load: compare the CPU
times there. The kernel object's compile is in each cold build (a fresh cache each time).

`--pch N` measures instead what the precompiled runtime headers (backends/c/front_pch.py) save a
program's build: for each case, N builds of its host library with them and N with gcc parsing the
headers' text, alternating in one process and one cache (build_ab); one JSON line per case and a table.
`--split N` likewise: N builds with model.c compiled in pieces side by side on the machine's CPUs
(host.split_flags: GCC's -flto=N, for a model.c of host.SPLIT_MIN_BYTES or more) and N with it compiled whole.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import edgetrain as et
from edgetrain.backends.c.emit import emit_sources
from edgetrain.backends.c import front_pch, host
from edgetrain.backends.c.host import DEFAULT_CFLAGS, build_library, find_cc, to_c_program
from edgetrain.backends.c.kernel_lib import kernels_object
from edgetrain.backends.c.layout import build_layout
from edgetrain.backends.c.step_guard import with_guard

ROOT = Path(__file__).resolve().parents[1]


def zoo_case(name: str, scheme, size: int | None = None):
    def make():
        model = et.models.get(name, num_classes=10).eval()
        x = et.models.example_input(name, batch=1, seed=0)
        if size is None:  # the model's own input
            pass
        elif x.is_floating_point():
            x = torch.nn.functional.interpolate(x, size=(size, size)) if x.shape[-1] != size else x
        else:
            x = x[:, :size].contiguous()
        return model, x, scheme
    return make


CASES = {
    "mbv2-full": zoo_case("mbv2-w0.35", et.Full(), 128),
    "mbv2-last8": zoo_case("mbv2-w0.35", et.LastK(8), 128),
    "mcunet": zoo_case("mcunet-5fps", et.Full(), 128),
    "resnet18": zoo_case("resnet18-cifar", et.Full(), 32),
    "bert": zoo_case("bert-tiny", et.Full(), 16),
    "proxyless": zoo_case("proxyless-w0.3", et.Full(), 128),
    "resnet18-128": zoo_case("resnet18", et.Full(), 128),
    "ds-cnn": zoo_case("ds-cnn", et.Full()),
    "ad-autoencoder": zoo_case("ad-autoencoder", et.Full()),
}


def real_case(name: str):
    def make():
        sys.path.insert(0, str(ROOT))
        from tests.realmodels.conftest import build  # noqa: E402  (the tests' builders)

        model, x, _ = build(name)
        model = model.float()
        return model, (x.float() if x.is_floating_point() else x), et.Full()
    return make


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (the compilers): unlike wall
    time, little changed by other load on the machine."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


#: the graph sets of --graphs, by the suffix of their figures
GRAPH_SETS = {"all": ("train", "forward", "grad"), "train": ("train",), "train_forward": ("train", "forward")}


def graph_subsets(prog, flags) -> dict:
    """model.c's size and its library's gcc CPU time for each of GRAPH_SETS, all built alike
    (`flags`), the kernel object built before (untimed): model.c's compile alone."""
    out = {}
    for suffix, graphs in GRAPH_SETS.items():
        files = emit_sources(prog.runner, layout=build_layout(prog.runner, graphs), graphs=graphs)
        kernels_object(find_cc(), flags, files)
        c0 = _children_cpu()
        build_library(files, flags)
        out[f"build_{suffix}_cpu_s"] = _children_cpu() - c0
        out[f"model_c_{suffix}_kb"] = len(files["model.c"].encode()) / 1024
    return out


@contextlib.contextmanager
def fresh_cache():
    """$EDGETRAIN_CACHE set to a new temporary folder (yielded) for the body, then as it was."""
    with tempfile.TemporaryDirectory(prefix="et-ctime-") as cache:
        old = os.environ.get("EDGETRAIN_CACHE")
        os.environ["EDGETRAIN_CACHE"] = cache
        try:
            yield cache
        finally:
            if old is None:
                os.environ.pop("EDGETRAIN_CACHE", None)
            else:
                os.environ["EDGETRAIN_CACHE"] = old


def measure(make, graphs: bool = False) -> dict:
    """One cold run: times of compile, emit, build; model.c's size (with `graphs`, also of the
    graph subsets: graph_subsets)."""
    model, x, scheme = make()
    with fresh_cache() as cache:
        t0, p0 = time.perf_counter(), time.process_time()
        prog = et.compile(model, (x,), update=scheme, optimizer=et.SGD(lr=0.01, momentum=0.9))
        t1, p1 = time.perf_counter(), time.process_time()
        files = emit_sources(prog.runner, layout=build_layout(prog.runner))
        t2 = time.perf_counter()
        c0 = _children_cpu()
        to_c_program(prog)
        t3 = time.perf_counter()
        c1 = _children_cpu()
        for d in (Path(cache) / "c").iterdir():  # the host libraries, not what is built once per machine: the
            # kernel object and its parts (kernel_lib.py), the headers precompiled (front_pch.py), the libraries
            # it links (link_deps.py)
            if d.is_dir() and not d.name.startswith(("kernels-", "kernel-part-", "pch-", "deps-")):
                shutil.rmtree(d)
        t4 = time.perf_counter()
        cprog = to_c_program(prog)
        t5 = time.perf_counter()
        c2 = _children_cpu()
        subsets = graph_subsets(prog, cprog.runner.flags) if graphs else {}
    emit = t2 - t1
    return {"compile_s": t1 - t0, "emit_s": emit, "build_s": max(t3 - t2 - emit, 0.0),
            "build_cpu_s": c1 - c0, "build_warm_s": max(t5 - t4 - emit, 0.0), "build_warm_cpu_s": c2 - c1,
            "compile_cpu_s": p1 - p0, "c_total_s": (t1 - t0) + (t3 - t2), "c_warm_total_s": (t1 - t0) + (t5 - t4),
            "model_c_kb": len(files["model.c"].encode()) / 1024, **subsets}


@contextlib.contextmanager
def _pch_switch(on: bool):
    """--pch's two builds: with the precompiled headers, or front_pch.is_gcc answering False (gcc parses the text)."""
    gcc = front_pch.is_gcc
    front_pch.is_gcc = gcc if on else (lambda cc: False)
    try:
        yield
    finally:
        front_pch.is_gcc = gcc


@contextlib.contextmanager
def _split_switch(on: bool):
    """--split's two builds: model.c in pieces side by side (host.split_flags, as a program's build has it on this
    machine), or in one compile (host.SPLIT_MIN_BYTES past any model.c)."""
    least = host.SPLIT_MIN_BYTES
    host.SPLIT_MIN_BYTES = least if on else float("inf")
    try:
        yield
    finally:
        host.SPLIT_MIN_BYTES = least


#: the A/B modes: option -> (switch, the JSON names of the builds with and without, their table headings)
AB_MODES = {"pch": (_pch_switch, "pch", "text", "headers precompiled", "headers parsed"),
            "split": (_split_switch, "split", "whole", "model.c in pieces", "model.c whole")}


def build_ab(make, repeats: int, mode: str) -> dict:
    """--pch / --split: a program's host library built `repeats` times with the mode's change (AB_MODES: the
    precompiled headers of front_pch.py; model.c compiled in pieces, host.split_flags) and as often without it, in
    one fresh cache, the kernel object and the precompiled headers built before (untimed), the two alternating
    (which goes first alternates too); the medians of each's gcc CPU (`<with>_cpu_s` / `<without>_cpu_s`) and
    wall time (`<with>_s` / `<without>_s`), the CPU ratio and the wall ratio."""
    switch, yes, no = AB_MODES[mode][:3]
    model, x, scheme = make()
    prog = et.compile(model, (x,), update=scheme, optimizer=et.SGD(lr=0.01, momentum=0.9))
    files = emit_sources(prog.runner, layout=build_layout(prog.runner))
    flags = with_guard(DEFAULT_CFLAGS)  # as CRunner builds it
    runs: dict = {True: [], False: []}
    with fresh_cache():
        for r in range(repeats + 1):  # round 0 builds what is built once and is not timed
            for on in ((True, False) if r % 2 else (False, True)):
                with switch(on):
                    c0, t0 = _children_cpu(), time.perf_counter()
                    lib = build_library(files, flags)
                    if r:
                        runs[on].append((_children_cpu() - c0, time.perf_counter() - t0))
                shutil.rmtree(lib.parent)
    out = {}
    for on, name in ((True, yes), (False, no)):
        out[f"{name}_cpu_s"] = statistics.median(c for c, _ in runs[on])
        out[f"{name}_s"] = statistics.median(w for _, w in runs[on])
    out["cpu_ratio"] = out[f"{yes}_cpu_s"] / out[f"{no}_cpu_s"]
    out["wall_ratio"] = out[f"{yes}_s"] / out[f"{no}_s"]
    out["model_c_kb"] = len(files["model.c"].encode()) / 1024
    return {k: round(v, 3) for k, v in out.items()}


def run_case(name: str, make, repeats: int, graphs: bool = False) -> dict:
    runs = [measure(make, graphs) for _ in range(repeats)]
    row = {"case": name, "repeats": repeats}
    for k in runs[0]:
        row[k] = round(statistics.median(r[k] for r in runs), 3)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--real", default="", help="comma-separated names of tests/realmodels/conftest.py BUILDERS")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json-only", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="also the train-only and train+forward libraries")
    ap.add_argument("--pch", type=int, default=0, metavar="N",
                    help="instead: N warm builds of each case's library with and N without the precompiled headers")
    ap.add_argument("--split", type=int, default=0, metavar="N",
                    help="instead: N warm builds of each case's library with model.c compiled in pieces side by side "
                         "(host.split_flags) and N with it compiled whole")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    todo = [(c, CASES[c]) for c in args.cases.split(",") if c]
    todo += [(r, real_case(r)) for r in args.real.split(",") if r]
    mode = "pch" if args.pch else "split" if args.split else None
    if mode:
        n = args.pch or args.split
        _, yes, no, *head = AB_MODES[mode]
        prows = []
        for name, make in todo:
            prows.append({"case": name, f"{mode}_repeats": n, **build_ab(make, n, mode)})
            print(json.dumps(prows[-1]), flush=True)
        if not args.json_only:
            print(f"\n| case | C build, {head[0]} (s) | its gcc CPU (s) | C build, {head[1]} (s) "
                  "| its gcc CPU (s) | gcc CPU ratio | wall ratio | model.c (KB) |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for r in prows:
                print(f"| {r['case']} | {r[yes + '_s']:.2f} | {r[yes + '_cpu_s']:.2f} | {r[no + '_s']:.2f} | "
                      f"{r[no + '_cpu_s']:.2f} | {r['cpu_ratio']:.2f} | {r['wall_ratio']:.2f} | {r['model_c_kb']:.0f} |")
        return
    rows = []
    for name, make in todo:
        row = run_case(name, make, args.repeats, args.graphs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json_only:
        return
    print("\n| case | et.compile (s) | emit (s) | C build, cold (s) | its gcc CPU (s) | C build, kernels cached (s) "
          "| its gcc CPU (s) | compile + C, cold (s) | compile + C, kernels cached (s) | model.c (KB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['compile_s']:.2f} | {r['emit_s']:.2f} | {r['build_s']:.2f} | "
              f"{r['build_cpu_s']:.2f} | "
              f"{r['build_warm_s']:.2f} | {r['build_warm_cpu_s']:.2f} | "
              f"{r['c_total_s']:.2f} | {r['c_warm_total_s']:.2f} | {r['model_c_kb']:.0f} |")
    if args.graphs:
        print("\n| case | model.c, all graphs (KB) | train only (KB) | train + forward (KB) | gcc CPU on model.c, "
              "all graphs (s) | train only (s) | train + forward (s) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['case']} | {r['model_c_kb']:.0f} | {r['model_c_train_kb']:.0f} | {r['model_c_train_forward_kb']:.0f} "
                  f"| {r['build_all_cpu_s']:.2f} | {r['build_train_cpu_s']:.2f} | {r['build_train_forward_cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
