"""The checked training step of the host library (et_train_step_checked): a step whose loss or a
trained weight turns non-finite leaves every state tensor as it was.

Before, the step copied every trained array into a backup before the step and scanned them all
for non-finite values after it: two extra passes over the trained state, out of cache (ResNet18's
88 MB of weights and momentum: about 50 ms a step). Now the train graph's function brackets each
node that writes a state tensor in place (an update, batch norm's running statistics) with two
hooks: ET_GUARD_SAVE copies the array into the backup just before its first writer, ET_GUARD_CHECK
scans it just after (both while the array is in cache, where the writer reads and writes it
anyway), and only the arrays that were saved are restored. The hooks act only inside
et_train_step_checked (et_guard_on), so et_train_step runs as before.

A fused weight-gradient update (ROW_GUARDED, row_guarded) writes arrays too large for the cache
(ResNet-18's 9.4 MB weights and momenta). When it is their only writer, those arrays are
DOUBLE-BUFFERED (double_buffered): two copies and a pointer to the committed one (the array's C
name is that pointer's target). In the checked step the kernel's et_sgd_row reads each row from
the committed copy and writes its new values to the other copy, checking them as it goes
(runtime/et_float_fused.h et_row_guard); after the node the pointer flips to the new copy, and a
failed step flips it back. No backup is written (it had copied each row aside with non-temporal
stores), the same memory traffic as the raw step's update in place; the raw et_train_step updates
the committed copy in place. resnet18-cifar b8 Full, checked minus raw step (CPU-time medians of
7, bench/step_speed.py, two runs each, loaded machine): 10.8 / 7.3 -> -0.4 / 0.2 ms.

All of it is compiled only with -DET_STEP_GUARD, which the ctypes library (host.CRunner) defines:
an emitted project and the Cortex-M firmware get hooks that expand to nothing, single arrays, no
backup and no et_train_step_checked (their object code is what it was: checked with objdump on
scripts/emit_snapshot.py's resnet18 cases). The host library holds the double-buffered arrays
twice, as it held the backup of every guarded array before: its memory for the trained state is
unchanged. A step's flips move those arrays, so host.CRunner re-points its numpy views of them
after each checked step. With two weight banks the checked step keeps the previous bank instead
(emit.py) and no hooks are emitted."""
from __future__ import annotations

from typing import Callable, Optional

from ...ops import get_op
from .kernels import EmitContext
from .layout import Layout, StateArray

#: the compiler flag that turns the guard on (host.CRunner adds it to its library's flags)
GUARD_FLAG = "-DET_STEP_GUARD"
#: the kinds of state array a training step can write (flash arrays are the frozen weights)
WRITABLE_KINDS = ("sram", "split")
#: the fused updates whose kernel writes each row out of place and checks it (et_float_fused.h et_row_guard)
ROW_GUARDED = ("conv2d_grad_weight_update", "linear_grad_weight_update")


def written_arrays(layout: Layout, node) -> list[StateArray]:
    """The writable state arrays that train-graph `node` overwrites in place (its op's `mutates`
    inputs, through views to their storage root)."""
    op = get_op(node.op)
    if not op.mutates:
        return []
    ctx = EmitContext(layout, "train")
    out = []
    for _, j in op.shares:
        st = ctx.state_of(node.inputs[j]) if j < len(node.inputs) else None
        if st is not None and st.kind in WRITABLE_KINDS and st not in out:
            out.append(st)
    return out


def guarded_arrays(layout: Layout) -> list[StateArray]:
    """The arrays the train graph writes, in the order of their first writer (guard slots)."""
    out: list[StateArray] = []
    for n in layout.graphs["train"].graph.nodes:
        out += [st for st in written_arrays(layout, n) if st not in out]
    return out


def row_guarded(layout: Layout, node) -> bool:
    """True when `node` is a fused weight-gradient update (ROW_GUARDED) that writes its whole float
    weight (input 2) and momentum (input 3, when present) and nothing else: each row of them goes
    through et_sgd_row, which in the checked step writes it to the array's other copy and checks it
    there (et_float_fused.h et_row_guard)."""
    if node.op not in ROW_GUARDED:
        return False
    ctx = EmitContext(layout, "train")
    ins = [ctx.state_of(v) for v in node.inputs[2:4]]
    return (all(st is not None and st.kind == "sram" and st.ctype == "float" for st in ins)
            and written_arrays(layout, node) == ins)


def double_buffered(layout: Layout) -> list[StateArray]:
    """The arrays held twice in the host library: those whose only writer in the train graph is a
    row-guarded fused update (written whole, row by row, by et_sgd_row)."""
    writers: dict[str, list] = {}
    arrays: dict[str, StateArray] = {}
    for n in layout.graphs["train"].graph.nodes:
        for st in written_arrays(layout, n):
            writers.setdefault(st.name, []).append(n)
            arrays[st.name] = st
    return [arrays[k] for k, ns in writers.items() if len(ns) == 1 and row_guarded(layout, ns[0])]


