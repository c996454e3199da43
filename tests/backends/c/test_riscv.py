"""The RISC-V firmware targets (rv32imafc: single-precision FPU; rv32imc: none, float in libgcc's
soft-float routines; rv32imafcv: rv32imafc with the vector extension's Zve32x, int8 kernels in
vectors) on QEMU's virt board: crt0 and startup, the NS16550A console and the exit
through the test device, the trap handler, the static stack bound read from RISC-V code, and
compiled programs whose losses under QEMU equal the host build's. The QEMU tests skip without
riscv64-unknown-elf-gcc / picolibc / qemu-system-riscv32 (Debian: gcc-riscv64-unknown-elf
picolibc-riscv64-unknown-elf qemu-system-misc)."""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import pytest

from edgetrain.backends.c import cortexm, cycles, firmware_reserves
from edgetrain.backends.c.stack_bound import StackBoundError, deepest, stack_bound
from edgetrain.backends.c.stack_bound_riscv import parse_disassembly
from edgetrain.devices import TARGETS

from .test_cortexm import FIXTURE, _compiled, _host_step_lines, fixture_losses, fixture_samples

RISCV = ("rv32imafc", "rv32imc", "rv32imafcv")
MISSING = cortexm.missing_tools("rv32imc")
needs_tools = pytest.mark.skipif(bool(MISSING), reason=f"missing {', '.join(MISSING)}")

# objdump -d --no-show-raw-insn, as riscv64-unknown-elf-objdump prints it
DISASSEMBLY = """
80000000 <leaf>:
80000000:	add	sp,sp,-32
80000002:	sw	ra,28(sp)
80000004:	beqz	a0,8000000c <leaf+0xc>
80000008:	lw	ra,28(sp)
8000000a:	add	sp,sp,32
8000000c:	ret

80000100 <big>:
80000100:	lui	t0,0xffffe
80000102:	add	sp,sp,-832
80000106:	add	sp,sp,t0
80000108:	jal	80000000 <leaf>
8000010c:	lui	t0,0x2
8000010e:	add	sp,sp,t0
80000110:	j	80000200 <switch>

80000200 <switch>:
80000200:	add	sp,sp,-16
80000202:	sll	a4,a4,0x2
80000204:	add	a4,a4,a3
80000206:	lw	a4,0(a4)
80000208:	add	a4,a4,a3
8000020a:	jr	a4
8000020c:	mv	sp,s3
8000020e:	add	sp,s0,-16
8000020c:	auipc	ra,0x0
80000210:	jalr	ra,-524(ra) # 80000000 <leaf>

80000300 <pointer>:
80000300:	lw	a5,0(a0)
80000302:	jalr	a5

80000500 <saver>:
80000500:	jal	t0,80000600 <__riscv_save_4>
80000504:	add	sp,sp,-16
80000506:	jal	80000000 <leaf>
8000050a:	j	80000700 <__riscv_restore_4>

80000600 <__riscv_save_4>:
80000600:	add	sp,sp,-64
80000604:	li	t1,-32
80000608:	sw	ra,60(sp)
8000060c:	sub	sp,sp,t1
80000610:	jr	t0 # ffffc000 <__stack_top+0x7fbe7750>

80000700 <__riscv_restore_4>:
80000700:	lw	ra,12(sp)
80000702:	add	sp,sp,32
80000704:	ret

80000400 <vla>:
80000400:	add	sp,sp,-16
80000402:	sub	sp,sp,a0
80000404:	ret
"""


def test_riscv_frames_and_calls_from_disassembly():
    f = parse_disassembly(DISASSEMBLY)
    assert f["leaf"].bytes == 32 and f["leaf"].callees == ()
    # a frame past the 12-bit immediate: lui t0 (-8192) added to sp; the epilogue's adds do not count
    assert f["big"].bytes == 832 + 8192 and f["big"].callees == ("leaf", "switch")
    # a jump table (lw; add base; jr) is the function's own; an unrelaxed call (auipc + jalr) is
    # resolved; sp set back from a register (a block's buffer freed, the frame pointer) lowers nothing
    assert f["switch"].callees == ("leaf",) and not f["switch"].dynamic
    assert f["pointer"].callees == ("<indirect>",)
    assert f["vla"].dynamic
    # -msave-restore millicode: `jal t0, __riscv_save_4` is 32 bytes of the caller's frame (ra, s0-s3
    # rounded to 16), its `jr t0` a return; the restore is a tail call that raises sp
    assert f["saver"].bytes == 32 + 16 and f["saver"].callees == ("leaf", "__riscv_restore_4")
    assert f["__riscv_save_4"].callees == () and deepest("saver", f)[0] == 32 + 16 + 32
    assert deepest("big", f) == (832 + 8192 + 16 + 32, ("big", "switch", "leaf"))
    with pytest.raises(StackBoundError, match="through a pointer"):
        deepest("pointer", f)
    with pytest.raises(StackBoundError, match="dynamic frame"):
        deepest("vla", f)


def _fixture(tmp_path, target, samples, **kw):
    d = tmp_path / target
    shutil.copytree(FIXTURE, d)
    cortexm.write_project(d, target, samples, **kw)
    return d


def _float_instructions(elf) -> list[str]:
    text = subprocess.run(["riscv64-unknown-elf-objdump", "-d", "--no-show-raw-insn", str(elf)],
                          capture_output=True, text=True, check=True).stdout
    return [l for l in text.splitlines() if re.match(r"^\s*[0-9a-f]+:\s+f(?!ence)\S*\s", l)]


