"""Which model families of issue 31 (tests/realmodels/families.py) compile today, and what
stops the others: per model, capture; float64 gradients vs torch.autograd on the reference
runtime; the float32 C backend vs the float32 reference; one int8 step; and the first refusal
(the op an UnsupportedOpError names, or the first line of another error).

    python bench/family_probe.py [--models NAME ...] [--cells CELL ...] [--timeout 300] [--json out.jsonl]

Each model runs in its own subprocess under a time limit (bench/real_models.py's cells, one
thread), one after another: the probe is for watching ops land on a shared machine, not a
benchmark (bench/real_models.py --families is the table). `--cells capture ref_grad int8` leaves
out the C cell, whose -O3 build of a large model takes minutes on a loaded machine.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import real_models  # noqa: E402  (runs the torchvision schema workaround first)
from tests.realmodels.families import FAMILIES  # noqa: E402

#: the cells of bench/real_models.py the probe runs, in order
PROBE_CELLS = ["capture", "ref_grad", "c", "int8"]
#: float64 gradients within this of torch.autograd's pass (tests/realmodels/test_families.py)
REF_TOL = 1e-9
#: float32 C within this of the float32 reference passes (tests/realmodels/test_families_c.py)
C_TOL = 2e-5
#: an op named in an error: UnsupportedOpError's "... op 'name'" / "aten.name" forms
OP_NAME = re.compile(r"(aten\.[\w.]+|'[\w.:]+'|\"[\w.:]+\")")


def verdict(key: str, v: dict) -> str:
    if "error" in v:
        return "FAIL"
    if key == "ref_grad":
        return "ok" if v["max_rel_err"] <= REF_TOL else f"OFF {v['max_rel_err']:.1e} ({v['worst']})"
    if key == "c":
        return "ok" if v["max_rel_err"] <= C_TOL else f"OFF {v['max_rel_err']:.1e} ({v['worst']})"
    return "ok"


def first_refusal(r: dict) -> str:
    """The first failing cell's error, with the op it names first when it names one."""
    for key in PROBE_CELLS:
        err = r.get(key, {}).get("error")
        if err:
            op = OP_NAME.search(err)
            return f"{key}: " + (f"[{op.group(1)}] " if op else "") + err
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(FAMILIES), help="names (default: every family model)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per model (default 300)")
    ap.add_argument("--cells", nargs="+", choices=PROBE_CELLS, default=PROBE_CELLS, help="default: all four")
    ap.add_argument("--json", help="append each model's cells as a JSON line to this file")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in FAMILIES]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {list(FAMILIES)}")
    cells = [c for c in PROBE_CELLS if c in args.cells]
    print("| model | " + " | ".join(cells) + " | s | first refusal |")
    print("|---|" + "---|" * len(cells) + "---:|---|")
    for name in args.models:
        r = real_models.run_one(name, args.timeout, cells)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
        row = " | ".join(verdict(k, r[k]) for k in cells)
        refusal = first_refusal(r).replace("|", "\\|")
        print(f"| {name} | {row} | {r.get('total_seconds', '')} | {refusal} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
