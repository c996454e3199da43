"""Writes a compiled program as C: model.h (the API) and model.c (arena, state arrays, the
three graphs as functions, the API) with the runtime headers; project.py adds the samples,
the host driver, a Makefile and a README; banks.py the two weight banks."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ...ir import Role
from .banks import BANK_API, BANK_FUNCS, bank_arrays, bank_decls, bank_fresh_start
from .constpool import ConstPool
from .emit_graphs import PROFILE, SPLIT_HELPERS, gather_call, graph_function, scatter_call, state_decls, value_ptr
from .kernels.check import CHECK_HEADER, has_check
from .layout import GRAPHS, CBackendError, Layout, build_layout
from .step_guard import checked_step, double_buffer_decls, double_for, guard_declarations, node_hooks, slots_for
from .weights_file import release_hooks

RUNTIME_DIR = Path(__file__).parent / "runtime"
#: runtime headers every program includes (et_int8.h: the int8 forward, with et_int8_scales.h
#: (the backward's per-channel factors) and et_int8_pool.h (pooling, concatenation), et_int8_dsp.h,
#: et_int8_gemm.h and et_int8_dw.h: its Cortex-M DSP kernels, et_int8_grad.h: its backward,
#: et_int8_update.h: its integer SGD;
#: et_float_nn.h: activations, softmax, layer norm, pooling, embedding; et_float_bn.h: batch norm;
#: et_float_gemm.h: convolutions and dense layers through the host's BLAS or the portable kernels;
#: et_float_fused.h: float weight gradients fused with their update)
RUNTIME_HEADERS = ("et_common.h", "et_float.h", "et_float_blas.h", "et_float_gemm.h", "et_float_nn.h",
                   "et_float_bn.h", "et_int8.h", "et_int8_scales.h", "et_int8_pool.h",
                   "et_int8_dsp.h", "et_int8_gemm.h", "et_int8_dw.h", "et_int8_grad.h", "et_int8_update.h",
                   "et_float_shape.h", "et_float_fused.h", "et_float_conv_nd.h", "et_float_resample.h",
                   "et_int8_resample.h", "et_float_gnorm.h", "et_float_pointwise.h", "et_int8_pointwise.h",
                   "et_float_select.h", "et_float_qweights.h", "et_float_lmloss.h", "et_int8_transposed.h")
#: the storage API of page_in / page_out, included by programs that page
PAGE_HEADER = "et_page.h"
#: model.h of a program with a run-time check (kernels/check.py)
CHECK_API = ("/* the message of the first run-time check that failed since the last call (0: none) */",
             "const char *et_check_error(void);")


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
    double: list  # step_guard.double_for: the arrays the host library holds twice (its checked step)
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
            dst = value_ptr(self.layout, key, gv)
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
    if has_check(gl.graph for gl in layout.graphs.values()):
        headers.append(CHECK_HEADER)
    return _Unit(prog=prog, layout=layout, embed=embed, keys=keys,
                 data=[train.input(n) for n in layout.data_inputs], label=train.the_input(Role.LABEL),
                 out_v=prog.forward_graph.output("output"),
                 grad=layout.graphs["grad"].graph if "grad" in keys else None, banked=banked,
                 double=double_for(layout, bool(banked), embed), headers=headers)


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
        *LEFT_OUT_MACRO.splitlines(),
        "void et_init(void);",
        "float et_train_step(const void *input, const void *label);",
        "void et_predict(const void *input, float *out)" + _left_out(u, "forward", "et_predict") + ";",
        "int et_check_guards(void);",
        "void et_set_step(int32_t step);",
        "int32_t et_get_step(void);",
        *(CHECK_API if CHECK_HEADER in u.headers else []),
        *(BANK_API.splitlines() if u.banks else []),
        *(PAGE_API.format(nbytes=u.layout.page_bytes).splitlines() if u.paging else []),
        "#ifndef ET_NO_STATE_IO",
        "int et_num_state(void);",
        "const char *et_state_name(int i);",
        "long et_state_bytes(int i);",
        "int et_get_state(int i, void *dst);",
        "int et_set_state(int i, const void *src);",
        "void *et_state_ptr(int i); /* the array of an unsplit state tensor (host builds), else 0 */",
        "/* ET_MAP_WEIGHTS builds: point frozen tensor i at p (file_backed: in the mapped weights file, its pages",
        "   released after use); 0, or -1 when i is not such a tensor */",
        "int et_bind_state(int i, const void *p, int file_backed);",
        "long long et_weight_release_bytes(void); /* bytes of frozen weights' pages released so far */",
        "void et_weight_map_range(const void *p, unsigned long n); /* the mapping those tensors are in */",
        "int et_num_grads(void);",
        "const char *et_grad_name(int i);",
        "long et_grad_bytes(int i);",
        "void et_gradients(const void *input, const void *label, void *const *out)" + _left_out(u, "grad", "et_gradients")
        + ";",
        *([] if u.banks else ["#ifdef ET_STEP_GUARD /* the host library's (step_guard.py) */"]),
        "int et_train_step_checked(const void *input, const void *label, float *loss);",
        *([] if u.banks else ["#endif"]),
        "#endif",
        "#ifdef __cplusplus", "}", "#endif", "#endif", "",
    ]


#: model.h: the mark of an entry point whose graph was left out (emit_sources' `graphs`): a call
#: of it is a compile-time error naming the graph (GCC's `error`, Clang's `unavailable`; other
#: compilers fail at link time: the function is not defined)
LEFT_OUT_MACRO = """#if defined(__clang__)
#define ET_LEFT_OUT(msg) __attribute__((unavailable(msg)))
#elif defined(__GNUC__)
#define ET_LEFT_OUT(msg) __attribute__((error(msg)))
#else
#define ET_LEFT_OUT(msg)
#endif"""


