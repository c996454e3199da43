"""Supported-models table: real models from torchvision, timm and Hugging Face transformers
at the test configs (tests/realmodels/conftest.py: images 2x3x64x64, 16 tokens, hidden sizes
about 32), and the model families of issue 31 (tests/realmodels/families.py: audio, sensors,
segmentation, autoencoders, video, LoRA, group norm, activations, each at its own small input),
each cell measured in one run.

    python bench/real_models.py [--models NAME ...] [--families] [--json out.jsonl] [--timeout 600] [--ray [ADDRESS]]
    python bench/real_models.py --summarize out.jsonl

Columns, one row per model (a cell that fails records the first line of its error and the
row goes on):
- capture: `edgetrain.frontend.capture` of the float64 model, ok or the error;
- ref grad: max relative error of `et.compile(model.double(), (x,), update=et.Full())
  .gradients(x, y)` against torch.autograd, float64 (relative to each gradient's largest
  entry, or 1e-3 of the model's largest gradient if that is larger: tests/realmodels; torch's
  hardsigmoid backward, which multiplies by a float32 1/6, replaced by a float64 one);
- C: the same for the float32 C backend (`backend="c"`) against the float32 reference;
- int8: `et.compile(model, (x,), quantize="int8", update=et.LastK(2))` (LastK(1) where the
  int8 program has one conv/linear layer: GPT-2's are matmuls) and one `step`: its loss if
  finite;
- torch.compile: an unchanged 3-step SGD loop (lr 0.01, the same batch each step) under
  `torch.compile(model, backend="edgetrain")` in eval mode vs eager on a copy: max relative
  difference of the three losses;
- torch.compile train(): the float64 model in train() (batch statistics; dropout and stochastic
  depth masks drawn from torch's generator as eager draws them), 3 seeded steps of SGD with
  momentum 0.9 (lr 0.01) compiled vs eager: max relative difference of the losses;
- memory: `prog.memory.peak_bytes` of the Full float32 program vs PyTorch eager's metered
  peak of the same step (bench/torch_memory.py, training the same tensors), and the ratio
  PyTorch / edgetrain.

A family model trains with its own loss (`families.FAMILIES[name].loss`: cross entropy, or an
autoencoder's MSE against its input) in every cell; the memory cell meters cross-entropy steps
only (bench/torch_memory.py) and says so for the others.

Each model runs in its own subprocess with a time limit (--timeout seconds); cells finished
before the limit are kept, the rest read "timeout". One thread. With --ray the models are
measured as Ray tasks (one CPU each: a local Ray using every core, or the cluster at ADDRESS);
rows print as they finish, the table keeps the order asked.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

# the torchvision op-schema workaround (tests/realmodels/conftest.py) runs at this import,
# before anything imports torchvision
from tests.realmodels import conftest as rm  # noqa: E402
from tests.realmodels import families as fam  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

warnings.filterwarnings("ignore", message=r".*(LeafSpec|token_id).*")

#: the models of tests/realmodels/conftest.py, light models first, the heavy ones last
HEAVY = ("tv.resnet50", "tv.densenet121", "tv.vit_b_16", "tv.convnext_tiny", "tv.swin_t")
MODELS = {**{k: v for k, v in rm.BUILDERS.items() if k not in HEAVY}, **{k: rm.BUILDERS[k] for k in HEAVY},
          **fam.FAMILIES}
CELLS = ["capture", "ref_grad", "c", "int8", "torch_compile", "torch_compile_train", "memory"]
TRAIN_SEED = 123
FLOOR = 1e-3  # as tests/realmodels: gradients exactly zero in exact arithmetic are rounding noise
LR, STEPS = 0.01, 3
ERR_CHARS = 120  # of an error's first line, in the table


def build(name: str):
    """(float64 eval model, example input, labels), as tests/realmodels/conftest.build (or
    families.build: labels, or the input itself for an autoencoder)."""
    if name in fam.FAMILIES:
        return fam.build(name)
    make, kind = MODELS[name]
    torch.manual_seed(0)
    model = make().double().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*rm.IMAGE, generator=g, dtype=torch.float64) if kind == "image" else \
        torch.randint(1, rm.VOCAB, rm.TOKENS, generator=g)
    with torch.no_grad():
        classes = model(x).shape[-1]
    y = torch.randint(0, classes, (x.shape[0],), generator=g)
    return model, x, y


def loss_of(name: str) -> str:
    """The loss `name` trains with: et.compile's `loss` argument."""
    return fam.FAMILIES[name].loss if name in fam.FAMILIES else "cross_entropy"


