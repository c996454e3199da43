"""The RV32 decoder of the instruction-count plugin (runtime/riscv/icount_decode.h) and the RISC-V
cost tables (backends/c/cycles.py): every class of a table of encodings assembled by
riscv64-unknown-elf-as, compressed and full-size, and the tables' sources. The firmware's counts
under QEMU are checked in test_riscv.py. Skips without the RISC-V binutils or a host C compiler."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from edgetrain.backends.c import cycles, qemu_run
from edgetrain.devices import TARGETS

from .test_cycles import decode

AS, OBJDUMP = "riscv64-unknown-elf-as", "riscv64-unknown-elf-objdump"

# (instruction, class, words); "cond" = a conditional branch (taken or not decided at run time).
# `c.` forms are the compressed (16-bit) encodings: the assembler keeps them 16-bit.
ENCODINGS = [
    ("lw a0, 4(a1)", "load", 0), ("lb a0, -1(a1)", "load", 0), ("lbu a0, 0(a1)", "load", 0),
    ("lh a0, 2(a1)", "load", 0), ("lhu a0, 2(a1)", "load", 0), ("c.lw a0, 0(a1)", "load", 0),
    ("c.lwsp a0, 8(sp)", "load", 0),
    ("sw a0, 4(a1)", "store", 0), ("sb a0, 0(a1)", "store", 0), ("sh a0, 2(a1)", "store", 0),
    ("c.sw a0, 0(a1)", "store", 0), ("c.swsp a0, 8(sp)", "store", 0),
    ("mul a0, a1, a2", "mul", 0),
    ("mulh a0, a1, a2", "mac", 0), ("mulhsu a0, a1, a2", "mac", 0), ("mulhu a0, a1, a2", "mac", 0),
    ("div a0, a1, a2", "div", 0), ("divu a0, a1, a2", "div", 0), ("rem a0, a1, a2", "div", 0),
    ("remu a0, a1, a2", "div", 0),
    ("jal ra, .+2000", "branch_taken", 0), ("jalr ra, 0(a5)", "branch_taken", 0), ("c.j .+20", "branch_taken", 0),
    ("c.jal .+20", "branch_taken", 0), ("c.jr ra", "branch_taken", 0), ("c.jalr a5", "branch_taken", 0),
    ("beq a0, a1, .+200", "cond", 0), ("bne a0, a1, .+200", "cond", 0), ("blt a0, a1, .+200", "cond", 0),
    ("bgeu a0, a1, .+200", "cond", 0), ("c.beqz a0, .+20", "cond", 0), ("c.bnez a0, .+20", "cond", 0),
    ("fadd.s fa0, fa1, fa2", "fp", 0), ("fsub.s fa0, fa1, fa2", "fp", 0), ("fmul.s fa0, fa1, fa2", "fp", 0),
    ("fmin.s fa0, fa1, fa2", "fp", 0), ("fsgnj.s fa0, fa1, fa2", "fp", 0), ("fcvt.w.s a0, fa1", "fp", 0),
    ("fcvt.s.w fa0, a1", "fp", 0), ("fmv.x.w a0, fa1", "fp", 0), ("fmv.w.x fa0, a1", "fp", 0),
    ("flt.s a0, fa1, fa2", "fp", 0), ("fclass.s a0, fa1", "fp", 0),
    ("fmadd.s fa0, fa1, fa2, fa3", "fp_mac", 0), ("fmsub.s fa0, fa1, fa2, fa3", "fp_mac", 0),
    ("fnmadd.s fa0, fa1, fa2, fa3", "fp_mac", 0), ("fnmsub.s fa0, fa1, fa2, fa3", "fp_mac", 0),
    ("fdiv.s fa0, fa1, fa2", "fp_div", 0), ("fsqrt.s fa0, fa1", "fp_div", 0),
    ("flw fa0, 4(a1)", "fp_load", 0), ("c.flw fa0, 0(a1)", "fp_load", 0), ("c.flwsp fa0, 8(sp)", "fp_load", 0),
    ("fsw fa0, 4(a1)", "fp_store", 0), ("c.fsw fa0, 0(a1)", "fp_store", 0), ("c.fswsp fa0, 8(sp)", "fp_store", 0),
    ("vadd.vv v1, v2, v3", "simd", 0), ("vle8.v v1, (a0)", "simd", 0), ("vse32.v v1, (a0)", "simd", 0),
    ("add a0, a1, a2", "other", 0), ("addi a0, a1, -5", "other", 0), ("lui a0, 0x12345", "other", 0),
    ("auipc a0, 0", "other", 0), ("slli a0, a1, 3", "other", 0), ("sltu a0, a1, a2", "other", 0),
    ("csrr a0, mcause", "other", 0), ("fence", "other", 0), ("ecall", "other", 0), ("c.addi a0, 1", "other", 0),
    ("c.li a0, 3", "other", 0), ("c.mv a0, a1", "other", 0), ("c.add a0, a1", "other", 0),
    ("c.slli a0, 2", "other", 0), ("c.addi4spn a0, sp, 16", "other", 0), ("c.nop", "other", 0),
    ("c.ebreak", "other", 0),
]


def assemble(lines: list[str], tmp_path) -> list[bytes]:
    """The encoding of each line (riscv64-unknown-elf-as for rv32imafcv, objdump's listing):
    plain mnemonics stay 32-bit (.option norvc), `c.` ones are compressed."""
    src = tmp_path / "enc.s"
    body = [(".option rvc\n" if line.startswith("c.") else ".option norvc\n") + line for line in lines]
    src.write_text("\n".join(body) + "\n")
    obj = tmp_path / "enc.o"
    subprocess.run([AS, "-march=rv32imafcv", "-mabi=ilp32f", str(src), "-o", str(obj)], check=True,
                   capture_output=True)
    dump = subprocess.run([OBJDUMP, "-d", str(obj)], check=True, capture_output=True, text=True).stdout
    return [int(m.group(1), 16).to_bytes(len(m.group(1)) // 2, "little")
            for m in re.finditer(r"^\s*[0-9a-f]+:\s+([0-9a-f]{4}|[0-9a-f]{8})\s", dump, re.M)]


@pytest.fixture(scope="module")
def riscv_lib():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no host C compiler")
    return ctypes.CDLL(str(qemu_run.plugin_path("rv32imafc")))


def test_each_isa_builds_its_own_decoder():
    assert qemu_run.decoder_dir("rv32imc").name == qemu_run.decoder_dir("rv32imafc").name == "riscv"
    assert qemu_run.decoder_dir("cortex-m4").name == "cortexm"
    assert qemu_run.plugin_path("rv32imc") == qemu_run.plugin_path("rv32imafc") != qemu_run.plugin_path("cortex-m7")


@pytest.mark.skipif(shutil.which(AS) is None or shutil.which(OBJDUMP) is None, reason="no RISC-V binutils")
def test_rv32_decoder_classifies_known_encodings(riscv_lib, tmp_path):
    encodings = assemble([line for line, _, _ in ENCODINGS], tmp_path)
    assert [len(e) for e in encodings] == [2 if line.startswith("c.") else 4 for line, _, _ in ENCODINGS]
    assert [riscv_lib.et_insn_size(e, 4) for e in encodings] == [len(e) for e in encodings]
    got = [(line, *decode(riscv_lib, enc)) for (line, _, _), enc in zip(ENCODINGS, encodings)]
    assert got == ENCODINGS
    # QEMU may hand 4 bytes for a compressed instruction: the low bits decide its size
    c_lw_and_next = encodings[5] + b"\x13\x00"
    assert riscv_lib.et_insn_size(c_lw_and_next, 4) == 2 and decode(riscv_lib, c_lw_and_next) == ("load", 0)


def test_riscv_tables_cite_their_core_and_cost_what_the_manual_says():
    for name in ("rv32imafc", "rv32imc"):
        t = cycles.timing(TARGETS[name].cycle_table)
        assert all("CV32E40" in t.notes[k] for k in ("load", "mul", "mac", "div", "branch_taken"))
        assert (t.cost["load"], t.cost["mul"], t.cost["mac"], t.cost["branch_taken"]) == (1, 1, 5, 3)
        assert 3 <= t.cost["div"] <= 35 and t.cost_per_word == 0
    assert "never counted" in cycles.timing("rv32imc").notes["fp"]
