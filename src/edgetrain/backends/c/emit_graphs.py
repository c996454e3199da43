"""The parts of model.c that are per tensor and per graph: the state arrays' declarations, the
split (selected / rest) weights' gather and scatter, profiling, and each graph as one C
function of its nodes' kernels in order. emit.py assembles them with the API functions."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ...ir import Role
from .constpool import ConstPool
from .cvalues import fmt_values, split_parts
from .kernels import EmitContext, kernel_for
from .layout import C_TYPES, GRAPHS, Layout, StateArray


def _array(ctype: str, name: str, n: int, const: bool, init: Optional[np.ndarray]) -> str:
    n = max(n, 1)
    q = "const " if const else ""
    body = f" = {fmt_values(init)}" if init is not None and init.size else ""
    return f"static {q}{ctype} {name}[{n}] ET_ALIGNED(16){body};"


def state_decls(layout: Layout, state: dict, embed: bool, banked: frozenset = frozenset(),
                double: frozenset = frozenset()) -> list[str]:
    """The C arrays of the state tensors; those named in `banked` (weight banks: C names) and
    `double` (step_guard.double_buffer_decls: state names) are left out. Without embedded
    weights a frozen tensor is a pointer into the mapped weights file when the build sets
    ET_MAP_WEIGHTS (weights_file.MAPPED_DECLS), else an array."""
    from .weights_file import MAPPED_DECLS, mapped_state_decl

    out = [] if embed else MAPPED_DECLS.splitlines()
    for st in layout.states.values():
        t, full = st.ctype, state[st.name]
        init = full if embed and st.role is not Role.OPTIMIZER_STATE else None  # momentum starts at zero
        if st.kind == "split":
            sel, rest = split_parts(st, full)
            if st.sram not in banked:
                out.append(_array(t, st.sram, sel.size, False, sel if embed else None))
            out.append(_array(t, st.flash, rest.size, embed, rest if embed else None))
            out.append(f"static const uint16_t {st.sel_index}[{max(len(st.sel.index), 1)}] = "
                       f"{{{', '.join(map(str, st.sel.index)) or '0'}}};")
            out.append(f"static const uint16_t {st.rest_index}[{max(len(st.rest), 1)}] = "
                       f"{{{', '.join(map(str, st.rest)) or '0'}}};")
        else:
            if st.c_name in banked or st.name in double:
                continue
            const = st.kind == "flash" and embed
            out.append(mapped_state_decl(st) if st.kind == "flash" and not embed
                       else _array(t, st.c_name, st.numel, const, init))
    return out


def _split_geometry(st: StateArray):
    outer = int(np.prod(st.shape[:st.sel.dim], dtype=np.int64))
    inner = int(np.prod(st.shape[st.sel.dim + 1:], dtype=np.int64))
    return outer, st.shape[st.sel.dim], len(st.sel.index), len(st.rest), inner


def gather_call(st: StateArray, dst: str) -> str:
    outer, d, ks, kr, inner = _split_geometry(st)
    return (f"et_split_gather({dst}, {st.sram}, {st.flash}, {st.sel_index}, {st.rest_index}, "
            f"{outer}, {d}, {ks}, {kr}, {inner} * sizeof({st.ctype}))")


def scatter_call(st: StateArray, src: str) -> str:
    outer, d, ks, kr, inner = _split_geometry(st)
    return (f"et_split_scatter({src}, ({st.ctype} *){st.sram}, ({st.ctype} *){st.flash}, {st.sel_index}, "
            f"{st.rest_index}, {outer}, {d}, {ks}, {kr}, {inner} * sizeof({st.ctype}))")


PROFILE = """
/* -DET_PROFILE (host): seconds spent in each node of each graph, read by et_profile() */
#ifdef ET_PROFILE
#include <time.h>
static double et_prof[3][NMAX];
static struct timespec et_prof_t0;
#define ET_PROF_BEGIN() clock_gettime(CLOCK_MONOTONIC, &et_prof_t0)
#define ET_PROF_END(g, i) do { struct timespec t1; clock_gettime(CLOCK_MONOTONIC, &t1); \\
    et_prof[g][i] += (t1.tv_sec - et_prof_t0.tv_sec) + 1e-9 * (t1.tv_nsec - et_prof_t0.tv_nsec); } while (0)