def _left_out(u: _Unit, graph: str, fn: str) -> str:
    """` ET_LEFT_OUT("...")` for the declaration of `fn` when `graph` was not emitted, else ""."""
    if graph in u.keys:
        return ""
    return (f' ET_LEFT_OUT("{fn}: this program was emitted without its {graph} graph (graphs={u.keys!r}); '
            f"emit it with '{graph}' among its graphs\")")


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
    c += state_decls(u.layout, u.prog.state, u.embed, frozenset(a[0] for a in u.banked),
                     frozenset(st.name for st in u.double))
    if u.double:
        c += double_buffer_decls(u.double)
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
        if st.role is Role.OPTIMIZER_STATE:
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
    loss_ptr = value_ptr(u.layout, "train", u.layout.graphs["train"].graph.output("loss"))
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
                f"  memcpy(out, {value_ptr(u.layout, 'forward', u.out_v)}, {u.out_v.type.nbytes});", "}"]


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
            c.append(f"  case {st.index}: {gather_call(st, 'dst')}; return 0;")
        else:  # a byte count, not sizeof: a mapped frozen tensor is a pointer
            c.append(f"  case {st.index}: memcpy(dst, {st.c_name}, {st.numel * np.dtype(st.dtype).itemsize}); "
                     "return 0;")
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
            c.append(f"  case {st.index}: {scatter_call(st, 'src')}; return 0;")
        elif st.kind == "flash":  # mapped builds: read-only, bound by et_bind_state
            c.append(f"  case {st.index}: if (ET_MAP_WEIGHTS) return -2; memcpy((void *){st.c_name}, src, "
                     f"{st.numel * np.dtype(st.dtype).itemsize}); return 0;")
        else:
            c.append(f"  case {st.index}: memcpy({st.c_name}, src, sizeof {st.c_name}); return 0;")
    c += ["  }", "  return -1;", "}", "int et_bind_state(int i, const void *p, int file_backed) {"]
    mapped = [st for st in sts if st.kind == "flash" and not u.embed]
    if mapped:
        c += ["#if ET_MAP_WEIGHTS", "  switch (i) {"]
        c += [f"  case {st.index}: {st.c_name} = (const {st.ctype} *)p; "
              f"et_state_file_backed[{st.index}] = (unsigned char)(file_backed != 0); return 0;" for st in mapped]
        c += ["  }", "#endif"]
    return c + ["  (void)i, (void)p, (void)file_backed;", "  return -1;", "}"]