#: et.compile's losses as torch computes them
TORCH_LOSS = {"cross_entropy": F.cross_entropy, "mse": F.mse_loss}


class EagerError(RuntimeError):
    """PyTorch eager itself failed (the peer of a cell, not edgetrain)."""


def first_line(e: BaseException) -> str:
    if isinstance(e, EagerError):
        return str(e)[:300]
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def max_rel_err(ours: dict, ref: dict) -> tuple[float, str]:
    """Worst relative error over the gradients of `ref` (keys must agree), and its name."""
    if set(ours) != set(ref):
        raise AssertionError(f"gradients for {sorted(set(ours) ^ set(ref))[:3]} on one side only")
    floor = FLOOR * max(float(np.abs(g).max()) for g in ref.values())
    errs = {k: float(np.abs(np.asarray(ours[k]) - ref[k]).max() / max(float(np.abs(ref[k]).max()), floor, 1e-300))
            for k in ref}
    worst = max(errs, key=errs.get)
    return errs[worst], worst


def loss_diff(ours: list, eager: list) -> dict:
    """Max relative difference over the steps where both losses are finite, and the steps
    (1-based) where either is not (a diverging loop: both sides must agree there too)."""
    fin = [(a, b) for a, b in zip(ours, eager) if math.isfinite(a) and math.isfinite(b)]
    bad = [i + 1 for i, (a, b) in enumerate(zip(ours, eager)) if not (math.isfinite(a) and math.isfinite(b))]
    same = all(math.isfinite(a) == math.isfinite(b) for a, b in zip(ours, eager))
    return {"max_rel_diff": max((abs(a - b) / max(abs(b), 1e-30) for a, b in fin), default=float("nan")),
            "nonfinite_steps": bad, "nonfinite_on_both": same}


def torch_gradients(model, x, y, loss: str = "cross_entropy") -> dict:
    """torch.autograd's, with hardsigmoid's backward in float64 as tests/realmodels takes them
    (torch's own multiplies by a float32 1/6: test_capture.float64_truth)."""
    from tests.realmodels.test_capture import float64_truth

    model.zero_grad(set_to_none=True)
    with float64_truth():
        TORCH_LOSS[loss](model(x), y).backward()
    # a trained parameter the forward does not use (wav2vec2's masked_spec_embed in eval mode)
    # gets no .grad from torch: its gradient is zero, as ours is
    out = {n: p.grad.detach().numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape))
           for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


