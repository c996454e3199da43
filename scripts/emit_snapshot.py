"""Emit the C of a representative set of programs into a folder, one file per emitted file, to
compare two versions of the C emitter byte for byte (issue 19: the emitter in sections, behaviour
unchanged).

    python scripts/emit_snapshot.py OUT_DIR [--quick]
    PYTHONPATH=/path/to/other/checkout/src python scripts/emit_snapshot.py OTHER_DIR
    diff -r OUT_DIR OTHER_DIR

The set: every zoo model (src/edgetrain/models) at a small resolution, float32 and int8, full and
sparse updates, emitted for the host (all three graphs, weights not embedded: what the C runner
builds) and as its Cortex-M firmware's train graph (weights embedded); the firmware projects of
cortex-m4 and cortex-m7; weight banks 2; a paged schedule (host). A case that fails records its
error text instead, so a refusal must stay a refusal.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch

import edgetrain as et
from edgetrain.backends.c.emit import emit_sources

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.backends.test_matrix import batches  # noqa: E402  (the matrix's sample batches)

SMALL_IMAGE, SMALL_TOKENS = 32, 16
SCHEMES = {"full": et.Full(), "sparse": et.Sparse(bias_last=4, weights={0: 0.5, 2: 0.25, 5: 1.0})}
QUICK_MODELS = ("mcunet-5fps", "resnet18-cifar", "bert-tiny")


def small_input(name: str) -> torch.Tensor:
    x = et.models.example_input(name, batch=1, seed=1)
    if x.is_floating_point():
        return x[..., :SMALL_IMAGE, :SMALL_IMAGE].contiguous()
    return x[:, :SMALL_TOKENS].contiguous()


def record(out: Path, case: str, make) -> None:
    d = out / case
    d.mkdir(parents=True, exist_ok=True)
    try:
        files = make()
    except Exception as e:  # the refusal is part of the behaviour
        (d / "ERROR.txt").write_text(f"{type(e).__name__}: {e}\n")
        print(f"{case}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return
    for name, text in files.items():
        data = text if isinstance(text, bytes) else text.encode()
        (d / name).write_bytes(data)
    print(f"{case}: {len(files)} files", flush=True)


def main(argv) -> None:
    out = Path(argv[1])
    quick = "--quick" in argv
    from edgetrain.backends.c.cortexm import firmware_project_files

    models = QUICK_MODELS if quick else tuple(et.models.names())
    for name in models:
        x = small_input(name)
        model = et.models.get(name, num_classes=10)
        for scheme in SCHEMES:
            for dtype in ("float32", "int8"):
                case = f"{name}-{scheme}-{dtype}"
                try:
                    prog = et.compile(model, (x,), loss="cross_entropy", update=SCHEMES[scheme],
                                      quantize="int8" if dtype == "int8" else None,
                                      optimizer=et.SGD(lr=0.01, momentum=0.9))
                except Exception as e:
                    record(out, case, lambda e=e: (_ for _ in ()).throw(e))
                    continue
                record(out, case + "-host", lambda: emit_sources(prog))
                record(out, case + "-train-embedded", lambda: emit_sources(prog, True, graphs=("train",)))
                if scheme == "full" and dtype == "float32" or name == "mcunet-5fps":
                    record(out, case + "-banks2", lambda: emit_sources(prog, True, graphs=("train",), weight_banks=2))
                if name in ("mcunet-5fps", "bert-tiny") or (name == "resnet18-cifar" and dtype == "int8"):
                    for target in ("cortex-m4", "cortex-m7"):
                        record(out, f"{case}-{target}",
                               lambda: firmware_project_files(prog, target, batches(x, 10, n=2)))
    # a paged schedule (host): page what the paging solver picks under a tight budget
    x = small_input("mcunet-5fps")
    prog = et.compile(et.models.get("mcunet-5fps", num_classes=10), (x,), loss="cross_entropy")
    for solver in ("paging", "milp"):
        def paged():
            for share in (0.97, 0.94, 0.9):  # the first budget the solver meets, below the plain peak
                try:
                    sched = et.schedule(prog, device="a72", ram=int(prog.memory.peak_bytes * share),
                                        solver=solver, time_limit=20.0)
                    break
                except Exception:
                    if share == 0.9:
                        raise
            p = prog.apply(sched, str(out / "pages.bin"))
            files = emit_sources(p)
            files["_schedule.txt"] = (f"share {share} page_out {sorted(sched.page_out)} "
                                      f"recompute {sched.recomputations}\n")
            return files
        record(out, f"mcunet-5fps-paged-{solver}", paged)

if __name__ == "__main__":
    try:
        main(sys.argv)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