@needs_tools
@pytest.mark.parametrize("target", RISCV)
def test_fixture_trains_under_qemu_virt(tmp_path, target):
    x, y = fixture_samples()
    d = _fixture(tmp_path, target, (x, y))
    elf = cortexm.build(d)
    run = cortexm.run_qemu(d, target, icount=True)
    assert run.exit_code == 0, run.lines
    want = [cortexm.format_step_line(i, l) for i, l in enumerate(fixture_losses(x, y), start=1)]
    assert list(run.step_lines) == want  # the Cortex-M's text, bit for bit (soft float on rv32imc too)
    bound = stack_bound(elf)
    assert bound.handler[:2] == ("et_trap_entry", "et_trap_handler")
    assert run.stack_reserve == firmware_reserves.stack_reserve_for(bound, 16) < cortexm.DEFAULT_STACK_BYTES
    assert run.stack_reserve % 16 == 0  # the psABI's stack alignment
    assert 0 < run.stack_high_water <= bound.chain_bytes < bound.bytes < run.stack_reserve
    # instructions counted per step by class with the RV32 decoder, and cycles from the CORE-V table
    assert run.instructions_per_step is not None and len(run.instructions_per_step) == len(x)
    assert min(run.instructions_per_step) > 10
    table = cycles.timing(TARGETS[target].cycle_table)
    for n, step, est in zip(run.instructions_per_step, run.counts_per_step, run.cycles_per_step):
        assert step.total.instructions == step.instructions == n  # every instruction has one class
        assert est == table.cycles(step.total) > n  # loads, stores and taken branches cost more than 1
        c = step.total
        assert c["load"] and c["store"] and c["branch_taken"] and c["other"]  # (the fixture: a 2-weight step)
        # none in RV32IMFC; the fixture (float, no int8 conv) runs no vector kernel on rv32imafcv
        assert c["load_multiple"] == c["store_multiple"] == c["simd"] == c.words == 0
        fp = c["fp"] + c["fp_mac"] + c["fp_load"] + c["fp_store"]
        assert (fp > 0) == (TARGETS[target].fpu == "single")  # rv32imc: soft float, integer instructions
    size = cortexm.firmware_size(elf, run, target)
    assert size.sram == size.data + size.bss + size.heap_reserve + size.stack_reserve
    assert size.heap_reserve == 0 and size.stack_bound == bound.bytes and size.rodata >= x.nbytes + y.nbytes
    # the FPU's instructions are in the rv32imafc firmware and in no rv32imc one
    assert bool(_float_instructions(elf)) == (TARGETS[target].fpu == "single")


@needs_tools
def test_a_trap_reports_its_cause_and_exits_with_a_fault(tmp_path):
    """The rv32imafc firmware on a core without the F extension: its first FPU instruction
    (crt0.S's fcsr write) is an illegal instruction (mcause 2)."""
    x, y = fixture_samples(2)
    d = _fixture(tmp_path, "rv32imafc", (x, y))
    cortexm.build(d)
    no_fpu = TARGETS["rv32imafc"]
    no_fpu = dataclasses.replace(no_fpu, emulator=dataclasses.replace(no_fpu.emulator, cpu=TARGETS["rv32imc"].emulator.cpu))
    run = cortexm.run_qemu(d, no_fpu)
    assert run.exit_code == 4  # ET_EXIT_FAULT (cortexm.h)
    assert any(l.startswith("edgetrain: unexpected trap mcause 0x00000002 mepc 0x8") for l in run.lines), run.lines


@needs_tools
def test_arena_guard_failure_exits_nonzero(tmp_path):
    x, y = fixture_samples(2)
    d = _fixture(tmp_path, "rv32imc", (x, y))
    cortexm.build(d, extra_cflags=["-DET_FIXTURE_SMASH_ARENA"])
    run = cortexm.run_qemu(d, "rv32imc")
    assert run.exit_code == 2 and "edgetrain: arena guard word overwritten" in run.lines


@needs_tools
def test_program_too_big_for_sram_fails_to_link(tmp_path):
    x, y = fixture_samples(2)
    d = _fixture(tmp_path, "rv32imafc", (x, y))
    with pytest.raises(cortexm.CortexMError, match="overflowed"):
        cortexm.build(d, extra_cflags=[f"-DET_FIXTURE_BSS_BYTES={300 * 1024}"])


@needs_tools
@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler (cc) for the host build")
@pytest.mark.parametrize("quantize,target", [(None, "rv32imc"), ("int8", "rv32imafc"), ("int8", "rv32imc"),
                                             ("int8", "rv32imafcv")])
def test_compiled_program_matches_host_build(tmp_path, quantize, target):
    prog, data = _compiled(quantize)
    host = _host_step_lines(prog, data, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / target, target, data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert list(fw.run.step_lines) == host
    size = fw.size
    assert size.stack_bound is not None and fw.run.stack_high_water <= size.stack_bound < size.stack_reserve
    assert size.heap_reserve == 0 and size.bss >= prog.memory.arena_bytes
    assert fw.run.instructions_per_step and min(fw.run.instructions_per_step) > 1000
    # the vector extension's instructions ran (the int8 depthwise and pointwise rows: et_int8_rvv.h) on
    # rv32imafcv only
    simd = [step.total["simd"] for step in fw.run.counts_per_step]
    assert all(simd) if TARGETS[target].simd == "rvv" else not any(simd)