def _checked_step(u: _Unit) -> list[str]:
    """et_train_step_checked with two weight banks: a step that keeps the trained state when the
    loss or a weight turns non-finite, by committing the previous bank (intact) again. (Without
    banks: step_guard.checked_step.)"""
    sts = u.states
    guarded = [(st.sram, st.ctype) for st in sts if st.kind in ("sram", "split")]
    c = ["/* 0: done; -1: non-finite loss; k > 0: state tensor k-1 became non-finite (weights restored) */",
         "int et_train_step_checked(const void *input, const void *label, float *loss) {",
         "  const int prev = et_bank_active;"]
    c += ["  const int32_t step = et_step;", "  *loss = et_train_step(input, label);", "  int bad = 0;",
          "  { union { float f; uint32_t u; } l = {*loss}; if ((l.u & 0x7f800000u) == 0x7f800000u) bad = -1; }"]
    for n, t in guarded:
        st = next(s for s in sts if s.sram == n)
        if t == "float":
            c += ["  if (!bad) { uint32_t acc = 0; const uint32_t *u = (const uint32_t *)" + n + ";",
                  f"    for (size_t i = 0; i < sizeof {n} / 4; ++i) acc |= ((u[i] & 0x7f800000u) == 0x7f800000u);",
                  f"    if (acc) bad = {st.index + 1}; }}"]
    c += ["  if (bad) {",
          "    if (et_bank_active != prev) { /* a non-finite weight was committed: the previous bank again */",
          "      et_bank_header = ET_BANK_MAGIC | (uint32_t)prev;",
          "      et_bank_active = prev;",
          "      et_bank_cur = et_banks[prev];",
          "    }"]
    return c + ["    et_step = step;", "  }", "  return bad;", "}"]


def _gradients(u: _Unit) -> list[str]:
    """et_gradients and the gradient tensors' names and sizes (without the grad graph: none, and
    no et_gradients, which model.h marks left out)."""
    grad = u.grad
    if grad is None:
        return ["int et_num_grads(void) { return 0; }", "const char *et_grad_name(int i) { (void)i; return 0; }",
                "long et_grad_bytes(int i) { (void)i; return -1; }"]
    c = ["static const char *const et_grad_names[] = {" + ", ".join(map(_c_str, grad.output_names)) + ", 0};",
         "static const long et_grad_nbytes[] = {" + ", ".join(str(v.type.nbytes) for v in grad.outputs) + ", 0};",
         "int et_num_grads(void) { return ET_NUM_GRADS; }",
         "const char *et_grad_name(int i) { return i >= 0 && i < ET_NUM_GRADS ? et_grad_names[i] : 0; }",
         "long et_grad_bytes(int i) { return i >= 0 && i < ET_NUM_GRADS ? et_grad_nbytes[i] : -1; }",
         "void et_gradients(const void *input, const void *label, void *const *out) {"]
    c += u.copy_in("grad", [grad.input(v.name) for v in u.data], "input")
    label = grad.the_input(Role.LABEL)
    if label is not None:
        c += u.copy_in("grad", [label], "label")
    c.append("  et_run_grad();")
    for i, v in enumerate(grad.outputs):
        c.append(f"  memcpy(out[{i}], {value_ptr(u.layout, 'grad', v)}, {v.type.nbytes});")
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
    (split gather / scatter, profiling, gather buffers); the kernels' constant tables, each
    once (constpool.py); one function per graph; et_init;
    the guard check; et_train_step; et_predict; then, unless ET_NO_STATE_IO, state I/O, the
    checked step and et_gradients."""
    if weight_banks not in (1, 2):
        raise CBackendError(f"weight_banks={weight_banks!r}: 1 (updates in place) or 2 (two banks)")
    u = _unit(prog, layout or build_layout(prog, graphs), embed_weights, weight_banks)
    gather_bufs: list = []  # filled by the graph functions, declared before them
    pool = ConstPool()  # the kernels' constant tables, one copy of each, declared before the functions
    slots = slots_for(u.layout, u.banks)  # the checked step's guarded arrays (step_guard.py)
    hooks = node_hooks(u.layout, slots, u.double) if slots else None

    def graph_hooks(k):  # the checked step's (train); without embedded weights the frozen weights' release
        h = hooks if k == "train" else None
        return h if u.embed else release_hooks(u.layout, k, h, schedule=getattr(u.prog, "schedule", None))
    funcs = [graph_function(u.layout, k, gather_bufs, u.banks and k == "train", pool, graph_hooks(k)) for k in u.keys]
    consts = ["", f"/* the kernels' constant tables ({len(pool)}, each once: backends/c/constpool.py) */"]
    c = _includes(u) + _arena_and_state(u) + _helpers(u, gather_bufs) + consts + pool.declarations()
    c += (guard_declarations(slots, u.double) if slots is not None else []) + funcs
    c += _init(u) + _guard_check(u) + _train_step(u) + _predict(u)
    c += ["", "#ifndef ET_NO_STATE_IO"] + _state_io(u)
    c += _checked_step(u) if u.banks else checked_step(slots, u.double)
    c += _gradients(u)
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