def row(name: str, emit=None, cells=None) -> dict:
    """Measures the cells named in `cells` (default all, CELLS) for `name`; `emit(row)` (if
    given) is called after each cell."""
    import edgetrain as et
    from edgetrain.frontend import capture
    from torch_memory import measure_torch_step

    torch.set_num_threads(1)
    r = {"bench": "real_models", "model": name, "torch_version": torch.__version__}
    times = r["seconds"] = {}

    def cell(key, fn):
        t0 = time.perf_counter()
        try:
            r[key] = fn()
        except Exception as e:  # noqa: BLE001 - every failure is a result here
            r[key] = {"error": first_line(e)}
            if os.environ.get("REAL_MODELS_TRACE"):
                traceback.print_exc()
        times[key] = round(time.perf_counter() - t0, 1)
        if emit:
            emit(r)

    model64, x64, y = build(name)
    model32 = copy.deepcopy(model64).float()
    x32 = x64.float() if x64.is_floating_point() else x64
    loss = loss_of(name)
    torch_loss = TORCH_LOSS[loss]
    y32 = y.float() if y.is_floating_point() else y  # an autoencoder's target
    r["input"] = list(x64.shape)
    progs = {}

    def on_eager(fn):
        """Runs PyTorch eager's side; its errors are labelled as eager's."""
        try:
            return fn()
        except Exception as e:
            raise EagerError(f"PyTorch eager: {first_line(e)}") from e

    def do_capture():
        cap = capture(model64, (x64,))
        return {"ok": True, "nodes": len(cap.graph.nodes)}

    def do_ref_grad():
        ours = et.compile(model64, (x64,), loss=loss, update=et.Full()).gradients(x64.numpy(), y.numpy())
        err, worst = max_rel_err(ours, torch_gradients(model64, x64, y, loss))
        return {"max_rel_err": err, "worst": worst, "tensors": len(ours)}

    def do_c():
        ref32 = et.compile(model32, (x32,), loss=loss, update=et.Full())
        progs["ref32"] = ref32
        ref = ref32.gradients(x32.numpy(), y32.numpy())
        got = et.compile(model32, (x32,), loss=loss, update=et.Full(), backend="c").gradients(x32.numpy(),
                                                                                             y32.numpy())
        err, worst = max_rel_err(got, ref)
        return {"max_rel_err": err, "worst": worst}

    def do_int8():
        from edgetrain.trainable import SchemeError

        k = 2
        try:
            prog = et.compile(copy.deepcopy(model32), (x32,), loss=loss, quantize="int8", update=et.LastK(k))
        except SchemeError as e:  # GPT-2: its Conv1D layers are matmuls, its one linear layer the head
            if "has only 1" not in str(e):
                raise
            k = 1
            prog = et.compile(copy.deepcopy(model32), (x32,), loss=loss, quantize="int8", update=et.LastK(k))
        value = float(prog.step(x32.numpy(), y32.numpy()))
        if not math.isfinite(value):
            raise ArithmeticError(f"loss {value}")
        return {"loss": value, "last_k": k}

    def do_torch_compile():
        import torch._dynamo

        torch._dynamo.reset()

        def loop(m, fn):
            opt = torch.optim.SGD(m.parameters(), lr=LR)
            losses = []
            for _ in range(STEPS):
                opt.zero_grad()
                value = torch_loss(fn(x32), y32)
                value.backward()
                opt.step()
                losses.append(value.item())
            return losses

        eager_m, ours_m = copy.deepcopy(model32).eval(), copy.deepcopy(model32).eval()
        eager = on_eager(lambda: loop(eager_m, eager_m))
        ours = loop(ours_m, torch.compile(ours_m, backend="edgetrain"))
        return {**loss_diff(ours, eager), "losses": ours, "eager_losses": eager}

    def do_torch_compile_train():
        """train() (batch statistics, dropout masks drawn from torch's generator as eager
        draws them), float64, seeded: tests/realmodels/test_torch_compile.py's loop."""
        import torch._dynamo
        torch._dynamo.reset()
        fresh = build(name)[0]  # not model64: an eval-mode forward may have cached tensors with
        # their autograd graph in it (timm's LeViT attention biases), which deepcopy refuses
        eager_m, ours_m = copy.deepcopy(fresh).train(), copy.deepcopy(fresh).train()

        def loop(m, fn):
            torch.manual_seed(TRAIN_SEED)
            return train_losses(m, fn, x64, y, torch_loss)

        eager = on_eager(lambda: loop(eager_m, eager_m))
        ours = loop(ours_m, torch.compile(ours_m, backend="edgetrain"))
        return {**loss_diff(ours, eager), "losses": ours, "eager_losses": eager}

    def do_memory():
        if loss != "cross_entropy":
            raise NotImplementedError(f"bench/torch_memory.py meters cross-entropy steps, not {loss}")
        prog = progs.get("ref32") or et.compile(model32, (x32,), update=et.Full())
        pt = on_eager(lambda: measure_torch_step(copy.deepcopy(model32), x32, y, set(prog.trainable), lr=LR))
        ours = prog.memory.peak_bytes
        return {"edgetrain_peak_bytes": ours, "torch_peak_bytes": pt["peak_bytes"],
                "ratio": pt["peak_bytes"] / ours}

    for key, fn in [("capture", do_capture), ("ref_grad", do_ref_grad), ("c", do_c), ("int8", do_int8),
                    ("torch_compile", do_torch_compile), ("torch_compile_train", do_torch_compile_train),
                    ("memory", do_memory)]:
        if cells is None or key in cells:
            cell(key, fn)
    return r


