"""Run a small graph of int8 ops through their C kernels (kernels/int8.py, et_int8.h) and
through the reference interpreter: a one-file C program (arena + state arrays + the node
blocks in order) built as a shared library and driven with ctypes. Used by test_int8.py
for per-op checks, independent of the full program emitter."""
from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from edgetrain.backends.c.kernels import EmitContext, kernel_for
from edgetrain.backends.c.layout import C_TYPES, Layout, StateArray, plan_graph
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph
from edgetrain.ops.base import Emitter

RUNTIME = Path(__file__).resolve().parents[3] / "src" / "edgetrain" / "backends" / "c" / "runtime"
CFLAGS = ["-O2", "-std=c11", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall", "-Werror",
          "-Wno-unused-variable", "-Wno-unused-function", "-fPIC", "-shared"]
STEP_NAME = "step"
CC = shutil.which("cc") or shutil.which("gcc")


def graph_of(build, inputs: dict[str, np.ndarray]) -> Graph:
    """A graph from `build(e, values) -> outputs` over named input values typed like `inputs`."""
    from edgetrain.ir import TensorType, new_value

    vals = {k: new_value(TensorType(tuple(a.shape), str(a.dtype)), k) for k, a in inputs.items()}
    e = Emitter()
    outs = build(e, vals)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    return Graph(tuple(vals.values()), tuple(e.nodes), tuple(outs), tuple(f"out{i}" for i in range(len(outs))))


def _state_arrays(g: Graph, state: dict, splits: dict) -> dict:
    out = {}
    for v in g.inputs:
        if v.name not in state:
            continue
        sel = splits.get(v.name)
        rest = ()
        if sel is not None:
            rest = tuple(i for i in range(v.shape[sel.dim]) if i not in set(sel.index))
        i = len(out)
        out[v.name] = StateArray(i, v.name, tuple(v.shape), v.dtype, "split" if sel else "sram", f"et_s{i}", sel, rest)
    return out


def _parts(arr: np.ndarray, st: StateArray) -> dict:
    if st.kind != "split":
        return {st.c_name: arr}
    return {st.sram: np.take(arr, list(st.sel.index), axis=st.sel.dim),
            st.flash: np.take(arr, list(st.rest), axis=st.sel.dim)}


def emit_source(g: Graph, state: dict, splits: dict) -> tuple[str, Layout]:
    ram = {v.name for v in g.inputs if v.name not in state}
    gl = plan_graph(g, ram)
    states = _state_arrays(g, state, splits)
    layout = Layout({"train": gl}, states, frozenset(ram), tuple(sorted(ram)), max(gl.size, 16))
    ctx = EmitContext(layout, "train")
    src = ['#include <stdint.h>', '#include <string.h>', '#include "et_int8.h"', '#include "et_int8_grad.h"',
           '#include "et_int8_update.h"',
           f"uint8_t et_arena[{layout.arena_bytes}] __attribute__((aligned(16)));", "int32_t et_step;"]
    for name, st in states.items():
        for cname, part in _parts(state[name], st).items():
            src.append(f"{C_TYPES[st.dtype]} {cname}[{max(part.size, 1)}];")
    src.append("void run(void) {")
    src += [kernel_for(n).fn(n, ctx) for n in g.nodes]
    src.append("}")
    return "\n".join(src) + "\n", layout


def build(source: str, extra_flags=()) -> ctypes.CDLL:
    key = hashlib.sha256((source + " ".join(CFLAGS + list(extra_flags))).encode()
                         + (RUNTIME / "et_int8.h").read_bytes()
                         + (RUNTIME / "et_int8_grad.h").read_bytes()
                         + (RUNTIME / "et_int8_update.h").read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"et_int8_test_{key}.so"
    if not out.exists():
        d = Path(tempfile.mkdtemp())
        (d / "m.c").write_text(source)
        subprocess.run([CC, *CFLAGS, *extra_flags, f"-I{RUNTIME}", str(d / "m.c"), "-o", str(out) + ".tmp"],
                       check=True, capture_output=True, text=True)
        Path(str(out) + ".tmp").rename(out)
    return ctypes.CDLL(str(out))


def _buf(lib, name: str, nbytes: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_uint8 * nbytes).in_dll(lib, name), dtype=np.uint8)


