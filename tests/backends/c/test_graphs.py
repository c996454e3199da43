"""Only the graphs a program runs are emitted (emit_c's `graphs`): a host project or firmware
without the forward or grad graph still builds and trains, model.c holds no code of the graphs
left out, and a call of a left-out graph's entry point fails to compile, naming the graph."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import host
from edgetrain.backends.c.cortexm import firmware_project_files
from edgetrain.backends.c.export import emit_c
from edgetrain.backends.c.layout import CBackendError

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no host C compiler")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    prog = et.compile(model, (torch.zeros(1, 1, 6, 6),), optimizer=et.SGD(lr=0.05))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((1, 1, 6, 6)).astype(np.float32), np.array([i % 3])) for i in range(2)]
    return prog, data


def _run_main(d) -> list[str]:
    r = subprocess.run(["make", "-s", "main"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return subprocess.run(["./main"], cwd=d, capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()


def test_a_project_without_forward_and_grad_trains_as_the_whole_one(tmp_path, tiny):
    prog, data = tiny
    whole = _run_main(emit_c(prog, tmp_path / "all", "host", data))
    d = emit_c(prog, tmp_path / "train", "host", data, graphs=("train",))
    lines = _run_main(d)
    assert [l for l in lines if l.startswith("step ")] == [l for l in whole if l.startswith("step ")]
    assert not any(l.startswith("predict") for l in lines) and any(l.startswith("predict") for l in whole)
    model_c = (d / "model.c").read_text()
    assert "et_run_train" in model_c and "et_run_forward" not in model_c and "et_run_grad" not in model_c
    assert len(model_c) < len((tmp_path / "all" / "model.c").read_text())


@pytest.mark.parametrize("graphs,fn,call", [
    (("train",), "et_predict", "float out[ET_OUTPUT_FLOATS]; et_predict(in, out);"),
    (("train", "forward"), "et_gradients", "void *outs[1] = {0}; et_gradients(in, in, outs);"),
])
def test_calling_a_left_out_graph_fails_to_compile_naming_it(tmp_path, tiny, graphs, fn, call):
    prog, _ = tiny
    d = emit_c(prog, tmp_path / "p", "host", graphs=graphs)
    (d / "use.c").write_text('#include "model.h"\nvoid use(const void *in) { ' + call + " }\n")
    r = subprocess.run([host.find_cc(), "-std=gnu11", "-c", "use.c"], cwd=d, capture_output=True, text=True)
    graph = "forward" if fn == "et_predict" else "grad"
    assert r.returncode != 0 and f"{fn}: this program was emitted without its {graph} graph" in r.stderr
    # the library itself builds, and the graphs kept are callable
    (d / "use.c").write_text('#include "model.h"\nfloat use(const void *in) { return et_train_step(in, in); }\n')
    subprocess.run([host.find_cc(), "-std=gnu11", "-c", "use.c"], cwd=d, check=True)
    subprocess.run(["make", "-s"], cwd=d, check=True)


def test_firmware_emits_the_train_graph_unless_asked(tiny):
    prog, data = tiny
    files = firmware_project_files(prog, "cortex-m4", data)
    assert "et_run_forward" not in files["model.c"] and "ET_LEFT_OUT(\"et_predict" in files["model.h"]
    both = firmware_project_files(prog, "cortex-m4", data, graphs=("train", "forward"))
    assert "et_run_forward" in both["model.c"] and "void et_predict(const void *input, float *out);" in both["model.h"]


def test_graphs_must_include_train(tmp_path, tiny):
    with pytest.raises(CBackendError, match="train is required"):
        emit_c(tiny[0], tmp_path / "p", "host", graphs=("forward",))
