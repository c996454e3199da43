"""Instructions per training step of the standalone host project: cross-built for aarch64 and
counted under qemu-aarch64 (backends/c/insn_count.py's plugin), beside x86-64 counted by
valgrind's callgrind (issue 35, item 4). Counted, not timed. Per step = (count of --steps 3 -
count of --steps 1) / 2, so start-up and loading cancel out; portable kernels (no BLAS).

    PYTHONPATH=src python bench/cross_insns.py [ZOO_MODEL ...]     # e.g. ds-cnn mbv2-w0.35

Prints one JSON line per program: the digits example (float32 and int8, batch 2) and each zoo
model named (float32 and int8), with the check against the reference runtime. Needs
gcc-aarch64-linux-gnu, qemu-user and valgrind."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
import digits  # noqa: E402  (docs/examples/digits.py)

import edgetrain as et  # noqa: E402
from edgetrain import models  # noqa: E402
from edgetrain.backends.c import cross  # noqa: E402

WORK = Path(tempfile.mkdtemp(prefix="cross-insns-"))


def x86_per_step(d, march, steps=(1, 3)):
    subprocess.run(["make", "-s", "-B", "main", "BLAS=0", f"CFLAGS=-O3 -march={march} -ffp-contract=off "
                    "-fno-math-errno -fopenmp-simd -std=gnu11"], cwd=d, check=True, capture_output=True)
    c = []
    for n in steps:
        r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "./main", "weights.bin",
                            "samples.bin", "--steps", str(n)], cwd=d, capture_output=True, text=True)
        c.append(int(re.search(r"Collected : (\d+)", r.stderr).group(1)))
    return (c[1] - c[0]) / (steps[1] - steps[0])


def case(name, model, x, y, quantize=None):
    kw = dict(quantize="int8", calibration=[x]) if quantize else {}
    prog = et.compile(model, (x,), optimizer=et.SGD(lr=0.01, momentum=0.9), **kw)
    samples = [(x, y)] * 3
    d = WORK / f"{name}-{quantize}"
    shutil.rmtree(d, ignore_errors=True)
    t = time.time()
    run = cross.run_cross(prog, samples, out_dir=d)
    chk = cross.compare_with_reference(prog, samples, run)
    row = {"case": name, "quantize": quantize or "float32", "check": chk.describe(), "run_s": round(time.time() - t, 1)}
    row["a64"] = cross.per_step_instructions(d)
    if not quantize:
        cross.build_cross(d, fma=True)
        row["a64_fma"] = cross.per_step_instructions(d)
    row["x86_v3"] = x86_per_step(d, "x86-64-v3")
    row["x86_v1"] = x86_per_step(d, "x86-64")
    print(json.dumps(row), flush=True)


def main(names) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=2)
    for q in (None, "int8"):
        case("digits-b2", digits.build(), x, y, q)
    for name in names:
        xi = models.example_input(name).numpy()
        yi = np.zeros(models.get(name)(torch.from_numpy(xi)).shape[0], np.int64)
        for q in (None, "int8"):
            try:
                case(name, models.get(name), xi, yi, q)
            except Exception as e:  # noqa: BLE001 - a failed program is a row
                print(json.dumps({"case": name, "quantize": q, "error": str(e)[:300]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