def run_c(g: Graph, feeds: dict, state: dict, splits: dict | None = None, steps: int = 1, step0: int = 0,
          per_step=None):
    """Run `g` `steps` times in C, the state updated in place; returns (outputs of the last
    step, the state afterwards as full arrays)."""
    splits = splits or {}
    source, layout = emit_source(g, state, splits)
    lib = build(source)
    gl = layout.graphs["train"]
    arena = _buf(lib, "et_arena", layout.arena_bytes)
    for name, st in layout.states.items():
        for cname, part in _parts(state[name], st).items():
            _buf(lib, cname, part.nbytes)[:] = np.ascontiguousarray(part).view(np.uint8).reshape(-1)
    outs = {}
    for k in range(steps):
        f = per_step(k) if per_step else feeds
        for v in g.inputs:
            if v.name in layout.ram_inputs and v.name != STEP_NAME:
                off = gl.offsets[gl.roots[v]]
                arena[off:off + v.type.nbytes] = np.ascontiguousarray(f[v.name]).view(np.uint8).reshape(-1)
        ctypes.c_int32.in_dll(lib, "et_step").value = step0 + k
        lib.run()
    for v, name in zip(g.outputs, g.output_names):
        off = gl.offsets.get(gl.roots[v])
        if off is not None:
            outs[name] = arena[off:off + v.type.nbytes].copy().view(v.dtype).reshape(v.shape)
    new_state = {}
    for name, st in layout.states.items():
        full = np.array(state[name])
        parts = {c: _buf(lib, c, p.nbytes).copy().view(p.dtype).reshape(p.shape)
                 for c, p in _parts(full, st).items()}
        if st.kind == "split":
            idx = [slice(None)] * full.ndim
            idx[st.sel.dim] = list(st.sel.index)
            full[tuple(idx)] = parts[st.sram]
            idx[st.sel.dim] = list(st.rest)
            full[tuple(idx)] = parts[st.flash]
        else:
            full = parts[st.c_name]
        new_state[name] = full
    return outs, new_state


def run_ref(g: Graph, feeds: dict, state: dict, steps: int = 1, step0: int = 0, per_step=None):
    st = {k: np.array(v) for k, v in state.items()}
    outs = None
    for k in range(steps):
        f = dict(per_step(k) if per_step else feeds)
        if any(v.name == STEP_NAME for v in g.inputs):
            f[STEP_NAME] = np.array(step0 + k, np.int32)
        res, _ = run_graph(g, {**f, **st}, ram_inputs=set(f))
        outs = res
    return outs, st


def assert_c_trains_as_reference(prog, one, steps) -> None:
    """An int8 program on C equals the reference bit for bit: predict and the gradients on `one`
    (x, y), then a training step on each of `steps` [(x, y), ...] (the float loss within 1e-6,
    every state tensor equal); every gradient is non-zero (the layers are exercised)."""
    from edgetrain.backends.c.host import to_c_program

    cprog = to_c_program(prog)
    x, y = one
    np.testing.assert_array_equal(cprog.predict(x), prog.predict(x))
    want, got = prog.gradients(x, y), cprog.gradients(x, y)
    for k in want:
        assert np.abs(want[k]).max() > 0, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    for i, (xs, ys) in enumerate(steps):
        lw, lg = prog.step(xs, ys), cprog.step(xs, ys)
        assert np.isclose(lg, lw, rtol=1e-6, atol=0), (i, lg, lw)  # the float loss kernel
        for k in prog.state:
            np.testing.assert_array_equal(cprog.state[k], prog.state[k], err_msg=f"step {i}: {k}")
