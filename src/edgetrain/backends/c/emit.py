"""Writes a compiled program as C: model.h (the API) and model.c (arena, state arrays, the
three graphs as functions, the API) with the runtime headers; project.py adds the samples,
the host driver, a Makefile and a README; banks.py the two weight banks."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ...passes.loss import LABEL
from .fusion import fuse_bn_backward
from .kernels import EmitContext, kernel_for
from .kernels.float32 import emit_bn_backward
from .banks import BANK_API, BANK_FUNCS, bank_arrays, bank_decls, bank_fresh_start
from .cvalues import fmt_values, split_parts
from .layout import C_TYPES, GRAPHS, CBackendError, Layout, StateArray, build_layout

RUNTIME_DIR = Path(__file__).parent / "runtime"
#: runtime headers every program includes (et_int8.h when present: B's int8 kernels; et_float_nn.h:
#: activations, softmax, layer norm, pooling, embedding)
RUNTIME_HEADERS = ("et_common.h", "et_float.h", "et_float_nn.h", "et_float_bn.h", "et_int8.h", "et_float_shape.h")
#: the storage API of page_in / page_out, included by programs that page
PAGE_HEADER = "et_page.h"


def _array(ctype: str, name: str, n: int, const: bool, init: Optional[np.ndarray]) -> str:
    n = max(n, 1)
    q = "const " if const else ""
    body = f" = {fmt_values(init)}" if init is not None and init.size else ""
    return f"static {q}{ctype} {name}[{n}] ET_ALIGNED(16){body};"


def _state_decls(layout: Layout, state: dict, embed: bool, banked: frozenset = frozenset()) -> list[str]:
    """The C arrays of the state tensors; those named in `banked` (weight banks) are left out."""
    out = []
    for st in layout.states.values():
        t, full = st.ctype, state[st.name]
        is_momentum = st.name.startswith("momentum:")
        init = full if embed and not is_momentum else None
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
            if st.c_name in banked:
                continue
            const = st.kind == "flash" and embed
            out.append(_array(t, st.c_name, st.numel, const, init))
    return out


def _split_geometry(st: StateArray):
    outer = int(np.prod(st.shape[:st.sel.dim], dtype=np.int64))
    inner = int(np.prod(st.shape[st.sel.dim + 1:], dtype=np.int64))
    return outer, st.shape[st.sel.dim], len(st.sel.index), len(st.rest), inner


def _gather_call(st: StateArray, dst: str) -> str:
    outer, d, ks, kr, inner = _split_geometry(st)
    return (f"et_split_gather({dst}, {st.sram}, {st.flash}, {st.sel_index}, {st.rest_index}, "
            f"{outer}, {d}, {ks}, {kr}, {inner} * sizeof({st.ctype}))")


def _scatter_call(st: StateArray, src: str) -> str:
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
            pre.append(_gather_call(st, buf) + ";")
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


def _graph_function(layout: Layout, key: str, gather_bufs: list, abort_points: bool = False) -> str:
    """static void et_run_<key>(void): the graph's nodes in order, each its kernel's code."""
    gl = layout.graphs[key]
    lines = [f"static void et_run_{key}(void) {{"]
    fused = fuse_bn_backward(layout, key)
    skip = {j for grp in fused.values() for j in grp.members}
    for i, n in enumerate(gl.graph.nodes):
        if i in fused:
            grp = fused[i]
            ops = "+".join(gl.graph.nodes[j].op for j in grp.members)
            code = emit_bn_backward(grp, EmitContext(layout, key))
            lines += _node_block(key, i, f"fused {ops} (nodes {list(grp.members)})", [], code, abort_points)
            continue
        if i in skip:
            continue
        k = kernel_for(n)
        pre, overrides = ([], {}) if k.split_aware else _gathered_inputs(layout, key, n, gather_bufs)
        code = k.fn(n, EmitContext(layout, key, overrides))
        if not code and not pre:
            continue
        outs = ", ".join(f"{v.type}" for v in n.outputs)
        lines += _node_block(key, i, f"{n.op} -> {outs}", pre, code, abort_points)
    lines.append("}")
    return "\n".join(lines)


def _value_ptr(layout: Layout, key: str, v) -> str:
    return EmitContext(layout, key).ptr(v)


# --- what the sections share ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Unit:
    """The facts about one emitted program that more than one section reads."""
    prog: object
    layout: Layout
    embed: bool
    keys: tuple  # the emitted graphs, of GRAPHS
    data: list  # the train graph's data inputs
    label: object
    out_v: object  # the forward graph's output
    grad: Optional[object]  # the gradient graph, when emitted
    banked: list  # banks.bank_arrays: the arrays held twice (weight_banks=2), else []
    headers: list  # the runtime headers model.c includes

    @property
    def banks(self) -> bool:
        return bool(self.banked)

    @property
    def paging(self) -> bool:
        return self.layout.page_bytes > 0

    @property
    def states(self) -> list:
        return list(self.layout.states.values())

    @property
    def arena_words(self) -> int:
        return self.layout.arena_bytes // 4

    def copy_in(self, key: str, vals, src: str) -> list[str]:
        """memcpy of `vals` (in order, packed) from the caller's buffer `src` into graph `key`'s inputs."""
        out, off = [], 0
        for v in vals:
            gv = self.layout.graphs[key].graph.input(v.name)
            dst = _value_ptr(self.layout, key, gv)
            out.append(f"  memcpy({dst}, (const uint8_t *){src} + {off}, {v.type.nbytes});")
            off += v.type.nbytes
        return out


def _unit(prog, layout: Layout, embed: bool, weight_banks: int) -> _Unit:
    keys = tuple(layout.graphs)
    train = layout.graphs["train"].graph
    banked = bank_arrays(layout, prog.state, embed) if weight_banks == 2 else []
    if weight_banks == 2 and not banked:
        raise CBackendError("weight_banks=2: this program trains no state tensor")
    headers = [h for h in RUNTIME_HEADERS if (RUNTIME_DIR / h).exists()]
    if banked:
        headers.append("et_bank.h")
    if layout.page_bytes > 0:
        headers.append(PAGE_HEADER)
    return _Unit(prog=prog, layout=layout, embed=embed, keys=keys,
                 data=[train.input(n) for n in layout.data_inputs], label=train.input(LABEL),
                 out_v=prog.forward_graph.output("output"),
                 grad=layout.graphs["grad"].graph if "grad" in keys else None, banked=banked, headers=headers)


# --- model.h ----------------------------------------------------------------------------------
def _model_h(u: _Unit) -> list[str]:
    """The API: sizes as macros, the entry points (banks' and paging's when used)."""
    out_v, data = u.out_v, u.data
    return [
        "/* generated by edgetrain (C backend): the API of one compiled training program */",
        "#ifndef ET_MODEL_H", "#define ET_MODEL_H", "#include <stdint.h>",
        f"#define ET_INPUT_BYTES {sum(v.type.nbytes for v in data)}",
        f"#define ET_LABEL_BYTES {u.label.type.nbytes}",
        f"#define ET_OUTPUT_FLOATS {out_v.type.numel}",
        f"#define ET_NUM_CLASSES {out_v.shape[-1] if out_v.shape else 1}",
        f"#define ET_BATCH {data[0].shape[0] if data and data[0].shape else 1}",
        f"#define ET_ARENA_BYTES {u.layout.arena_bytes}",
        f"#define ET_NUM_STATE {len(u.layout.states)}",
        f"#define ET_NUM_GRADS {len(u.grad.outputs) if u.grad is not None else 0}",
        f"#define ET_HAS_PREDICT {int('forward' in u.keys)}",
        f"#define ET_HAS_GRADIENTS {int('grad' in u.keys)}",
        "#ifdef __cplusplus", 'extern "C" {', "#endif",
        "void et_init(void);",
        "float et_train_step(const void *input, const void *label);",
        "void et_predict(const void *input, float *out);",
        "int et_check_guards(void);",
        "void et_set_step(int32_t step);",
        "int32_t et_get_step(void);",
        *(BANK_API.splitlines() if u.banks else []),
        *(PAGE_API.format(nbytes=u.layout.page_bytes).splitlines() if u.paging else []),
        "#ifndef ET_NO_STATE_IO",
        "int et_num_state(void);",
        "const char *et_state_name(int i);",
        "long et_state_bytes(int i);",
        "int et_get_state(int i, void *dst);",
        "int et_set_state(int i, const void *src);",
        "void *et_state_ptr(int i); /* the array of an unsplit state tensor (host builds), else 0 */",
        "int et_num_grads(void);",
        "const char *et_grad_name(int i);",
        "long et_grad_bytes(int i);",
        "void et_gradients(const void *input, const void *label, void *const *out);",
        "int et_train_step_checked(const void *input, const void *label, float *loss);",
        "#endif",
        "#ifdef __cplusplus", "}", "#endif", "#endif", "",
    ]


# --- model.c: declarations --------------------------------------------------------------------
def _includes(u: _Unit) -> list[str]:
    return ["/* generated by edgetrain (C backend) */", '#include "model.h"'] + [f'#include "{h}"' for h in u.headers]


def _arena_and_state(u: _Unit) -> list[str]:
    """The arena (between guard words), the step counter, the state arrays (banked ones in the banks)."""
    c = [
        "",
        "/* the arena with ET_GUARD_WORDS guard words before and after it */",
        f"static uint32_t et_arena_mem[2 * ET_GUARD_WORDS + {u.arena_words}] ET_ALIGNED(64);",
        "#define et_arena ((uint8_t *)(et_arena_mem + ET_GUARD_WORDS))",
        "static int32_t et_step;",
        "",
        "/* state tensors: trainable (SRAM), frozen (const: flash), split (selected channels in SRAM, the rest",
        "   in flash) */",
    ]
    c += _state_decls(u.layout, u.prog.state, u.embed, frozenset(a[0] for a in u.banked))
    if u.banks:
        c += bank_decls(u.banked)
    return c


def _helpers(u: _Unit, gather_bufs: list) -> list[str]:
    """Split-tensor gather / scatter, the profiling macros, the gather buffers the graphs use."""
    c = [SPLIT_HELPERS]
    nmax = max(len(gl.graph.nodes) for gl in u.layout.graphs.values()) or 1
    c.append(PROFILE.replace("NMAX", str(nmax)))
    for i, nbytes in enumerate(gather_bufs):
        c.append(f"static uint8_t et_gather{i}[{nbytes}] ET_ALIGNED(16); /* a split weight gathered whole */")
    return c


# --- model.c: the entry points -----------------------------------------------------------------
def _init(u: _Unit) -> list[str]:
    """et_init: guard words set, state fresh (or, with banks, resumed from the committed bank)."""
    c = [BANK_FUNCS] if u.banks else []
    c += ["",
          "void et_init(void) {",
          "  for (int i = 0; i < ET_GUARD_WORDS; ++i) {",
          "    et_arena_mem[i] = ET_GUARD_VALUE;",
          f"    et_arena_mem[ET_GUARD_WORDS + {u.arena_words} + i] = ET_GUARD_VALUE;",
          "  }",
          ]
    if u.banks:
        c += ["  if (et_bank_boot() >= 0) return; /* resume from the committed bank */"] + bank_fresh_start(u.banked)
    for st in u.states:
        if st.name.startswith("momentum:"):
            c.append(f"  memset({st.c_name}, 0, sizeof {st.c_name});")
    if u.banks:
        c += ["  et_step = 0;", "  et_bank_commit(0, 0);", "}", ""]
    else:
        c += ["  et_step = 0;", "}", ""]
    return c


def _guard_check(u: _Unit) -> list[str]:
    """et_check_guards (the arena's guard words intact?) and the step counter's accessors."""
    return ["int et_check_guards(void) {",
            "  int bad = 0;",
            "  for (int i = 0; i < ET_GUARD_WORDS; ++i) {",
            "    bad |= et_arena_mem[i] != ET_GUARD_VALUE;",
            f"    bad |= et_arena_mem[ET_GUARD_WORDS + {u.arena_words} + i] != ET_GUARD_VALUE;",
            "  }",
            "  return bad;",
            "}", "",
            "void et_set_step(int32_t step) { et_step = step; }",
            "int32_t et_get_step(void) { return et_step; }", ""]


def _train_step(u: _Unit) -> list[str]:
    """et_train_step: inputs in, the train graph run, the loss out; with banks the step runs on a
    copy of the committed bank and commits it when the loss is finite."""
    c = ["float et_train_step(const void *input, const void *label) {"]
    c += u.copy_in("train", u.data, "input")
    c += u.copy_in("train", [u.label], "label")
    loss_ptr = _value_ptr(u.layout, "train", u.layout.graphs["train"].graph.output("loss"))
    if not u.banks:
        return c + ["  et_run_train();", f"  float loss = *{loss_ptr};", "  et_step += 1;", "  return loss;", "}", ""]
    return c + ["  const int w = 1 - et_bank_active;",
                "  et_bank_meta[w].step = -1; /* bank w is about to change: no longer a valid fallback */",
                "  memcpy(et_banks[w], et_banks[et_bank_active], sizeof(et_bank_t));",
                "  et_bank_cur = et_banks[w]; /* the step updates the copy */",
                "  et_run_train();",
                "#ifdef ET_BANK_TEST_HOOKS",
                "  if (et_test_aborted) { union { uint32_t u; float f; } nan = {0x7fc00000u}; return nan.f; }",
                "#endif",
                f"  float loss = *{loss_ptr};",
                "  union { float f; uint32_t u; } l = {loss};",
                "  if ((l.u & 0x7f800000u) != 0x7f800000u) {",
                "    et_step += 1;",
                "    et_bank_commit(w, et_step); /* the step is complete: commit it */",
                "  } else {",
                "    et_bank_cur = et_banks[et_bank_active]; /* non-finite loss: the committed bank stays */",
                "  }",
                "  return loss;", "}", ""]


def _predict(u: _Unit) -> list[str]:
    if "forward" not in u.keys:
        return []
    fwd = u.prog.forward_graph
    c = ["void et_predict(const void *input, float *out) {"]
    c += u.copy_in("forward", [fwd.input(v.name) for v in u.data], "input")
    return c + ["  et_run_forward();",
                f"  memcpy(out, {_value_ptr(u.layout, 'forward', u.out_v)}, {u.out_v.type.nbytes});", "}"]


def _state_io(u: _Unit) -> list[str]:
    """The state tensors by index: names, sizes, get / set (split ones gathered / scattered;
    embedded flash ones read-only), a pointer to the unsplit ones."""
    sts = u.states
    c = ["static const char *const et_state_names[] = {" +
         ", ".join(_c_str(st.name) for st in sts) + (", " if sts else "") + "0};",
         "static const long et_state_nbytes[] = {" +
         ", ".join(str(st.numel * np.dtype(st.dtype).itemsize) for st in sts) + (", " if sts else "") + "0};"]
    c += ["int et_num_state(void) { return ET_NUM_STATE; }",
          "const char *et_state_name(int i) { return i >= 0 && i < ET_NUM_STATE ? et_state_names[i] : 0; }",
          "long et_state_bytes(int i) { return i >= 0 && i < ET_NUM_STATE ? et_state_nbytes[i] : -1; }",
          "int et_get_state(int i, void *dst) {", "  switch (i) {"]
    for st in sts:
        if st.kind == "split":
            c.append(f"  case {st.index}: {_gather_call(st, 'dst')}; return 0;")
        else:
            c.append(f"  case {st.index}: memcpy(dst, {st.c_name}, sizeof {st.c_name}); return 0;")
    c += ["  }", "  return -1;", "}", "void *et_state_ptr(int i) {", "  switch (i) {"]
    for st in sts:
        if st.kind != "split":
            c.append(f"  case {st.index}: return (void *){st.c_name};")
    c += ["  }", "  return 0;", "}", "int et_set_state(int i, const void *src) {", "  switch (i) {"]
    for st in sts:
        if u.embed and st.kind in ("flash", "split"):
            if st.kind == "flash":
                c.append(f"  case {st.index}: return -2; /* read-only (flash) */")
            else:  # only the selected part is writable
                c.append(f"  case {st.index}: return -2;")
        elif st.kind == "split":
            c.append(f"  case {st.index}: {_scatter_call(st, 'src')}; return 0;")
        else:
            c.append(f"  case {st.index}: memcpy({st.c_name}, src, sizeof {st.c_name}); return 0;")
    return c + ["  }", "  return -1;", "}"]


def _checked_step(u: _Unit) -> list[str]:
    """et_train_step_checked: a step that keeps the trainable state when the loss or a weight
    turns non-finite (a backup copy; with banks the previous bank, which is intact)."""
    sts, banks = u.states, u.banks
    guarded = [(st.sram, st.ctype) for st in sts if st.kind in ("sram", "split")]
    c = []
    if guarded and not banks:
        fields = " ".join(f"{t} a{k}[sizeof {n} / sizeof({t})];" for k, (n, t) in enumerate(guarded))
        c.append("static struct { " + fields + " } et_backup;")
    c += ["/* 0: done; -1: non-finite loss; k > 0: state tensor k-1 became non-finite (weights restored) */",
          "int et_train_step_checked(const void *input, const void *label, float *loss) {"]
    if banks:
        c.append("  const int prev = et_bank_active;")
    else:
        c += [f"  memcpy(et_backup.a{k}, {n}, sizeof {n});" for k, (n, t) in enumerate(guarded)]
    c += ["  const int32_t step = et_step;", "  *loss = et_train_step(input, label);", "  int bad = 0;",
          "  { union { float f; uint32_t u; } l = {*loss}; if ((l.u & 0x7f800000u) == 0x7f800000u) bad = -1; }"]
    for k, (n, t) in enumerate(guarded):
        st = next(s for s in sts if s.sram == n)
        if t == "float":
            c += ["  if (!bad) { uint32_t acc = 0; const uint32_t *u = (const uint32_t *)" + n + ";",
                  f"    for (size_t i = 0; i < sizeof {n} / 4; ++i) acc |= ((u[i] & 0x7f800000u) == 0x7f800000u);",
                  f"    if (acc) bad = {st.index + 1}; }}"]
    c.append("  if (bad) {")
    if banks:  # a non-finite weight was committed: the previous bank (intact) becomes the committed one again
        c += ["    if (et_bank_active != prev) {",
              "      et_bank_header = ET_BANK_MAGIC | (uint32_t)prev;",
              "      et_bank_active = prev;",
              "      et_bank_cur = et_banks[prev];",
              "    }"]
    else:
        c += [f"    memcpy(({t} *){n}, et_backup.a{k}, sizeof {n});" for k, (n, t) in enumerate(guarded)]
    return c + ["    et_step = step;", "  }", "  return bad;", "}"]


def _gradients(u: _Unit) -> list[str]:
    """et_gradients and the gradient tensors' names and sizes (when the grad graph is emitted)."""
    grad = u.grad
    if grad is None:
        return []
    c = ["static const char *const et_grad_names[] = {" + ", ".join(map(_c_str, grad.output_names)) + ", 0};",
         "static const long et_grad_nbytes[] = {" + ", ".join(str(v.type.nbytes) for v in grad.outputs) + ", 0};",
         "int et_num_grads(void) { return ET_NUM_GRADS; }",
         "const char *et_grad_name(int i) { return i >= 0 && i < ET_NUM_GRADS ? et_grad_names[i] : 0; }",
         "long et_grad_bytes(int i) { return i >= 0 && i < ET_NUM_GRADS ? et_grad_nbytes[i] : -1; }",
         "void et_gradients(const void *input, const void *label, void *const *out) {"]
    c += u.copy_in("grad", [grad.input(v.name) for v in u.data], "input")
    if any(v.name == LABEL for v in grad.inputs):
        c += u.copy_in("grad", [grad.input(LABEL)], "label")
    c.append("  et_run_grad();")
    for i, v in enumerate(grad.outputs):
        c.append(f"  memcpy(out[{i}], {_value_ptr(u.layout, 'grad', v)}, {v.type.nbytes});")
    return c + ["}"]


# --- the whole ----------------------------------------------------------------------------------
def emit_sources(prog, embed_weights: bool = False, layout: Optional[Layout] = None,
                 graphs: tuple = GRAPHS, weight_banks: int = 1) -> dict[str, str]:
    """The emitted files as {file name: text} (model.c, model.h and the runtime headers).
    `graphs`: which of "train" (et_train_step), "forward" (et_predict) and "grad"
    (et_gradients) to emit; the arena is sized for those only (a microcontroller build may
    emit ("train",): its arena is the training step's plan). `weight_banks=2`: the trained
    state twice, a step committing its updates by one header write (runtime/et_bank.h; costs
    the trained state's bytes once more in SRAM); 1: one copy updated in place.

    model.c, section by section: includes; arena and state arrays (banks.py's banks); helpers
    (split gather / scatter, profiling, gather buffers); one function per graph; et_init;
    the guard check; et_train_step; et_predict; then, unless ET_NO_STATE_IO, state I/O, the
    checked step and et_gradients."""
    if weight_banks not in (1, 2):
        raise CBackendError(f"weight_banks={weight_banks!r}: 1 (updates in place) or 2 (two banks)")
    u = _unit(prog, layout or build_layout(prog, graphs), embed_weights, weight_banks)
    gather_bufs: list = []  # filled by the graph functions, declared before them
    funcs = [_graph_function(u.layout, k, gather_bufs, u.banks and k == "train") for k in u.keys]
    c = _includes(u) + _arena_and_state(u) + _helpers(u, gather_bufs) + funcs
    c += _init(u) + _guard_check(u) + _train_step(u) + _predict(u)
    c += ["", "#ifndef ET_NO_STATE_IO"] + _state_io(u) + _checked_step(u) + _gradients(u)
    c += ["#endif /* ET_NO_STATE_IO */", ""]
    files = {"model.h": "\n".join(_model_h(u)), "model.c": "\n".join(c)}
    for hh in u.headers:
        files[hh] = (RUNTIME_DIR / hh).read_text()
    return files


PAGE_API = """#define ET_PAGE_BYTES {nbytes}
/* secondary storage of paged tensors (et_page.h): a file of ET_PAGE_BYTES bytes, opened before training */
int et_page_open(const char *path);
void et_page_close(void);
long long et_paged_in_bytes(void);
long long et_paged_out_bytes(void);
int et_page_error(void);"""


def _c_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
