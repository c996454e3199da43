"""What each backend computes: one table, kept complete by a test (tests/backends/test_capabilities.py),
read by the compiler before anything is built (DESIGN principle 13).

- "reference": the numpy runtime, the living spec: every op of the op table, every dtype.
- "c": the C backend on the host: the ops with a registered C kernel (backends/c/kernels);
  float programs compute in float32 (its float kernels are written for C `float`), int8
  programs in int8 / int32 with float32 gradients, or int16 ones (backward="integer").
- "cortex-m": the same C kernels in a bare-metal firmware; no file system, so the page ops
  (paging a tensor to storage: ops/page.py) are the host's only.
- "riscv": the same on a RISC-V microcontroller (rv32imafc, rv32imc, rv32imafcv: the portable
  kernels, int8 rows in registers or vectors; a core without an FPU computes float arithmetic
  with libgcc's soft-float routines).

Each emit target names its row (devices/targets.py `Target.backend`); a target row is the
firmware's: the C kernels less FIRMWARE_LACKS.

`check_program(prog, backend)` refuses a program with an op or a dtype its backend lacks:
`UnsupportedOpError` (exit 2 in the CLI) naming the op and the model source line it comes
from, raised before any C is written or built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from ..frontend.capture import UnsupportedOpError
from ..ops import OPS

#: value dtypes a C program may hold (float64 is not one: the float kernels compute in C `float`)
C_DTYPES = frozenset({"float32", "int8", "int16", "int32", "int64", "bool"})
#: ops a bare-metal firmware (Cortex-M, RISC-V) cannot run, and why
FIRMWARE_LACKS = CORTEX_M_LACKS = {
    "page_in": "paging reads tensors back from a file: the firmware has no file system",
    "page_out": "paging writes tensors to a file: the firmware has no file system",
}
#: where a backend's ops come from, for the docs
ORIGIN = {"reference": "the numpy reference of every OpDef (ops/)",
          "c": "the registered C kernels (backends/c/kernels)",
          "cortex-m": "the C kernels, less the ops that need a file system",
          "riscv": "the C kernels (portable), less the ops that need a file system"}
#: the capability rows of firmware targets
FIRMWARE_BACKENDS = ("cortex-m", "riscv")


@dataclass(frozen=True)
class Capability:
    """One backend: the ops it runs and the dtypes its values may have (None: any);
    `lacks` names ops of the op table it does not run, each with the reason."""

    name: str
    ops: frozenset
    dtypes: Optional[frozenset] = None
    lacks: Mapping[str, str] = field(default_factory=dict)

    def missing(self, ops: Iterable[str]) -> list[str]:
        return sorted(set(ops) - self.ops)


def _c_ops() -> frozenset:
    from .c.kernels import KERNELS

    return frozenset(KERNELS)


def capabilities() -> dict[str, Capability]:
    """Every backend's capability, from the registries as they are now."""
    every = frozenset(OPS)
    c_ops = _c_ops()
    c_lacks = {op: "no C kernel" for op in sorted(every - c_ops)}
    m_ops = c_ops - frozenset(FIRMWARE_LACKS)
    m_lacks = {**c_lacks, **{op: why for op, why in FIRMWARE_LACKS.items()}}
    return {
        "reference": Capability("reference", every),
        "c": Capability("c", c_ops, C_DTYPES, c_lacks),
        **{b: Capability(b, m_ops, C_DTYPES, m_lacks) for b in FIRMWARE_BACKENDS},
    }


def backend_of_target(target: str) -> str:
    """The capability row of an emit target ("host", "cortex-m4", "rv32imc", or its record): the
    target registry's `backend` (devices/targets.py)."""
    from ..devices.targets import resolve_target

    return resolve_target(target).backend


def origin_of(op: str, sources: Mapping[str, tuple]) -> tuple[str, ...]:
    """The model source lines an op of a compiled graph comes from: those of the captured ops
    it is (``max_pool2d``), quantizes (``qmax_pool2d``) or differentiates
    (``max_pool2d_grad``, ``qconv2d_grad_weight``); () when the compiler made it itself
    (a loss, an optimizer update)."""
    cands = [op, op[1:] if op.startswith("q") else op]
    for c in list(cands):
        if "_grad" in c:
            cands.append(c.split("_grad")[0])
    for c in cands:
        if c in sources:
            return tuple(sources[c])
    return ()


def _graphs(prog) -> list:
    gs = [prog.train_graph, prog.forward_graph, prog.grad_graph]
    if getattr(prog, "input_transform", None) is not None:
        gs.append(prog.input_transform)
    return gs


def unsupported(prog, backend: str) -> list[tuple[str, str]]:
    """(op, reason) for each op or dtype of `prog`'s graphs that `backend` lacks, in graph order."""
    cap = capabilities()[backend]
    out, seen = [], set()
    for g in _graphs(prog):
        for n in g.nodes:
            if n.op in seen:
                continue
            if n.op not in cap.ops:
                seen.add(n.op)
                out.append((n.op, cap.lacks.get(n.op, "no kernel")))
                continue
            if cap.dtypes is not None:
                bad = sorted({v.dtype for v in (*n.inputs, *n.outputs)} - cap.dtypes)
                if bad:
                    seen.add(n.op)
                    out.append((n.op, f"its values are {'/'.join(bad)}, which the {backend} backend does not "
                                      f"hold (it computes float programs in float32: compile the model in "
                                      f"float32, e.g. model.float())"))
    return out


def check_program(prog, backend: str) -> None:
    """Raise UnsupportedOpError when `backend` cannot run `prog`, naming each op, why, and
    the model source line it comes from; nothing is built before this check."""
    if backend == "reference":
        return
    bad = unsupported(prog, backend)
    if not bad:
        return
    sources = getattr(prog, "op_sources", None) or {}
    lines = []
    for op, why in bad:
        where = origin_of(op, sources)
        at = (f" (from {where[0]}" + (f" and {len(where) - 1} more line(s)" if len(where) > 1 else "") + ")"
              if where else " (emitted by the compiler)")
        lines.append(f"op {op!r}{at}: {why}")
    raise UnsupportedOpError(f"the {backend} backend cannot run this program: " + "; ".join(lines)
                             + ". Nothing was built; backend='reference' runs every op "
                               "(docs/backends.md lists what each backend supports).")


def capability_markdown() -> str:
    """The table of docs/backends.md: each op of the op table, and whether each backend runs it."""
    caps = capabilities()
    names = list(caps)
    rows = ["| op | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for op in sorted(OPS):
        cells = []
        for b in names:
            cap = caps[b]
            cells.append("yes" if op in cap.ops else "no: " + cap.lacks.get(op, "no kernel"))
        rows.append(f"| `{op}` | " + " | ".join(cells) + " |")
    dt = ["", "| backend | value dtypes | ops from |", "|---|---|---|"]
    for b, cap in caps.items():
        dt.append(f"| {b} | {'any' if cap.dtypes is None else ', '.join(sorted(cap.dtypes))} | {ORIGIN[b]} |")
    return "\n".join(rows + dt) + "\n"
