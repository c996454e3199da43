"""Cycles per training step on a Cortex-M or RISC-V core, estimated from instruction counts by class.

QEMU executes instructions, not cycles: it has no timing model. The instruction-count plugin
(runtime/cortexm/icount_plugin.c, run by cortexm.run_qemu, with its ISA's decoder:
runtime/cortexm/icount_decode.h for Thumb-2, runtime/riscv/icount_decode.h for RV32) classifies
every executed instruction from its encoding into CLASSES and counts them per training step and per function
(the enclosing ELF symbol: a kernel is a function), with the registers moved by multiple
loads/stores (`words`). This module turns the counts into cycles with a per-core cost table:

    cycles = sum(count[class] * cost[class]) + words * cost_per_word

The tables (TIMINGS, one record per firmware target of devices.targets: its `cycle_table`) take
their numbers from the cores' manuals, each with its source in `CoreTiming.notes`:

* Cortex-M4: the Cortex-M4 Technical Reference Manual (Arm DDI 0439B, r0p1), Table 3-1
  "Cortex-M4 instruction set summary" and section 3.3 "Load/store timings", and Table 7-1 of
  its FPU chapter ("FPU instruction set"). Those cycle counts assume zero wait states.
* Cortex-M7: Arm publishes no per-instruction timings for it (its TRM, Arm DDI 0489, describes
  a 6-stage, dual-issue pipeline with 64-bit load/store paths, single-cycle MAC and a branch
  target address cache, but gives no table). Its record keeps the M4 numbers where the M7's
  documented features say nothing faster, and says where it differs and why.
* rv32imafc / rv32imc: the chips of their class (GD32V, ESP32-C3) publish no timings; OpenHW
  Group's CORE-V CV32E40P (RV32IMFC) and CV32E40X (RV32IMC) user manuals do ("Pipeline
  Details", cycle counts per instruction type, zero-stall memories), and stand in for them.
  rv32imafcv: the CV32E40P's scalar numbers and an assumed vector unit (one vector instruction a
  cycle: no published timing used; RV32IMAFCV's comment).

What the model leaves out (so read the estimate as an order of magnitude check, good for
comparing kernels and for finding where a step spends its time, within some tens of percent of
a board):
* memory: every load and store is assumed to hit zero-wait-state memory (TCM, SRAM, or the
  caches / ART accelerator in front of the STM32F746's flash, which has 7 wait states at
  216 MHz; weights frozen in flash are read from there);
* the pipeline: no load-use or multiply-result stalls, no pairing of neighbouring loads and
  stores (the M4 TRM: a run of N loads can take N + 1 cycles, counted here as 2N), and on the
  M7 no dual issue (it can retire two instructions a cycle: the estimate is a single-issue
  figure, an upper bound in that respect);
* branches: a taken branch costs the pipeline refill P, which the M4 TRM gives as 1 to 3
  cycles; P = 2 is used. The M7 predicts branches; a predicted taken branch is assumed to cost
  2 cycles (one bubble) and mispredictions are not modelled. A POP or LDM that loads the PC is
  counted as a taken branch plus its registers (M4 TRM: 4 + N; here 3 + N);
* SDIV / UDIV take 2 to 12 cycles (early termination on the operands' leading bits); 7, the
  middle, is used for every divide;
* conditional instructions in an IT block that fail their condition still count as executed
  (the M4 TRM times them as one cycle, like this model).
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

#: the plugin's instruction classes, in its order (icount_plugin.c enum et_class)
CLASSES = ("other", "load", "load_multiple", "store", "store_multiple", "mul", "mac", "simd", "div",
           "branch_taken", "branch_not_taken", "fp", "fp_mac", "fp_div", "fp_load", "fp_store")
#: the name given to code outside every function symbol
NO_SYMBOL = "(no symbol)"


@dataclass(frozen=True)
class Counts:
    """Executed instructions by class (a tuple in CLASSES' order) and the registers moved by
    multiple loads/stores and FP loads/stores (`words`)."""
    by_class: tuple[int, ...] = (0,) * len(CLASSES)
    words: int = 0

    @property
    def instructions(self) -> int:
        return sum(self.by_class)

    def __getitem__(self, cls: str) -> int:
        return self.by_class[CLASSES.index(cls)]

    def as_dict(self) -> dict[str, int]:
        return dict(zip(CLASSES, self.by_class))

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(tuple(a + b for a, b in zip(self.by_class, other.by_class)), self.words + other.words)

    def __sub__(self, other: "Counts") -> "Counts":
        return Counts(tuple(a - b for a, b in zip(self.by_class, other.by_class)), self.words - other.words)


@dataclass(frozen=True)
class StepCounts:
    """One training step's counts: in all (`total`), per function (name -> Counts, functions
    that ran only), and the plugin's plain instruction count (every executed translation block's
    length, counted apart from the classes: equal to total.instructions)."""
    total: Counts
    functions: Mapping[str, Counts]
    instructions: int


@dataclass(frozen=True)
class CoreTiming:
    """Cycles per instruction class on one core (zero-wait-state memory), with the source or
    assumption behind each number in `notes`."""
    target: str
    cost: Mapping[str, float]
    cost_per_word: float
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if set(self.cost) != set(CLASSES):
            raise ValueError(f"{self.target}: costs for {sorted(set(CLASSES) ^ set(self.cost))} missing or extra")

    def cycles(self, counts: Counts) -> float:
        """sum(count[class] * cost[class]) + words * cost_per_word."""
        return sum(n * self.cost[c] for c, n in zip(CLASSES, counts.by_class)) + counts.words * self.cost_per_word


_M4_TRM = "Cortex-M4 TRM (DDI 0439B) Table 3-1"
_M4_FPU = "Cortex-M4 TRM (DDI 0439B) Table 7-1 (FPU)"

CORTEX_M4 = CoreTiming(
    "cortex-m4",
    cost={"other": 1, "load": 2, "load_multiple": 1, "store": 1, "store_multiple": 1, "mul": 1, "mac": 1,
          "simd": 1, "div": 7, "branch_taken": 3, "branch_not_taken": 1, "fp": 1, "fp_mac": 3, "fp_div": 14,
          "fp_load": 1, "fp_store": 1},
    cost_per_word=1,
    notes={
        "other": f"{_M4_TRM}: data processing, moves, shifts, compares, extends, bit fields: 1",
        "load": f"{_M4_TRM}: LDR/LDRB/LDRH/LDRSB/LDRSH 2 (pairing of neighbouring loads, N + 1, not modelled)",
        "load_multiple": f"{_M4_TRM}: LDM, POP 1 + N; LDRD 1 + N with N = 2 (N in words)",
        "store": f"{_M4_TRM} lists STR as 2; section 3.3.2: STR Rx,[Ry,#imm] is always one cycle "
                 f"(the data phase overlaps the next instruction): 1",
        "store_multiple": f"{_M4_TRM}: STM, PUSH 1 + N; STRD 1 + N with N = 2",
        "mul": f"{_M4_TRM}: MUL 1",
        "mac": f"{_M4_TRM}: MLA, MLS, SMULL, UMULL, SMLAL, UMLAL, SMLAxy, SMULWy, SMMUL, SMMLA: 1",
        "simd": f"{_M4_TRM}: SMLAD, SMUAD, SMLALD, SXTB16, SSAT, USAT, QADD, parallel add/sub, SEL, PKH: 1",
        "div": f"{_M4_TRM}: SDIV, UDIV 2 to 12 (early termination); 7 used",
        "branch_taken": f"{_M4_TRM}: B, BL, BX, BLX 1 + P, P (pipeline refill) 1 to 3; P = 2 used",
        "branch_not_taken": f"{_M4_TRM}: a conditional branch not taken 1",
        "fp": f"{_M4_FPU}: VADD, VSUB, VMUL, VNMUL, VABS, VNEG, VCMP, VCVT, VMOV, VMRS 1",
        "fp_mac": f"{_M4_FPU}: VMLA, VMLS, VNMLA, VNMLS, VFMA, VFMS, VFNMA, VFNMS 3",
        "fp_div": f"{_M4_FPU}: VDIV, VSQRT 14",
        "fp_load": f"{_M4_FPU}: VLDR 2 (1 + one word), VLDM, VPOP 1 + N: 1 + 1 per word",
        "fp_store": f"{_M4_FPU}: VSTR 2, VSTM, VPUSH 1 + N: 1 + 1 per word",
    })

_M7 = "Cortex-M7 TRM (DDI 0489) gives no instruction timings"
CORTEX_M7 = CoreTiming(
    "cortex-m7",
    cost={"other": 1, "load": 1, "load_multiple": 1, "store": 1, "store_multiple": 1, "mul": 1, "mac": 1,
          "simd": 1, "div": 7, "branch_taken": 2, "branch_not_taken": 1, "fp": 1, "fp_mac": 3, "fp_div": 14,
          "fp_load": 0, "fp_store": 0},
    cost_per_word=1,
    notes={
        "other": f"{_M7}; single issue assumed: 1 (dual issue ignored)",
        "load": f"{_M7}; its load/store unit is pipelined, one load a cycle from TCM or a cache hit: 1 "
                f"(load-use latency not modelled)",
        "load_multiple": "as the M4: 1 + N (the M7's 64-bit data path could halve N; not assumed)",
        "store": "as the M4: 1",
        "store_multiple": "as the M4: 1 + N",
        "mul": "as the M4: 1",
        "mac": "single-cycle MAC (Arm, 'The DSP capabilities of Cortex-M4 and Cortex-M7', 2016): 1",
        "simd": "as the M4: 1",
        "div": "as the M4: 2 to 12; 7 used",
        "branch_taken": f"{_M7}; the M7 predicts branches (branch target address cache): a predicted taken "
                        f"branch 2, mispredictions not modelled",
        "branch_not_taken": "1",
        "fp": "as the M4: 1",
        "fp_mac": "as the M4: 3 (an accumulation chain waits for its previous result)",
        "fp_div": "as the M4 (single precision): 14",
        "fp_load": "a VLDR.32 in one cycle like LDR: 0 + 1 per word",
        "fp_store": "a VSTR.32 in one cycle like STR: 0 + 1 per word",
    })

_M55 = "assumed, not from an Arm timing table"
#: The Cortex-M55 (Armv8.1-M, Helium): its scalar costs are the M7 record's (loads pipelined from
#: TCM, predicted branches, single-cycle MAC; no dual issue counted). Helium's instructions fall in
#: the decoder's coprocessor space outside cp10/cp11 and count as "other": one cycle each. The
#: M55 executes a 128-bit vector instruction as four 32-bit beats, two a cycle ("dual-beat"), so
#: one alone takes 2 cycles, but a vector load or store overlaps a vector multiply-accumulate of
#: the next instruction; in a loop that alternates them (et_int8_mve.h's: VLDRB, VMLADAVA) the
#: average is about 1 cycle an instruction. Arm's Cortex-M55 Software Optimization Guide has the
#: per-instruction figures; they are not reproduced here. Read the M55 estimate as the M7's model
#: applied to the M55's instruction stream, not as a pipeline model of the M55.
CORTEX_M55 = CoreTiming(
    "cortex-m55",
    cost=dict(CORTEX_M7.cost),
    cost_per_word=CORTEX_M7.cost_per_word,
    notes={**{c: f"as the M7 record: {n}" for c, n in CORTEX_M7.notes.items()},
           "other": f"{_M55}: scalar data processing 1; a Helium instruction 1 (dual-beat: 2 alone, "
                    f"overlapped with the next vector load/store or multiply-accumulate)"})

_CV32 = "CV32E40P user manual (OpenHW Group), 'Pipeline Details', Table 'Cycle counts per instruction type'"
_CV32X = "CV32E40X user manual (OpenHW Group), 'Pipeline Details', the same table"
_RV32_COST = {"other": 1, "load": 1, "load_multiple": 1, "store": 1, "store_multiple": 1, "mul": 1, "mac": 5,
              "simd": 1, "div": 19, "branch_taken": 3, "branch_not_taken": 1, "fp": 1, "fp_mac": 1, "fp_div": 19,
              "fp_load": 1, "fp_store": 1}


def _rv32_notes(manual: str, fpu: bool) -> dict[str, str]:
    fp = ("" if fpu else "never counted on this core (no F extension: soft-float runs as integer "
                         "instructions in libgcc); ")
    return {
        "other": f"{manual}: integer computational 1; CSR access 1 (4 for the counters and trap CSRs, rare)",
        "load": f"{manual}: load 1 (zero-stall data memory; the 1-cycle load-use hazard is not modelled)",
        "load_multiple": "RV32 has no multiple loads: never counted",
        "store": f"{manual}: store 1",
        "store_multiple": "RV32 has no multiple stores: never counted",
        "mul": f"{manual}: MUL 1 (single-cycle 32 x 32 -> 32 multiplier)",
        "mac": f"{manual}: MULH, MULHSU, MULHU 5 (the upper word; the plugin's 'mac' class, as Arm's long multiplies)",
        "simd": "no vector unit on this core: never counted (the plugin counts the V extension here)",
        "div": f"{manual}: DIV, DIVU, REM, REMU 3 to 35 (by the divisor's leading zeros); 19, the middle, used",
        "branch_taken": f"{manual}: a taken branch 3, a jump (JAL, JALR) 2; the plugin counts both here at 3 "
                        f"(jumps are calls and returns, few in the kernels' loops)",
        "branch_not_taken": f"{manual}: a branch not taken 1",
        "fp": fp + f"{_CV32}: FP addition, multiplication, comparison, conversion 1 .. LAT + 1 with "
                   f"FPU_ADDMUL_LAT = FPU_OTHERS_LAT = 0 (the core's parameter defaults): 1",
        "fp_mac": fp + f"{_CV32}: FMADD, FMSUB, FNMADD, FNMSUB (addition/multiplication unit) 1 at FPU_ADDMUL_LAT = 0",
        "fp_div": fp + f"{_CV32}: FDIV, FSQRT 1 to 19 (19 when the next instruction uses the result): 19",
        "fp_load": fp + f"{_CV32}: FLW through the load/store unit, 1",
        "fp_store": fp + f"{_CV32}: FSW through the load/store unit, 1",
    }


# RISC-V microcontroller cores with published per-instruction timings: OpenHW Group's CORE-V
# CV32E40P (RV32IMFC, the PULP RI5CY lineage: GAP8/GAP9-class, 4-stage in-order) for rv32imafc,
# and its CV32E40X (RV32IMC, the same integer timings) for rv32imc. The ESP32-C3's and GD32V's
# cores publish none; the estimate reads as "on a CORE-V core at zero wait states".
RV32IMAFC = CoreTiming("rv32imafc", cost=_RV32_COST, cost_per_word=0, notes=_rv32_notes(_CV32, True))
RV32IMC = CoreTiming("rv32imc", cost=_RV32_COST, cost_per_word=0, notes=_rv32_notes(_CV32X, False))

# rv32imafcv: the CV32E40P's scalar numbers and an assumed vector unit, not a published core's
# timing: one vector instruction (VLEN 128 bits, up to LMUL 4: a vwmacc of 16 lanes into 32-bit
# accumulators, vsetvli, a unit-stride or strided load / store) issued a cycle, as if its lanes
# went in one beat; no chaining, no lane-by-lane cost of strided loads and no scalar-vector
# overlap modelled. Read the vector figure as an instruction count with the scalar costs, an
# optimistic bound for a narrow embedded vector unit (which takes LMUL x VLEN / datapath beats).
_RVV = "assumed (no published timing of an RV32 core with Zve32x used)"
RV32IMAFCV = CoreTiming("rv32imafcv", cost=_RV32_COST, cost_per_word=0,
                        notes={**_rv32_notes(_CV32, True),
                               "simd": f"{_RVV}: a vector instruction (VLEN 128, LMUL <= 4) 1 a cycle, "
                                       f"loads and stores included"})

#: cost table name (a target record's `cycle_table`) -> the table (one per firmware target of
#: devices.targets, as a test checks; run_qemu gives no cycle estimate for a target without one)
TIMINGS: Mapping[str, CoreTiming] = MappingProxyType({t.target: t for t in (CORTEX_M4, CORTEX_M7, CORTEX_M55, RV32IMAFC,
                                                                                   RV32IMC, RV32IMAFCV)})


def timing(target: str) -> CoreTiming:
    """The cost table of a firmware target (ValueError for any other name)."""
    try:
        return TIMINGS[target]
    except KeyError:
        raise ValueError(f"no cycle table for {target!r} (backends/c/cycles.py TIMINGS); "
                         f"expected one of {sorted(TIMINGS)}") from None


# --- the plugin's input and output --------------------------------------------------------------
def function_symbols(elf) -> list[tuple[int, int, str]]:
    """(start, size, name) of the ELF's sized code symbols, by start, Thumb bit cleared, one per
    start address (the ELF's toolchain's nm): the functions the plugin attributes counts to."""
    from .cortexm_target import elf_toolchain

    r = subprocess.run([elf_toolchain(elf).tool("nm"), "-S", "-n", "--defined-only", str(elf)],
                       capture_output=True, text=True, check=True)
    out, seen = [], set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[2] not in "tTwW":
            continue
        start, size = int(parts[0], 16) & ~1, int(parts[1], 16)
        if size and start not in seen:
            seen.add(start)
            out.append((start, size, parts[3]))
    out.sort()
    return out


def symbols_text(symbols: Sequence[tuple[int, int, str]]) -> str:
    """The plugin's symbols= file."""
    return "".join(f"{start:x} {size:x} {name}\n" for start, size, name in symbols)