def train_losses(model, fn, x, y, torch_loss) -> list:
    """tests/torch_backend/loops.train_loop's losses (SGD, momentum 0.9, `STEPS` steps on the same
    batch) with the model's own loss."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        value = torch_loss(fn(x), y)
        value.backward()
        losses.append(value.item())
        opt.step()
    return losses


def run_one(name: str, timeout: float, cells=None) -> dict:
    """`row(name)` in a subprocess; on timeout the cells it finished are kept."""
    with tempfile.TemporaryDirectory() as d:
        part = Path(d) / "row.json"
        cmd = [sys.executable, __file__, "--child", name, "--partial", str(part)] + \
            (["--cells", *cells] if cells else [])
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            failed = None if p.returncode == 0 else f"subprocess exit {p.returncode}: " + \
                ((p.stderr.strip().splitlines() or [""])[-1])[:300]
        except subprocess.TimeoutExpired:
            failed = f"timeout after {timeout:.0f} s"
        r = json.loads(part.read_text()) if part.exists() else {"bench": "real_models", "model": name}
        for key in cells or CELLS:
            if key not in r:
                r[key] = {"error": failed or "not run"}
        r["total_seconds"] = round(time.perf_counter() - t0, 1)
        return r


# ---------------------------------------------------------------- the table

def fmt_cell(key: str, v) -> str:
    if not isinstance(v, dict):
        return "?"
    if "error" in v:  # the JSON line keeps 300 characters of it
        e = re.sub(r"/\S*/site-packages/", "", v["error"])  # the package's own path
        return (e if len(e) <= ERR_CHARS else e[:ERR_CHARS - 1] + "…").replace("|", "\\|")
    if key == "capture":
        return "ok"
    if key in ("ref_grad", "c"):
        return f"{v['max_rel_err']:.1e}"
    if key == "int8":
        return f"ok (loss {v['loss']:.3f}" + (f", LastK({v['last_k']})" if v.get("last_k", 2) != 2 else "") + ")"
    if key in ("torch_compile", "torch_compile_train"):
        d = loss_diff(v["losses"], v["eager_losses"])  # recomputed: rows may predate nonfinite_steps
        note = "" if not d["nonfinite_steps"] else \
            f" (step {', '.join(map(str, d['nonfinite_steps']))}: loss not finite on " \
            f"{'both sides' if d['nonfinite_on_both'] else 'one side'})"
        return f"{d['max_rel_diff']:.1e}{note}"
    if key == "memory":
        return f"{v['edgetrain_peak_bytes'] / 1024:,.0f} KB / {v['torch_peak_bytes'] / 1024:,.0f} KB " \
               f"({v['ratio']:.2f}x)"
    return "?"


def table(rows: list[dict]) -> str:
    lines = ["| model | capture | ref grad (f64 rel err) | C (f32 rel err) | int8 LastK(2) step "
             "| torch.compile eval (loss rel diff) | torch.compile train() f64 (loss rel diff) "
             "| peak memory edgetrain / PyTorch (ratio) | s |",
             "|---|---|---:|---:|---|---:|---:|---|---:|"]
    for r in rows:
        cells = " | ".join(fmt_cell(k, r.get(k)) for k in CELLS)
        lines.append(f"| {r['model']} | {cells} | {r.get('total_seconds', '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="names (default: all, light ones first)")
    ap.add_argument("--families", action="store_true",
                    help="the models of tests/realmodels/families.py only (issue 31), unless --models names others")
    ap.add_argument("--json", help="append one JSON line per model to this file as it finishes")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per model (default 600)")
    ap.add_argument("--summarize", help="print the markdown table of a JSONL file and exit")
    ap.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                    help="measure the models as Ray tasks: on a local Ray, or on the cluster at ADDRESS (HOST:PORT)")
    ap.add_argument("--cells", nargs="+", choices=CELLS, help=argparse.SUPPRESS)  # bench/family_probe.py's
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--partial", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.summarize:
        print(table([json.loads(s) for s in Path(args.summarize).read_text().splitlines() if s.strip()]))
        return 0
    if args.child:
        def emit(r):
            Path(args.partial + ".tmp").write_text(json.dumps(r))
            os.replace(args.partial + ".tmp", args.partial)
        row(args.child, emit, args.cells)
        return 0
    if args.families and args.models == list(MODELS):
        args.models = list(fam.FAMILIES)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {list(MODELS)}")
    from edgetrain.scale import RayExecutor, run_pieces

    def finished(name, r):
        print(json.dumps(r), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")

    executor = None if args.ray is None else RayExecutor(address=None if args.ray == "local" else args.ray)
    try:  # each model is independent: printed and appended as it finishes, tabled in the order asked
        rows = list(run_pieces(model_piece, args.timeout, {name: name for name in args.models},
                               executor=executor, progress=finished).values())
    finally:
        if executor is not None:
            executor.close()
    print()
    print(table(rows))
    return 0


def model_piece(timeout: float, name: str) -> dict:
    """One model's row (a piece of scale.run_pieces: here or a Ray task)."""
    return run_one(name, timeout)


if __name__ == "__main__":
    sys.exit(main())
