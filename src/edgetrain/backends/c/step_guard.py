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
(ResNet-18's 9.4 MB weights and momenta): its hooks instead set up et_row_guard
(runtime/et_float_fused.h), and the kernel's et_sgd_row copies each row into the backup (non-temporal
stores) just before updating it and scans it just after, while it is in cache. resnet18-cifar b8
Full, checked minus raw step: 18 -> 8.7 ms (CPU-time medians of 9, one run each, loaded machine).

All of it is compiled only with -DET_STEP_GUARD, which the ctypes library (host.CRunner) defines:
an emitted project and the Cortex-M firmware get hooks that expand to nothing, no backup arrays
and no et_train_step_checked. With two weight banks the checked step keeps the previous bank
instead (emit.py) and no hooks are emitted."""
from __future__ import annotations

from typing import Callable, Optional

from ...ops import get_op
from .kernels import EmitContext
from .layout import Layout, StateArray

#: the compiler flag that turns the guard on (host.CRunner adds it to its library's flags)
GUARD_FLAG = "-DET_STEP_GUARD"
#: the kinds of state array a training step can write (flash arrays are the frozen weights)
WRITABLE_KINDS = ("sram", "split")
#: the fused updates whose kernel saves and checks each row it writes (et_float_fused.h et_row_guard)
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
    through et_sgd_row, which saves and checks it in the kernel (et_float_fused.h et_row_guard)."""
    if node.op not in ROW_GUARDED:
        return False
    ctx = EmitContext(layout, "train")
    ins = [ctx.state_of(v) for v in node.inputs[2:4]]
    return (all(st is not None and st.kind == "sram" and st.ctype == "float" for st in ins)
            and written_arrays(layout, node) == ins)


def node_hooks(layout: Layout, slots: list[StateArray]) -> Callable:
    """For graph_function: node -> (statements before it, statements after it): the whole-array
    save and check, or for a row-guarded node the in-kernel guard's set-up and its result."""
    slot = {st.name: k for k, st in enumerate(slots)}

    def hooks(node) -> tuple[list[str], list[str]]:
        arrays = written_arrays(layout, node)
        ks = [slot[st.name] for st in arrays]
        if not row_guarded(layout, node):
            return [f"ET_GUARD_SAVE({k});" for k in ks], [f"ET_GUARD_CHECK({k});" for k in ks]
        (kw, w), (km, m) = (ks[0], arrays[0]), ((ks[1], arrays[1]) if len(ks) > 1 else (-1, None))
        mb = f"(float *){m.sram}, et_backup.a{km}" if m is not None else "(float *)0, (float *)0"
        return ([f"ET_GUARD_ROWS({kw}, (float *){w.sram}, et_backup.a{kw}, {km}, {mb});"],
                [f"ET_GUARD_ROWS_END({w.index + 1}, {m.index + 1 if m is not None else 0});"])
    return hooks


def guard_declarations(slots: list[StateArray]) -> list[str]:
    """The backup arrays and the two hooks (before the graph functions); without ET_STEP_GUARD
    the hooks are no-ops."""
    c = ["", "/* the checked step's guard (backends/c/step_guard.py): host library only */", "#ifdef ET_STEP_GUARD"]
    if not slots:
        return c + ["#endif", "#define ET_GUARD_SAVE(k) ((void)0)", "#define ET_GUARD_CHECK(k) ((void)0)",
                    *NO_ROW_HOOKS]
    fields = " ".join(f"{st.ctype} a{k}[sizeof {st.sram} / sizeof({st.ctype})];" for k, st in enumerate(slots))
    c += [f"static struct {{ {fields} }} et_backup;",
          f"static unsigned char et_guard_saved[{len(slots)}];",
          "static int et_guard_on, et_guard_bad;",
          "static int et_any_nonfinite(const uint32_t *u, size_t n) {",
          "  uint32_t acc = 0;",
          "  for (size_t i = 0; i < n; ++i) acc |= (u[i] & 0x7f800000u) == 0x7f800000u;",
          "  return acc != 0;",
          "}",
          "/* copy slot k's array into the backup before its first write of this step */",
          "static void et_guard_save(int k) {",
          "  if (!et_guard_on || et_guard_saved[k]) return;",
          "  et_guard_saved[k] = 1;",
          "  switch (k) {"]
    c += [f"  case {k}: memcpy(et_backup.a{k}, {st.sram}, sizeof {st.sram}); break;" for k, st in enumerate(slots)]
    c += ["  }", "}",
          "/* after a write: the first float array found non-finite (its state index + 1) */",
          "static void et_guard_check(int k) {",
          "  if (!et_guard_on || et_guard_bad) return;",
          "  switch (k) {"]
    for k, st in enumerate(slots):
        if st.ctype == "float":
            c.append(f"  case {k}: if (et_any_nonfinite((const uint32_t *){st.sram}, sizeof {st.sram} / 4)) "
                     f"et_guard_bad = {st.index + 1}; break;")
    c += ["  default: break;", "  }", "}",
          *ROW_HOOKS,
          "#define ET_GUARD_SAVE(k) et_guard_save(k)", "#define ET_GUARD_CHECK(k) et_guard_check(k)",
          "#define ET_GUARD_ROWS(...) et_guard_rows(__VA_ARGS__)",
          "#define ET_GUARD_ROWS_END(iw, im) et_guard_rows_end(iw, im)",
          "#else", "#define ET_GUARD_SAVE(k) ((void)0)", "#define ET_GUARD_CHECK(k) ((void)0)", *NO_ROW_HOOKS,
          "#endif"]
    return c


