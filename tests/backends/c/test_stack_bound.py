"""The firmware's static stack bound (backends/c/stack_bound.py) and the reserves sized from it
(firmware_reserves.py): frames and calls read from disassembly, the deepest chain, the cases
without a bound; on the fixture firmware, the measured high water against the bound."""
from __future__ import annotations

import shutil

import pytest

from edgetrain.backends.c import cortexm, firmware_reserves
from edgetrain.backends.c.stack_bound import (EXCEPTION_FRAME_BYTES, Frame, StackBoundError, deepest,
                                              parse_disassembly, stack_bound)

from .test_cortexm import FIXTURE, fixture_losses, fixture_samples

# objdump -d --no-show-raw-insn, as arm-none-eabi-objdump prints it (addresses in hex)
DISASSEMBLY = """
00001000 <leaf>:
    1000:	push	{r4, r5, lr}
    1002:	vpush	{d8-d9}
    1006:	sub	sp, #12
    1008:	beq.n	1010 <leaf+0x10>
    100a:	b.n	1010 <__stack_size>
    1010:	pop	{r4, r5, pc}

00001100 <caller>:
    1100:	sub	sp, #16
    1102:	stmdb	sp!, {r4, r5, r6, r7, r8, r9, sl, fp, lr}
    1106:	subw	sp, sp, #3644	@ 0xe3c
    110a:	bl	1000 <leaf>
    110e:	b.w	1200 <tail+0x0>

00001200 <tail>:
    1200:	str.w	lr, [sp, #-4]!
    1204:	sub.w	sp, sp, #620	@ 0x26c
    1208:	bx	lr

00001300 <vla>:
    1300:	push	{r7, lr}
    1302:	sub.w	sp, sp, r3

00001400 <pointer>:
    1400:	push	{r4, lr}
    1402:	blx	r3

00001410 <tail_pointer>:
    1410:	ldr.w	pc, [sp], #4
    1414:	bx	r3

00001500 <loop_a>:
    1500:	push	{lr}
    1502:	bl	1600 <loop_b>

00001600 <loop_b>:
    1600:	push	{lr}
    1602:	bl	1500 <loop_a>
"""


def test_frames_and_calls_from_disassembly():
    f = parse_disassembly(DISASSEMBLY)
    # 3 registers + 2 double registers + 12; a branch inside itself (however objdump labels
    # its address) is no call
    assert f["leaf"] == Frame(3 * 4 + 2 * 8 + 12, False, ())
    # the argument registers stored below the frame count (gcc's -fstack-usage omits them);
    # the tail branch counts as a call
    assert f["caller"] == Frame(16 + 9 * 4 + 3644, False, ("leaf", "tail"))
    assert f["tail"] == Frame(4 + 620, False, ())
    assert f["vla"].dynamic and f["pointer"].callees == ("<indirect>",)
    assert f["tail_pointer"].callees == ("<indirect>",)  # bx r3; ldr pc, [sp], #4 is a return


def test_deepest_chain_and_the_cases_without_a_bound():
    f = parse_disassembly(DISASSEMBLY)
    assert deepest("caller", f) == (16 + 36 + 3644 + 624, ("caller", "tail"))
    with pytest.raises(StackBoundError, match="dynamic frame"):
        deepest("vla", f)
    with pytest.raises(StackBoundError, match="through a pointer"):
        deepest("pointer", f)
    with pytest.raises(StackBoundError, match="recursion: loop_a > loop_b > loop_a"):
        deepest("loop_a", f)
    with pytest.raises(StackBoundError, match="no code"):
        deepest("x", {"x": Frame(8, False, ("missing",))})


def test_reserve_lines():
    ld = ("__stack_size = 8192;" + firmware_reserves.AUTO_NOTE + "\n__heap_size = 4096;\n")
    assert firmware_reserves.reserve(ld, "__stack_size") == (8192, True)
    assert firmware_reserves.reserve(ld, "__heap_size") == (4096, False)
    out = firmware_reserves.set_auto(ld, stack=1000, heap=0)  # the explicit heap is left
    assert firmware_reserves.reserve(out, "__stack_size") == (1000, True)
    assert firmware_reserves.reserve(out, "__heap_size") == (4096, False)


pytestmark_tools = pytest.mark.skipif(bool(cortexm.missing_tools()),
                                      reason=f"missing {', '.join(cortexm.missing_tools())}")


def _project(tmp_path, name, **kw):
    d = tmp_path / name
    shutil.copytree(FIXTURE, d)
    cortexm.write_project(d, "cortex-m4", fixture_samples(3), **kw)
    return d


@pytestmark_tools
def test_a_kernels_stack_buffer_is_in_the_bound_and_the_reserve(tmp_path):
    """A 2 KB stack buffer: the bound holds it and the measured high water; the reserve is
    the bound (with the guard word), the heap none; the firmware still trains."""
    d = _project(tmp_path, "deep")
    elf = cortexm.build(d, extra_cflags=["-DET_FIXTURE_STACK_BYTES=2048"])
    bound = stack_bound(elf)
    assert "fixture_stack_kernel" in bound.chain and bound.chain[0] == "Reset_Handler"
    assert bound.handler and bound.handler_bytes >= EXCEPTION_FRAME_BYTES
    run = cortexm.run_qemu(d, "cortex-m4")
    assert run.exit_code == 0
    x, y = fixture_samples(3)
    assert list(run.step_lines) == [cortexm.format_step_line(i, l)
                                    for i, l in enumerate(fixture_losses(x, y), start=1)]
    assert 2048 < run.stack_high_water <= bound.chain_bytes
    assert run.stack_reserve == firmware_reserves.stack_reserve_for(bound)
    size = cortexm.firmware_size(elf, run)
    assert size.heap_reserve == 0 and size.stack_bound == bound.bytes


@pytestmark_tools
def test_explicit_stack_below_the_bound_refused_and_a_dynamic_frame_unbounded(tmp_path):
    d = _project(tmp_path, "small", stack_bytes=1024)
    with pytest.raises(cortexm.CortexMError, match="beyond the 1024-byte reserve"):
        cortexm.build(d, extra_cflags=["-DET_FIXTURE_STACK_BYTES=2048"])
    # no static bound: the default reserves, the run-time guard, no bound in the report
    d = _project(tmp_path, "vla")
    elf = cortexm.build(d, extra_cflags=["-DET_FIXTURE_VLA"])
    with pytest.raises(StackBoundError, match="et_train_step has a dynamic frame"):
        stack_bound(elf)
    size = cortexm.firmware_size(elf)
    assert size.stack_bound is None and size.stack_reserve == cortexm.DEFAULT_STACK_BYTES
    assert size.heap_reserve == cortexm.DEFAULT_HEAP_BYTES


@pytestmark_tools
def test_a_program_that_fits_only_with_its_bound_links(tmp_path):
    """.bss leaving 6 KB of SRAM: the default 8 KB stack and 4 KB heap overflow it; sized to the
    bound it links and runs."""
    d = _project(tmp_path, "tight")
    elf = cortexm.build(d, extra_cflags=[f"-DET_FIXTURE_BSS_BYTES={cortexm.SRAM_BYTES - 6 * 1024}"])
    size = cortexm.firmware_size(elf)
    assert size.sram <= cortexm.SRAM_BYTES and size.stack_reserve < 6 * 1024
    assert cortexm.run_qemu(d, "cortex-m4").exit_code == 0