def double_buffer_decls(arrays: list[StateArray]) -> list[str]:
    """The state declarations of double-buffered arrays: with ET_STEP_GUARD two copies (_b0, _b1), a
    pointer to the committed one (_p) and the array's name as its target (_alt: the other copy);
    without, the one array any state array is."""
    c = ["/* double-buffered trained state (backends/c/step_guard.py): the host library holds these twice */"]
    for st in arrays:
        n, t, x = max(st.numel, 1), st.ctype, st.c_name
        c += ["#ifdef ET_STEP_GUARD",
              f"static {t} {x}_b0[{n}] ET_ALIGNED(64), {x}_b1[{n}] ET_ALIGNED(64);",
              f"static {t} (*{x}_p)[{n}] = &{x}_b0;",
              f"#define {x} (*{x}_p)",
              f"#define {x}_alt (*({x}_p == &{x}_b0 ? &{x}_b1 : &{x}_b0))",
              "#else",
              f"static {t} {x}[{n}] ET_ALIGNED(16);",
              "#endif"]
    return c


def node_hooks(layout: Layout, slots: list[StateArray], double: list[StateArray]) -> Callable:
    """For graph_function: node -> (statements before it, statements after it): the whole-array
    save and check, or for a row-guarded node whose arrays are double-buffered the in-kernel
    guard's set-up, its result and the flips to the new copies."""
    slot = {st.name: k for k, st in enumerate(slots)}
    dbl = {st.name for st in double}

    def hooks(node) -> tuple[list[str], list[str]]:
        arrays = written_arrays(layout, node)
        ks = [slot[st.name] for st in arrays]
        if not (arrays and row_guarded(layout, node) and all(st.name in dbl for st in arrays)):
            return [f"ET_GUARD_SAVE({k});" for k in ks], [f"ET_GUARD_CHECK({k});" for k in ks]
        w, m = arrays[0], (arrays[1] if len(arrays) > 1 else None)
        mb = f"{m.c_name}, {m.c_name}_alt" if m is not None else "(float *)0, (float *)0"
        return ([f"ET_GUARD_ROWS({w.c_name}, {w.c_name}_alt, {mb});"],
                [f"ET_GUARD_ROWS_END({w.index + 1}, {m.index + 1 if m is not None else 0});",
                 *(f"ET_GUARD_FLIP({k}, {st.c_name});" for k, st in zip(ks, arrays))])
    return hooks


def guard_declarations(slots: list[StateArray], double: list[StateArray]) -> list[str]:
    """The backup arrays (of the slots not double-buffered) and the hooks (before the graph
    functions); without ET_STEP_GUARD the hooks are no-ops."""
    c = ["", "/* the checked step's guard (backends/c/step_guard.py): host library only */", "#ifdef ET_STEP_GUARD"]
    if not slots:
        return c + ["#endif", *NO_HOOKS]
    dbl = {st.name for st in double}
    backed = [(k, st) for k, st in enumerate(slots) if st.name not in dbl]
    fields = " ".join(f"{st.ctype} a{k}[sizeof {st.sram} / sizeof({st.ctype})];" for k, st in backed)
    c += [f"static struct {{ {fields} }} et_backup;" if backed else "",
          f"static unsigned char et_guard_saved[{len(slots)}]; /* saved, or flipped (double-buffered) */",
          "static int et_guard_on, et_guard_bad;",
          "/* one loop, called: inlined in each case below, GCC would vectorize a copy of it per array */",
          "static ET_NOINLINE int et_any_nonfinite(const uint32_t *u, size_t n) {",
          "  uint32_t acc = 0;",
          "  for (size_t i = 0; i < n; ++i) acc |= (u[i] & 0x7f800000u) == 0x7f800000u;",
          "  return acc != 0;",
          "}",
          "/* copy slot k's array into the backup before its first write of this step */",
          "static ET_GRAPH_ATTR void et_guard_save(int k) {",
          "  if (!et_guard_on || et_guard_saved[k]) return;",
          "  et_guard_saved[k] = 1;",
          "  switch (k) {"]
    c += [f"  case {k}: et_copy(et_backup.a{k}, {st.sram}, sizeof {st.sram}); break;" for k, st in backed]
    c += ["  default: break;", "  }", "}",
          "/* after a write: the first float array found non-finite (its state index + 1) */",
          "static ET_GRAPH_ATTR void et_guard_check(int k) {",
          "  if (!et_guard_on || et_guard_bad) return;",
          "  switch (k) {"]
    for k, st in backed:
        if st.ctype == "float":
            c.append(f"  case {k}: if (et_any_nonfinite((const uint32_t *){st.sram}, sizeof {st.sram} / 4)) "
                     f"et_guard_bad = {st.index + 1}; break;")
    c += ["  default: break;", "  }", "}",
          *ROW_HOOKS,
          "#define ET_GUARD_SAVE(k) et_guard_save(k)", "#define ET_GUARD_CHECK(k) et_guard_check(k)",
          "#define ET_GUARD_ROWS(...) et_guard_rows(__VA_ARGS__)",
          "#define ET_GUARD_ROWS_END(iw, im) et_guard_rows_end(iw, im)",
          "/* after a double-buffered array's writer: the new copy is the array (et_guard_saved: to undo) */",
          "#define ET_GUARD_FLIP(k, a) do { if (et_guard_on) { a##_p = &a##_alt; et_guard_saved[k] = 1; } } while (0)",
          "#else", *NO_HOOKS, "#endif"]
    return c