#: a row-guarded node's hooks (node_hooks): et_row_guard set up before it (each array's backup
#: only at its first writer), its `bad` turned into the first non-finite array's state index + 1
ROW_HOOKS = [
    "static void et_guard_rows(int kw, float *w, float *wb, int km, float *m, float *mb) {",
    "  if (!et_guard_on) return;",
    "  et_row_guard.w = w; et_row_guard.wb = et_guard_saved[kw] ? 0 : wb; et_guard_saved[kw] = 1;",
    "  et_row_guard.m = m; et_row_guard.mb = km < 0 || et_guard_saved[km] ? 0 : mb;",
    "  if (km >= 0) et_guard_saved[km] = 1;",
    "  et_row_guard.bad = 0; et_row_guard.on = 1;",
    "}",
    "static void et_guard_rows_end(int iw, int im) {",
    "  if (!et_row_guard.on) return;",
    "  et_row_guard.on = 0;",
    "  if (!et_guard_bad && (et_row_guard.bad & 1)) et_guard_bad = iw;",
    "  else if (!et_guard_bad && (et_row_guard.bad & 2)) et_guard_bad = im;",
    "}"]
NO_ROW_HOOKS = ["#define ET_GUARD_ROWS(...) ((void)0)", "#define ET_GUARD_ROWS_END(iw, im) ((void)0)"]


def checked_step(slots: list[StateArray]) -> list[str]:
    """et_train_step_checked: the step with the hooks on; on a non-finite loss or array, the
    saved arrays restored and the step counter kept."""
    c = ["#ifdef ET_STEP_GUARD",
         "/* 0: done; -1: non-finite loss; k > 0: state tensor k-1 became non-finite (weights restored) */",
         "int et_train_step_checked(const void *input, const void *label, float *loss) {",
         "  const int32_t step = et_step;"]
    if slots:
        c += ["  memset(et_guard_saved, 0, sizeof et_guard_saved);", "  et_guard_bad = 0;", "  et_guard_on = 1;"]
    c += ["  *loss = et_train_step(input, label);", f"  int bad = {'et_guard_bad' if slots else '0'};"]
    if slots:
        c.append("  et_guard_on = 0;")
    c += ["  { union { float f; uint32_t u; } l = {*loss}; if ((l.u & 0x7f800000u) == 0x7f800000u) bad = -1; }",
          "  if (bad) {"]
    c += [f"    if (et_guard_saved[{k}]) memcpy(({st.ctype} *){st.sram}, et_backup.a{k}, sizeof {st.sram});"
          for k, st in enumerate(slots)]
    return c + ["    et_step = step;", "  }", "  return bad;", "}", "#endif /* ET_STEP_GUARD */"]


def with_guard(flags) -> tuple:
    """`flags` with GUARD_FLAG (once)."""
    flags = tuple(flags)
    return flags if GUARD_FLAG in flags else flags + (GUARD_FLAG,)


def slots_for(layout: Layout, banks: bool) -> Optional[list[StateArray]]:
    """The guard slots of a program, or None with weight banks (the previous bank is the backup)."""
    return None if banks else guarded_arrays(layout)
