"""The host library compiles the graphs' chunk functions (the call sequences), the state accessors, et_gradients
and the checked step's guard at -O1 and the kernels at -O3 (host.DEFAULT_CFLAGS: ET_GRAPH_O1,
runtime/et_common.h ET_GRAPH_ATTR): the loops those hold inline (elementwise ops, sums, the SGD updates) must
vectorize as they did at -O3 (-O1 alone left the outer loop of a sum over rows scalar: "tree-loop-vectorize"
beside it) and compute the program."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.backends.c import emit_graphs, front_pch, host
from edgetrain.backends.c.emit import emit_sources
from edgetrain.backends.c.staging import write_files
from edgetrain.backends.c.step_guard import with_guard

CC = host.host_compiler()
needs_gcc = pytest.mark.skipif(CC is None or not front_pch.is_gcc(CC), reason="ET_GRAPH_O1 applies to GCC only")
RUNTIME = Path(host.__file__).parent / "runtime"
O3_FLAGS = tuple(f for f in host.DEFAULT_CFLAGS if f != "-DET_GRAPH_O1")


def _graph_attr(flags) -> str:
    out = subprocess.run([CC, *flags, "-I", str(RUNTIME), "-E", "-dM", "-x", "c", "-"],
                         input='#include "et_common.h"\n', capture_output=True, text=True, check=True).stdout
    return re.search(r"^#define ET_GRAPH_ATTR(.*)$", out, re.M).group(1).strip()


@needs_gcc
def test_the_host_library_compiles_the_graphs_at_O1_and_projects_do_not():
    assert "-DET_GRAPH_O1" in host.DEFAULT_CFLAGS and "-DET_GRAPH_O1" not in host.PROJECT_CFLAGS
    assert _graph_attr(host.DEFAULT_CFLAGS) == '__attribute__((optimize("O1", "tree-loop-vectorize")))'
    assert _graph_attr(O3_FLAGS) == ""
    assert _graph_attr(host.PROJECT_CFLAGS) == ""  # an emitted project's Makefile: as before


class _Net(torch.nn.Module):
    """A residual add, ReLU, a global mean and a dense layer: loops model.c holds inline, trained by SGD with
    momentum (its updates inline too)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = h + self.b(h)
        return self.fc(h.mean(dim=(2, 3)))


def _vectorized(files, flags, work: Path) -> set:
    """(line, widest vector in bytes) of each loop of model.c that GCC reports vectorized
    (-fopt-info-vec-optimized): the main loop's width, and with it the order an `omp simd` reduction sums in.
    A line's narrower reports are the same loop's vectorized epilogues (its last few iterations), which GCC
    adds or leaves out by the callers' optimization level and the CPU's tuning (an AMD EPYC's -march=native
    gave et_any_nonfinite a 16-byte epilogue at -O3 and a 32-byte one beside the -O1 graphs)."""
    write_files(work, files)
    host.compile_c(CC, [*flags, "-fopt-info-vec-optimized=vec.txt", "-c", "-o", "model.o", "model.c"], work)
    widest: dict[str, int] = {}
    for line, width in re.findall(r"^model\.c:(\d+):\d+: optimized: loop vectorized using (\d+) byte vectors$",
                                  (work / "vec.txt").read_text(), re.M):
        widest[line] = max(widest.get(line, 0), int(width))
    return set(widest.items())


@needs_gcc
def test_the_graph_loops_vectorize_as_at_O3_and_the_library_computes_the_program(tmp_path, monkeypatch):
    monkeypatch.setattr(emit_graphs, "CHUNK_NODES", 4)  # this small graph in chunk functions, as a large one is
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    y = np.array([1, 3])
    prog = et.compile(_Net().eval(), (x,), update=et.Full(), optimizer=et.SGD(lr=0.05, momentum=0.9))
    files = emit_sources(prog)
    assert files["model.c"].count("ET_NOINLINE ET_GRAPH_ATTR void et_run_train_") >= 4
    for fn in ("int et_get_state(", "void *et_state_ptr(", "int et_set_state(", "int et_bind_state(",
               "void et_gradients(", "int et_train_step_checked(", "void et_guard_save(", "void et_guard_check("):
        assert f"ET_GRAPH_ATTR {fn}" in files["model.c"], fn  # the per-tensor switches and copies, and the guard
    # the library's flags (CRunner builds with the step guard): the checked step and its guard are compiled too
    o1 = _vectorized(files, with_guard(host.DEFAULT_CFLAGS), tmp_path / "o1")
    o3 = _vectorized(files, with_guard(O3_FLAGS), tmp_path / "o3")
    # the SGD updates (2 weights and 2 biases of the convolutions, the dense layer's 2), the add, the ReLU, the
    # sums, at least; each at -O1 too, at the same width (-O1 may vectorize a small loop -O3 unrolled instead)
    assert len(o3) >= 8 and o3 <= o1, sorted(o3 - o1)
    c = host.to_c_program(prog)  # the library (-O1 graphs, its public step the checked one) against the reference
    g_c, g_ref = c.gradients(x, y), prog.gradients(x, y)  # et_gradients
    assert set(g_c) == set(g_ref)
    for k in g_ref:
        np.testing.assert_allclose(g_c[k], g_ref[k], rtol=1e-5, atol=1e-6)
    for _ in range(3):
        np.testing.assert_allclose(c.step(x, y), prog.step(x, y), rtol=1e-5)
    np.testing.assert_allclose(c.predict(x), prog.predict(x), rtol=1e-5, atol=1e-6)
    for k in prog.state:
        np.testing.assert_allclose(np.asarray(c.state[k]), np.asarray(prog.state[k]), rtol=1e-5, atol=1e-6)
