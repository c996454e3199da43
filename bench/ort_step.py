"""ONNX Runtime training's step on the model bench/step_speed.py times: run by that bench in a
subprocess with the ORT venv's python (onnx 1.17.0 and onnxruntime-training 1.19.2 need their own
environment; step_speed.py's --ort-python, set-up commands in its docstring).

    ORT_PYTHON bench/ort_step.py WORK_DIR   (PYTHONPATH holding edgetrain's src/)

WORK_DIR holds what the bench wrote: job.json (model, size, batch, lr, repeats, warmup and the
trained parameters' names), x.npy, y.npy and state.pt (the model's state_dict). Steps:
1. the model (`edgetrain.models.get`, eval mode) with that state; eager PyTorch's loss on (x, y);
2. every Conv2d -> BatchNorm2d pair folded into the convolution (torch.fx): ORT's training
   graph would silently switch batch norm to batch statistics, while the bench's other systems
   train in eval mode on running statistics. A folded convolution's weight trains where the
   convolution's weight or the batch norm's weight trained, its bias where either bias trained;
3. exported to ONNX (TorchScript exporter, no constant folding), training artifacts built with
   cross-entropy loss and ORT's SGD: the artifacts offer SGD *without momentum* (SGDOptimizerV2)
   and AdamW only, so ORT's step does one update pass less than the others' SGD with momentum;
4. timed: one thread (intra_op_num_threads=1, so the ops run on the calling thread and its CPU
   time is the step's), `module(x, y)` + `optimizer.step()` + `module.lazy_reset_grad()`.
Prints one JSON line: ort_ms / ort_cpu_ms (medians), the first step's loss and eager's, their
relative difference, the optimizer in words and the number of trained tensors.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from onnxruntime.training import artifacts
from onnxruntime.training.api import CheckpointState, Module, Optimizer

import edgetrain as et

#: ONNX opset of the export (ORT 1.19's training ops cover it)
OPSET = 17
#: the optimizer ORT's artifacts build, in words (see the module docstring)
OPTIMIZER = "SGD without momentum (onnxruntime-training's artifacts offer SGD and AdamW only)"


def fold_batch_norm(model: torch.nn.Module, trained: set) -> tuple[torch.fx.GraphModule, set]:
    """(the model with each Conv2d -> BatchNorm2d pair folded into the convolution, the trained
    parameter names of the folded model)."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    gm = torch.fx.symbolic_trace(model)
    mods = dict(gm.named_modules())
    now = {n for n, _ in model.named_parameters() if n in trained}
    for node in list(gm.graph.nodes):
        src = node.args[0] if node.op == "call_module" and node.args else None
        if not (isinstance(mods.get(node.target), torch.nn.BatchNorm2d) and getattr(src, "op", "") == "call_module"
                and isinstance(mods.get(src.target), torch.nn.Conv2d) and len(src.users) == 1):
            continue
        conv, bn = mods[src.target], mods[node.target]
        parent, _, attr = src.target.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, attr, fuse_conv_bn_eval(conv, bn))
        if f"{src.target}.weight" in now or f"{node.target}.weight" in now:
            now.add(f"{src.target}.weight")
        if f"{src.target}.bias" in now or f"{node.target}.bias" in now:
            now.add(f"{src.target}.bias")
        now -= {f"{node.target}.weight", f"{node.target}.bias"}
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm, {n for n, _ in gm.named_parameters() if n in now}


def build_artifacts(model: torch.nn.Module, trained: set, x: torch.Tensor, folder: Path) -> int:
    """Export `model` and write ORT's training artifacts into `folder`; returns the number of
    trained tensors."""
    import onnx

    path = folder / "model.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["output"], opset_version=OPSET,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING, dynamo=False)
    proto = onnx.load(str(path))
    inits = [t.name for t in proto.graph.initializer]
    missing = sorted(trained - set(inits))
    if missing:
        raise SystemExit(f"ort_step: trained parameters not found among the ONNX initializers: {missing[:5]}")
    requires = [n for n in inits if n in trained]
    artifacts.generate_artifacts(proto, requires_grad=requires, frozen_params=[n for n in inits if n not in trained],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=str(folder))
    return len(requires)


def main(work: Path) -> None:
    job = json.loads((work / "job.json").read_text())
    model = et.models.get(job["model"], num_classes=10).eval()
    model.load_state_dict(torch.load(work / "state.pt"))
    x, y = np.load(work / "x.npy"), np.load(work / "y.npy").astype(np.int64)
    with torch.no_grad():
        eager = float(torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)))
    folded, trained = fold_batch_norm(model, set(job["trained"]))
    n_trained = build_artifacts(folded, trained, torch.from_numpy(x), work)
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    state = CheckpointState.load_checkpoint(str(work / "checkpoint"))
    module = Module(str(work / "training_model.onnx"), state, str(work / "eval_model.onnx"), device="cpu",
                    session_options=so)
    opt = Optimizer(str(work / "optimizer_model.onnx"), module)
    opt.set_learning_rate(job["lr"])
    module.train()

    def step() -> float:
        loss = module(x, y)
        opt.step()
        module.lazy_reset_grad()
        return float(loss)

    first = step()
    for _ in range(job["warmup"]):
        step()
    wall, cpu = [], []
    for _ in range(job["repeats"]):
        t, tc = time.perf_counter(), time.thread_time()
        step()
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - tc)
    print(json.dumps({"ort_ms": round(1e3 * statistics.median(wall), 3),
                      "ort_cpu_ms": round(1e3 * statistics.median(cpu), 3),
                      "ort_first_loss": first, "eager_first_loss": eager,
                      "ort_loss_rel_diff": abs(first - eager) / max(abs(eager), 1e-12), "ort_optimizer": OPTIMIZER,
                      "ort_trained_tensors": n_trained, "onnxruntime": onnxruntime.__version__}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
