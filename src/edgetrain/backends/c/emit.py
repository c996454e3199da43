"""Writes a compiled program as C: model.h (the API) and model.c (arena, state arrays, the
three graphs as functions, the API) with the runtime headers; project.py adds the samples,
the host driver, a Makefile and a README; banks.py the two weight banks."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ...passes.loss import LABEL
from .fusion import find_bn_backward
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


def _graph_function(layout: Layout, key: str, gather_bufs: list, abort_points: bool = False) -> str:
    gl = layout.graphs[key]
    lines = [f"static void et_run_{key}(void) {{"]
    base = EmitContext(layout, key)
    fused, skip = {}, set()
    for grp in find_bn_backward(gl):
        nodes = [gl.graph.nodes[i] for i in grp.members]
        if any(base.state_of(v) is not None and base.state_of(v).kind == "split" for m in nodes for v in m.inputs):
            continue
        if grp.grad_weight is not None and grp.grad_weight.attrs["eps"] != grp.grad_input.attrs["eps"]:
            continue
        fused[grp.first] = grp
        skip.update(grp.members)
    for i, n in enumerate(gl.graph.nodes):
        if i in fused:
            grp = fused[i]
            ops = "+".join(gl.graph.nodes[j].op for j in grp.members)
            lines += [f"  /* {i}: fused {ops} (nodes {list(grp.members)}) */", "  ET_PROF_BEGIN();",
                      "  " + emit_bn_backward(grp, base).replace("\n", "\n  "),
                      f"  ET_PROF_END({GRAPHS.index(key)}, {i});"]
            if abort_points:
                lines.append(f"  ET_BANK_ABORT_POINT({i});")
            continue
        if i in skip:
            continue
        k = kernel_for(n)
        overrides = {}
        ctx = EmitContext(layout, key)
        pre = []
        if not k.split_aware:
            slot = 0
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
            ctx = EmitContext(layout, key, overrides)
        code = k.fn(n, ctx)
        if not code and not pre:
            continue
        outs = ", ".join(f"{v.type}" for v in n.outputs)
        lines.append(f"  /* {i}: {n.op} -> {outs} */")
        lines.append(f"  ET_PROF_BEGIN();")
        lines.extend("  " + p for p in pre)
        lines.append("  " + code.replace("\n", "\n  "))
        lines.append(f"  ET_PROF_END({GRAPHS.index(key)}, {i});")
        if abort_points:
            lines.append(f"  ET_BANK_ABORT_POINT({i});")
    lines.append("}")
    return "\n".join(lines)


def _value_ptr(layout: Layout, key: str, v) -> str:
    return EmitContext(layout, key).ptr(v)


def emit_sources(prog, embed_weights: bool = False, layout: Optional[Layout] = None,
                 graphs: tuple = GRAPHS, weight_banks: int = 1) -> dict[str, str]:
    """The emitted files as {file name: text} (model.c, model.h and the runtime headers).
    `graphs`: which of "train" (et_train_step), "forward" (et_predict) and "grad"
    (et_gradients) to emit; the arena is sized for those only (a microcontroller build may
    emit ("train",): its arena is the training step's plan). `weight_banks=2`: the trained
    state twice, a step committing its updates by one header write (runtime/et_bank.h; costs
    the trained state's bytes once more in SRAM); 1: one copy updated in place."""
    if weight_banks not in (1, 2):
        raise CBackendError(f"weight_banks={weight_banks!r}: 1 (updates in place) or 2 (two banks)")
    layout = layout or build_layout(prog, graphs)
    keys = tuple(layout.graphs)
    fwd = prog.forward_graph
    train = layout.graphs["train"].graph
    grad = layout.graphs["grad"].graph if "grad" in keys else None
    data = [train.input(n) for n in layout.data_inputs]
    label = train.input(LABEL)
    out_v = fwd.output("output")
    input_bytes = sum(v.type.nbytes for v in data)
    classes = out_v.shape[-1] if out_v.shape else 1
    batch = data[0].shape[0] if data and data[0].shape else 1

    banks = weight_banks == 2
    banked = bank_arrays(layout, prog.state, embed_weights) if banks else []
    if banks and not banked:
        raise CBackendError("weight_banks=2: this program trains no state tensor")
    gather_bufs: list = []
    funcs = [_graph_function(layout, k, gather_bufs, banks and k == "train") for k in keys]
    headers = [h for h in RUNTIME_HEADERS if (RUNTIME_DIR / h).exists()]
    if banks:
        headers.append("et_bank.h")
    paging = layout.page_bytes > 0
    if paging:
        headers.append(PAGE_HEADER)

    h = [
        "/* generated by edgetrain (C backend): the API of one compiled training program */",
        "#ifndef ET_MODEL_H", "#define ET_MODEL_H", "#include <stdint.h>",
        f"#define ET_INPUT_BYTES {input_bytes}",
        f"#define ET_LABEL_BYTES {label.type.nbytes}",
        f"#define ET_OUTPUT_FLOATS {out_v.type.numel}",
        f"#define ET_NUM_CLASSES {classes}",
        f"#define ET_BATCH {batch}",
        f"#define ET_ARENA_BYTES {layout.arena_bytes}",
        f"#define ET_NUM_STATE {len(layout.states)}",
        f"#define ET_NUM_GRADS {len(grad.outputs) if grad is not None else 0}",
        f"#define ET_HAS_PREDICT {int('forward' in keys)}",
        f"#define ET_HAS_GRADIENTS {int('grad' in keys)}",
        "#ifdef __cplusplus", 'extern "C" {', "#endif",
        "void et_init(void);",
        "float et_train_step(const void *input, const void *label);",
        "void et_predict(const void *input, float *out);",
        "int et_check_guards(void);",
        "void et_set_step(int32_t step);",
        "int32_t et_get_step(void);",
        *(BANK_API.splitlines() if banks else []),
        *(PAGE_API.format(nbytes=layout.page_bytes).splitlines() if paging else []),
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

    c = ["/* generated by edgetrain (C backend) */", '#include "model.h"']
    c += [f'#include "{hh}"' for hh in headers]
    c += [
        "",
        "/* the arena with ET_GUARD_WORDS guard words before and after it */",
        f"static uint32_t et_arena_mem[2 * ET_GUARD_WORDS + {layout.arena_bytes // 4}] ET_ALIGNED(64);",
        "#define et_arena ((uint8_t *)(et_arena_mem + ET_GUARD_WORDS))",
        "static int32_t et_step;",
        "",
        "/* state tensors: trainable (SRAM), frozen (const: flash), split (selected channels in SRAM, the rest",
        "   in flash) */",
    ]
    c += _state_decls(layout, prog.state, embed_weights, frozenset(a[0] for a in banked))
    if banks:
        c += bank_decls(banked)
    c.append(SPLIT_HELPERS)
    nmax = max(len(gl.graph.nodes) for gl in layout.graphs.values()) or 1
    c.append(PROFILE.replace("NMAX", str(nmax)))
    for i, nbytes in enumerate(gather_bufs):
        c.append(f"static uint8_t et_gather{i}[{nbytes}] ET_ALIGNED(16); /* a split weight gathered whole */")
    c += funcs

    def copy_in(key, vals, src):
        out, off = [], 0
        for v in vals:
            gv = layout.graphs[key].graph.input(v.name)
            out.append(f"  memcpy({_value_ptr(layout, key, gv)}, (const uint8_t *){src} + {off}, {v.type.nbytes});")
            off += v.type.nbytes
        return out

    loss_ptr = _value_ptr(layout, "train", train.output("loss"))
    if banks:
        c.append(BANK_FUNCS)
    c += ["",
          "void et_init(void) {",
          "  for (int i = 0; i < ET_GUARD_WORDS; ++i) {",
          "    et_arena_mem[i] = ET_GUARD_VALUE;",
          f"    et_arena_mem[ET_GUARD_WORDS + {layout.arena_bytes // 4} + i] = ET_GUARD_VALUE;",
          "  }",
          ]
    if banks:
        c += ["  if (et_bank_boot() >= 0) return; /* resume from the committed bank */"] + bank_fresh_start(banked)
    for st in layout.states.values():
        if st.name.startswith("momentum:"):
            c.append(f"  memset({st.c_name}, 0, sizeof {st.c_name});")
    if banks:
        c += ["  et_step = 0;", "  et_bank_commit(0, 0);", "}", ""]
    else:
        c += ["  et_step = 0;", "}", ""]
    c += [
          "int et_check_guards(void) {",
          "  int bad = 0;",
          "  for (int i = 0; i < ET_GUARD_WORDS; ++i) {",
          "    bad |= et_arena_mem[i] != ET_GUARD_VALUE;",
          f"    bad |= et_arena_mem[ET_GUARD_WORDS + {layout.arena_bytes // 4} + i] != ET_GUARD_VALUE;",
          "  }",
          "  return bad;",
          "}", "",
          "void et_set_step(int32_t step) { et_step = step; }",
          "int32_t et_get_step(void) { return et_step; }", "",
          "float et_train_step(const void *input, const void *label) {"]
    c += copy_in("train", data, "input")
    c += copy_in("train", [label], "label")
    if banks:
        c += ["  const int w = 1 - et_bank_active;",
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
    else:
        c += ["  et_run_train();", f"  float loss = *{loss_ptr};", "  et_step += 1;", "  return loss;", "}", "",
              ]
    if "forward" in keys:
        c.append("void et_predict(const void *input, float *out) {")
        c += copy_in("forward", [fwd.input(v.name) for v in data], "input")
        c += ["  et_run_forward();", f"  memcpy(out, {_value_ptr(layout, 'forward', out_v)}, {out_v.type.nbytes});",
              "}"]
    c += ["", "#ifndef ET_NO_STATE_IO"]
    sts = list(layout.states.values())
    c.append("static const char *const et_state_names[] = {" +
             ", ".join(_c_str(st.name) for st in sts) + (", " if sts else "") + "0};")
    c.append("static const long et_state_nbytes[] = {" +
             ", ".join(str(st.numel * np.dtype(st.dtype).itemsize) for st in sts) + (", " if sts else "") + "0};")
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
        if embed_weights and st.kind in ("flash", "split"):
            if st.kind == "flash":
                c.append(f"  case {st.index}: return -2; /* read-only (flash) */")
            else:  # only the selected part is writable
                c.append(f"  case {st.index}: return -2;")
        elif st.kind == "split":
            c.append(f"  case {st.index}: {_scatter_call(st, 'src')}; return 0;")
        else:
            c.append(f"  case {st.index}: memcpy({st.c_name}, src, sizeof {st.c_name}); return 0;")
    c += ["  }", "  return -1;", "}"]
    # host: a step that keeps the trainable state when the loss or a weight turns non-finite
    guarded = [(st.sram, st.ctype) for st in sts if st.kind in ("sram", "split")]
    if guarded and not banks:
        fields = " ".join(f"{t} a{k}[sizeof {n} / sizeof({t})];" for k, (n, t) in enumerate(guarded))
        c.append("static struct { " + fields + " } et_backup;")
    c += ["/* 0: done; -1: non-finite loss; k > 0: state tensor k-1 became non-finite (weights restored) */",
          "int et_train_step_checked(const void *input, const void *label, float *loss) {"]
    for k, (n, t) in enumerate(guarded):
        if not banks:
            c.append(f"  memcpy(et_backup.a{k}, {n}, sizeof {n});")
    if banks:
        c.append("  const int prev = et_bank_active;")
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
    for k, (n, t) in enumerate(guarded):
        if not banks:
            c.append(f"    memcpy(({t} *){n}, et_backup.a{k}, sizeof {n});")
    c += ["    et_step = step;", "  }", "  return bad;", "}"]
    if grad is not None:
        gnames = list(grad.output_names)
        c.append("static const char *const et_grad_names[] = {" + ", ".join(map(_c_str, gnames)) + ", 0};")
        c.append("static const long et_grad_nbytes[] = {" + ", ".join(str(v.type.nbytes) for v in grad.outputs)
                 + ", 0};")
        c += ["int et_num_grads(void) { return ET_NUM_GRADS; }",
              "const char *et_grad_name(int i) { return i >= 0 && i < ET_NUM_GRADS ? et_grad_names[i] : 0; }",
              "long et_grad_bytes(int i) { return i >= 0 && i < ET_NUM_GRADS ? et_grad_nbytes[i] : -1; }",
              "void et_gradients(const void *input, const void *label, void *const *out) {"]
        c += copy_in("grad", [grad.input(v.name) for v in data], "input")
        if any(v.name == LABEL for v in grad.inputs):
            c += copy_in("grad", [grad.input(LABEL)], "label")
        c.append("  et_run_grad();")
        for i, v in enumerate(grad.outputs):
            c.append(f"  memcpy(out[{i}], {_value_ptr(layout, 'grad', v)}, {v.type.nbytes});")
        c.append("}")
    c += ["#endif /* ET_NO_STATE_IO */", ""]

    files = {"model.h": "\n".join(h), "model.c": "\n".join(c)}
    for hh in headers:
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