#: a row-guarded node's hooks (node_hooks): et_row_guard set up before it (the committed copies and
#: the other ones), its `bad` turned into the first non-finite array's state index + 1
ROW_HOOKS = [
    "static void et_guard_rows(const float *w, float *wo, const float *m, float *mo) {",
    "  if (!et_guard_on) return;",
    "  et_row_guard.w = w; et_row_guard.wo = wo; et_row_guard.m = m; et_row_guard.mo = mo;",
    "  et_row_guard.bad = 0; et_row_guard.on = 1;",
    "}",
    "static void et_guard_rows_end(int iw, int im) {",
    "  if (!et_row_guard.on) return;",
    "  et_row_guard.on = 0;",
    "  et_row_guard_fence();",
    "  if (!et_guard_bad && (et_row_guard.bad & 1)) et_guard_bad = iw;",
    "  else if (!et_guard_bad && (et_row_guard.bad & 2)) et_guard_bad = im;",
    "}"]
#: the hooks without ET_STEP_GUARD: nothing (their arguments are never expanded)
NO_HOOKS = ["#define ET_GUARD_SAVE(k) ((void)0)", "#define ET_GUARD_CHECK(k) ((void)0)",
            "#define ET_GUARD_ROWS(...) ((void)0)", "#define ET_GUARD_ROWS_END(iw, im) ((void)0)",
            "#define ET_GUARD_FLIP(k, a) ((void)0)"]


def checked_step(slots: list[StateArray], double: list[StateArray]) -> list[str]:
    """et_train_step_checked: the step with the hooks on; on a non-finite loss or array, the
    saved arrays restored, the flipped ones flipped back and the step counter kept."""
    dbl = {st.name for st in double}
    c = ["#ifdef ET_STEP_GUARD",
         "/* 0: done; -1: non-finite loss; k > 0: state tensor k-1 became non-finite (weights restored) */",
         "ET_GRAPH_ATTR int et_train_step_checked(const void *input, const void *label, float *loss) {",
         "  const int32_t step = et_step;"]
    if slots:
        c += ["  memset(et_guard_saved, 0, sizeof et_guard_saved);", "  et_guard_bad = 0;", "  et_guard_on = 1;"]
    c += ["  *loss = et_train_step(input, label);", f"  int bad = {'et_guard_bad' if slots else '0'};"]
    if slots:
        c.append("  et_guard_on = 0;")
    c += ["  { union { float f; uint32_t u; } l = {*loss}; if ((l.u & 0x7f800000u) == 0x7f800000u) bad = -1; }",
          "  if (bad) {"]
    for k, st in enumerate(slots):
        if st.name in dbl:
            c.append(f"    if (et_guard_saved[{k}]) {st.c_name}_p = &{st.c_name}_alt; /* the committed copy again */")
        else:
            c.append(f"    if (et_guard_saved[{k}]) et_copy(({st.ctype} *){st.sram}, et_backup.a{k}, sizeof {st.sram});")
    return c + ["    et_step = step;", "  }", "  return bad;", "}", "#endif /* ET_STEP_GUARD */"]


def with_guard(flags) -> tuple:
    """`flags` with GUARD_FLAG (once)."""
    flags = tuple(flags)
    return flags if GUARD_FLAG in flags else flags + (GUARD_FLAG,)


def slots_for(layout: Layout, banks: bool) -> Optional[list[StateArray]]:
    """The guard slots of a program, or None with weight banks (the previous bank is the backup)."""
    return None if banks else guarded_arrays(layout)


def double_for(layout: Layout, banks: bool, embed: bool) -> list[StateArray]:
    """The double-buffered arrays of an emitted program: none with weight banks or embedded weights
    (the firmware: its arrays carry their initial values), else double_buffered."""
    return [] if banks or embed else double_buffered(layout)