const double *et_profile(int g) { return et_prof[g]; }
#else
#define ET_PROF_BEGIN() ((void)0)
#define ET_PROF_END(g, i) ((void)0)
#endif
"""

SPLIT_HELPERS = """
/* a tensor stored as its selected channels along one dim (sel, in index order) and the rest */
static void et_split_gather(void *dst, const void *sel, const void *rest, const uint16_t *si, const uint16_t *ri,
                            int outer, int d, int ks, int kr, size_t inner_bytes) {
    uint8_t *o = (uint8_t *)dst; const uint8_t *s = (const uint8_t *)sel, *r = (const uint8_t *)rest;
    for (int i = 0; i < outer; ++i) {
        for (int k = 0; k < ks; ++k)
            memcpy(o + ((size_t)i * d + si[k]) * inner_bytes, s + ((size_t)i * ks + k) * inner_bytes, inner_bytes);
        for (int k = 0; k < kr; ++k)
            memcpy(o + ((size_t)i * d + ri[k]) * inner_bytes, r + ((size_t)i * kr + k) * inner_bytes, inner_bytes);
    }
}
#ifndef ET_NO_STATE_IO
static void et_split_scatter(const void *src, void *sel, void *rest, const uint16_t *si, const uint16_t *ri,
                             int outer, int d, int ks, int kr, size_t inner_bytes) {
    const uint8_t *o = (const uint8_t *)src; uint8_t *s = (uint8_t *)sel, *r = (uint8_t *)rest;
    for (int i = 0; i < outer; ++i) {
        for (int k = 0; k < ks; ++k)
            memcpy(s + ((size_t)i * ks + k) * inner_bytes, o + ((size_t)i * d + si[k]) * inner_bytes, inner_bytes);
        for (int k = 0; k < kr; ++k)
            memcpy(r + ((size_t)i * kr + k) * inner_bytes, o + ((size_t)i * d + ri[k]) * inner_bytes, inner_bytes);
    }
}
#endif
"""


# --- the graphs as functions -------------------------------------------------------------------
def _gathered_inputs(layout: Layout, key: str, n, gather_bufs: list) -> tuple[list, dict]:
    """For a kernel that reads whole tensors: each split weight input gathered into a scratch
    buffer (et_gather<slot>, sized in `gather_bufs`): (the gather calls, {value: C pointer})."""
    ctx = EmitContext(layout, key)
    pre, overrides, slot = [], {}, 0
    for v in n.inputs:
        st = ctx.state_of(v)
        if st is not None and st.kind == "split" and v not in overrides:
            buf = f"et_gather{slot}"
            if slot >= len(gather_bufs):
                gather_bufs.append(0)
            gather_bufs[slot] = max(gather_bufs[slot], st.numel * np.dtype(st.dtype).itemsize)
            pre.append(gather_call(st, buf) + ";")
            overrides[v] = f"(({C_TYPES[v.dtype]} *){buf})"
            slot += 1
    return pre, overrides


def _node_block(key: str, i: int, comment: str, pre: list, code: str, abort_points: bool) -> list[str]:
    """One node's statements: its comment, the profiling brackets, the bank abort point."""
    lines = [f"  /* {i}: {comment} */", "  ET_PROF_BEGIN();"]
    lines.extend("  " + p for p in pre)
    lines.append("  " + code.replace("\n", "\n  "))
    lines.append(f"  ET_PROF_END({GRAPHS.index(key)}, {i});")
    if abort_points:
        lines.append(f"  ET_BANK_ABORT_POINT({i});")
    return lines


#: nodes per C function of a graph: one function per graph of a thousand nodes made gcc's register
#: allocation and scheduling superlinear (a minute for one model.c); a node's code is a kernel call
#: or a short loop, so a call per CHUNK_NODES nodes costs nothing measurable
CHUNK_NODES = 64


def graph_function(layout: Layout, key: str, gather_bufs: list, abort_points: bool = False,
                   pool: Optional[ConstPool] = None, hooks=None) -> str:
    """static void et_run_<key>(void): the graph's nodes in order, each its kernel's code; a
    graph of more than CHUNK_NODES nodes as that many per function (ET_NOINLINE: kept apart),
    called in order by et_run_<key>. With bank abort points (a test hook that returns from the
    graph's function) one function. With a `pool`, the kernels' constant tables go into it
    (constpool.py: one copy of each, declared at file scope by the caller). `hooks(node)`: the
    statements before and after a node (step_guard.node_hooks: the checked step's backup)."""
    gl = layout.graphs[key]
    blocks = []
    for i, n in enumerate(gl.graph.nodes):
        k = kernel_for(n)
        pre, overrides = ([], {}) if k.split_aware else _gathered_inputs(layout, key, n, gather_bufs)
        code = k.fn(n, EmitContext(layout, key, overrides))
        if pool is not None:
            code = pool.hoist(code)
        if not code and not pre:
            continue
        outs = ", ".join(f"{v.type}" for v in n.outputs)
        before, after = hooks(n) if hooks else ([], [])
        code = "\n".join([code, *after]) if after else code
        blocks.append(_node_block(key, i, f"{n.op} -> {outs}", [*before, *pre], code, abort_points))
    if abort_points or len(blocks) <= CHUNK_NODES:
        return "\n".join([f"static void et_run_{key}(void) {{", *(ln for b in blocks for ln in b), "}"])
    out, calls = [], []
    for j in range(0, len(blocks), CHUNK_NODES):
        name = f"et_run_{key}_{j // CHUNK_NODES}"
        out += [f"static ET_NOINLINE ET_GRAPH_ATTR void {name}(void) {{",
                *(ln for b in blocks[j:j + CHUNK_NODES] for ln in b), "}"]
        calls.append(f"  {name}();")
    return "\n".join(out + [f"static void et_run_{key}(void) {{", *calls, "}"])


def value_ptr(layout: Layout, key: str, v) -> str:
    return EmitContext(layout, key).ptr(v)