@dataclass(frozen=True)
class Mark:
    """The plugin's running counters at one call of the marker function."""
    instructions: int
    functions: Mapping[str, Counts]

    @property
    def total(self) -> Counts:
        return sum(self.functions.values(), Counts())


def parse_marks(text: str, names: Sequence[str]) -> list[Mark]:
    """The plugin's output file: one Mark per call of et_icount_mark. `names`: the functions of
    the symbols file, in its order (index len(names): code outside every symbol)."""
    marks, funcs, instructions = [], None, 0
    width = len(CLASSES) + 2
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "mark":
            funcs, instructions = {}, int(parts[2])
        elif parts[0] == "end":
            marks.append(Mark(instructions, MappingProxyType(funcs)))
            funcs = None
        elif funcs is not None and len(parts) == width:
            i = int(parts[0])
            name = names[i] if i < len(names) else NO_SYMBOL
            c = Counts(tuple(int(p) for p in parts[1:-1]), int(parts[-1]))
            funcs[name] = funcs[name] + c if name in funcs else c
        else:
            raise ValueError(f"unexpected line in the instruction-count plugin's output: {line!r}")
    return marks


def step_counts(marks: Sequence[Mark]) -> tuple[StepCounts, ...]:
    """Each step's counts: main.c marks right before (2 i) and right after (2 i + 1) step i."""
    steps = []
    for before, after in zip(marks[0::2], marks[1::2]):
        funcs = {}
        for name, c in after.functions.items():
            d = c - before.functions.get(name, Counts())
            if d.instructions or d.words:
                funcs[name] = d
        total = sum(funcs.values(), Counts())
        steps.append(StepCounts(total, MappingProxyType(funcs), after.instructions - before.instructions))
    return tuple(steps)


def breakdown(step: StepCounts, target: str, top: Optional[int] = 10) -> list[tuple[str, Counts, float]]:
    """(function, counts, estimated cycles) of a step's functions, most cycles first (`top` of
    them; None: all)."""
    t = timing(target)
    rows = sorted(((name, c, t.cycles(c)) for name, c in step.functions.items()), key=lambda r: -r[2])
    return rows if top is None else rows[:top]


def write_symbols(path: Path, symbols: Sequence[tuple[int, int, str]]) -> list[str]:
    """Writes the symbols file; returns the names in its order (for parse_marks)."""
    Path(path).write_text(symbols_text(symbols))
    return [name for _, _, name in symbols]
