"""The cycle estimate of Cortex-M steps (backends/c/cycles.py and the QEMU plugin's classes).

The plugin's decoder (et_decode, exported by the plugin library) against a table of
encodings assembled by arm-none-eabi-as; hand-written assembly kernels run under QEMU whose
counts by class equal a hand count exactly, and whose cycle estimate equals the table applied
by hand. Skips without the ARM toolchain, QEMU or a host C compiler (as test_cortexm.py)."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from edgetrain.backends.c import cortexm, cortexm_target, cycles, qemu_run
# the Cortex-M targets: the kernels below are Thumb-2 (RISC-V's decoder: test_cycles_riscv.py)
FIRMWARE_TARGETS = cortexm.TARGETS

def test_one_cost_table_per_firmware_target_with_a_source_for_each_number():
    every = cortexm_target.FIRMWARE_TARGETS  # Cortex-M and RISC-V (test_cycles_riscv.py: its decoder)
    assert set(cycles.TIMINGS) == set(every) == {t.cycle_table for t in every.values()}
    for t in cycles.TIMINGS.values():
        assert set(t.cost) == set(cycles.CLASSES) and set(t.notes) == set(cycles.CLASSES)
    with pytest.raises(ValueError, match="no cycle table"):
        cycles.timing("host")


def test_cycles_are_counts_times_costs():
    c = cycles.Counts(tuple(range(1, len(cycles.CLASSES) + 1)), words=5)
    t = cycles.timing("cortex-m4")
    want = sum((i + 1) * t.cost[k] for i, k in enumerate(cycles.CLASSES)) + 5 * t.cost_per_word
    assert t.cycles(c) == want
    assert c.instructions == sum(range(1, len(cycles.CLASSES) + 1))
    assert (c + c - c) == c and c["load"] == 2


def test_parse_marks_gives_per_step_differences_per_function():
    row = lambda f, load, words: f"{f} " + " ".join(str(load if k == "load" else 1) for k in cycles.CLASSES) + f" {words}"
    text = "\n".join(["mark 0 100", row(0, 5, 1), "end",
                      "mark 1 140", row(0, 9, 1), row(1, 20, 4), row(2, 1, 0), "end"])
    marks = cycles.parse_marks(text, ["f", "g"])
    (step,) = cycles.step_counts(marks)
    assert step.instructions == 40
    assert set(step.functions) == {"g", cycles.NO_SYMBOL, "f"}
    assert step.functions["f"].as_dict() == {k: (4 if k == "load" else 0) for k in cycles.CLASSES}
    assert step.functions["g"]["load"] == 20 and step.functions["g"].words == 4
    assert step.total == step.functions["f"] + step.functions["g"] + step.functions[cycles.NO_SYMBOL]


# --- the decoder --------------------------------------------------------------------------------
# (instruction, class, words); class "cond" = a conditional branch (decided at run time)
ENCODINGS = [
    ("ldr r0, [r1]", "load", 0), ("ldr.w r0, [r1, #400]", "load", 0), ("ldrb r0, [r1, r2]", "load", 0),
    ("ldrsh.w r0, [r1, #-2]", "load", 0), ("ldr r0, [pc, #8]", "load", 0), ("ldr.w r0, [r1], #4", "load", 0),
    ("ldrex r0, [r1]", "load", 0), ("ldrsb r0, [r1, r2]", "load", 0), ("ldrh r0, [r1, #2]", "load", 0),
    ("str r0, [r1]", "store", 0), ("strb.w r0, [r1, #1000]", "store", 0), ("strh r0, [r1, r2]", "store", 0),
    ("str r0, [sp, #4]", "store", 0), ("str.w r0, [r1, #-4]!", "store", 0), ("strex r0, r1, [r2]", "store", 0),
    ("ldm r0!, {r1, r2, r3}", "load_multiple", 3), ("ldmia.w r0, {r1, r2, r3, r4, r5}", "load_multiple", 5),
    ("pop {r4, r5}", "load_multiple", 2), ("ldrd r0, r1, [r2, #8]", "load_multiple", 2),
    ("stmia r0!, {r1, r2}", "store_multiple", 2), ("push {r4, r5, r6, lr}", "store_multiple", 4),
    ("strd r0, r1, [r2]", "store_multiple", 2), ("stmdb sp!, {r4-r11}", "store_multiple", 8),
    ("muls r0, r1, r0", "mul", 0), ("mul r0, r1, r2", "mul", 0),
    ("mla r0, r1, r2, r3", "mac", 0), ("mls r0, r1, r2, r3", "mac", 0), ("smull r0, r1, r2, r3", "mac", 0),
    ("umull r0, r1, r2, r3", "mac", 0), ("smlal r0, r1, r2, r3", "mac", 0), ("umlal r0, r1, r2, r3", "mac", 0),
    ("smulbb r0, r1, r2", "mac", 0), ("smlabb r0, r1, r2, r3", "mac", 0), ("smmul r0, r1, r2", "mac", 0),
    ("smlawb r0, r1, r2, r3", "mac", 0),
    ("smlad r0, r1, r2, r3", "simd", 0), ("smuad r0, r1, r2", "simd", 0), ("smlsd r0, r1, r2, r3", "simd", 0),
    ("smlald r0, r1, r2, r3", "simd", 0), ("sxtb16 r0, r1", "simd", 0), ("uxtab16 r0, r1, r2", "simd", 0),
    ("ssat r0, #8, r1", "simd", 0), ("usat r0, #8, r1", "simd", 0), ("ssat16 r0, #8, r1", "simd", 0),
    ("qadd r0, r1, r2", "simd", 0), ("qsub r0, r1, r2", "simd", 0), ("qadd8 r0, r1, r2", "simd", 0),
    ("sadd16 r0, r1, r2", "simd", 0), ("uhsub8 r0, r1, r2", "simd", 0), ("sel r0, r1, r2", "simd", 0),
    ("pkhbt r0, r1, r2, lsl #16", "simd", 0), ("usada8 r0, r1, r2, r3", "simd", 0),
    ("sdiv r0, r1, r2", "div", 0), ("udiv r0, r1, r2", "div", 0),
    ("b.n .+20", "branch_taken", 0), ("b.w .+2000", "branch_taken", 0), ("bl .+2000", "branch_taken", 0),
    ("bx lr", "branch_taken", 0), ("blx r3", "branch_taken", 0), ("pop {r4, pc}", "branch_taken", 2),
    ("ldmia.w sp!, {r4, r5, pc}", "branch_taken", 3), ("ldr pc, [sp], #4", "branch_taken", 0),
    ("mov pc, r0", "branch_taken", 0), ("tbb [r0, r1]", "branch_taken", 0),
    ("tbh [r0, r1, lsl #1]", "branch_taken", 0),
    ("beq.n .+20", "cond", 0), ("bne.w .+2000", "cond", 0), ("cbz r0, .+20", "cond", 0),
    ("cbnz r1, .+20", "cond", 0),
    ("vadd.f32 s0, s1, s2", "fp", 0), ("vsub.f32 s0, s1, s2", "fp", 0), ("vmul.f32 s0, s1, s2", "fp", 0),
    ("vnmul.f32 s0, s1, s2", "fp", 0), ("vneg.f32 s0, s1", "fp", 0), ("vabs.f32 s0, s1", "fp", 0),
    ("vcmp.f32 s0, s1", "fp", 0), ("vcmpe.f32 s0, #0", "fp", 0), ("vcvt.s32.f32 s0, s1", "fp", 0),
    ("vcvt.f32.s32 s0, s1", "fp", 0), ("vmov s0, r1", "fp", 0), ("vmov r0, s1", "fp", 0),
    ("vmov.f32 s0, s1", "fp", 0), ("vmov.f32 s0, #1.0", "fp", 0), ("vmrs APSR_nzcv, fpscr", "fp", 0),
    ("vmov r0, r1, d0", "fp", 0),
    ("vmla.f32 s0, s1, s2", "fp_mac", 0), ("vmls.f32 s0, s1, s2", "fp_mac", 0),
    ("vnmla.f32 s0, s1, s2", "fp_mac", 0), ("vfma.f32 s0, s1, s2", "fp_mac", 0),
    ("vfms.f32 s0, s1, s2", "fp_mac", 0), ("vfnma.f32 s0, s1, s2", "fp_mac", 0),
    ("vdiv.f32 s0, s1, s2", "fp_div", 0), ("vsqrt.f32 s0, s1", "fp_div", 0),
    ("vldr s0, [r0, #8]", "fp_load", 1), ("vldr d0, [r0]", "fp_load", 2), ("vldmia r0!, {s0-s3}", "fp_load", 4),
    ("vldmia r0, {d0-d1}", "fp_load", 4), ("vpop {s16-s17}", "fp_load", 2),
    ("vstr s0, [r0, #8]", "fp_store", 1), ("vstmia r0!, {s0-s2}", "fp_store", 3), ("vpush {s16-s19}", "fp_store", 4),
    ("add r0, r1, r2", "other", 0), ("adds r0, #1", "other", 0), ("add.w r0, r1, r2, lsl #2", "other", 0),
    ("sub r0, r1, #4095", "other", 0), ("movw r0, #1234", "other", 0), ("movt r0, #1234", "other", 0),
    ("cmp r0, r1", "other", 0), ("lsls r0, r1, #3", "other", 0), ("lsl.w r0, r1, r2", "other", 0),
    ("sxtb r0, r1", "other", 0), ("uxth r0, r1", "other", 0), ("sxtab r0, r1, r2", "other", 0),
    ("rev r0, r1", "other", 0), ("clz r0, r1", "other", 0), ("ubfx r0, r1, #2, #3", "other", 0),
    ("bfi r0, r1, #2, #3", "other", 0), ("it eq", "other", 0), ("nop", "other", 0), ("isb", "other", 0),
    ("add r0, sp, #8", "other", 0), ("pld [r0]", "other", 0), ("mrs r0, primask", "other", 0),
    ("mov r0, r1", "other", 0), ("add r0, r1", "other", 0), ("cmp r8, r9", "other", 0),
    ("and.w r0, r1, #255", "other", 0), ("orr r0, r1, r2, lsr #3", "other", 0),
]


def assemble(lines: list[str], tmp_path) -> list[bytes]:
    """The encoding of each line (arm-none-eabi-as, then objdump's listing, in order)."""
    src = tmp_path / "enc.s"
    src.write_text(".syntax unified\n.thumb\n" + "\n".join(lines) + "\n")
    obj = tmp_path / "enc.o"
    subprocess.run(["arm-none-eabi-as", "-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", str(src), "-o", str(obj)],
                   check=True, capture_output=True)
    dump = subprocess.run(["arm-none-eabi-objdump", "-d", str(obj)], check=True, capture_output=True, text=True).stdout
    out = []
    for m in re.finditer(r"^\s*[0-9a-f]+:\s+([0-9a-f]{4})(?: ([0-9a-f]{4}))?\s", dump, re.M):
        hws = [int(h, 16) for h in m.groups() if h]
        out.append(b"".join(h.to_bytes(2, "little") for h in hws))
    return out


def decode(lib, encoding: bytes, in_it: bool = False) -> tuple[str, int]:
    words, cond = ctypes.c_int(), ctypes.c_int()
    cls = lib.et_decode(encoding, len(encoding), int(in_it), ctypes.byref(words), ctypes.byref(cond))
    return ("cond" if cond.value else cycles.CLASSES[cls]), words.value


@pytest.fixture(scope="module")
def plugin_lib():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no host C compiler")
    return ctypes.CDLL(str(qemu_run.plugin_path()))


def test_a_16bit_instruction_given_with_the_next_halfword_decodes_as_itself(plugin_lib):
    """QEMU can hand the plugin 4 bytes for a 16-bit instruction (its translator read the next
    halfword ahead): `cmp fp, r5` (45ab) with the first half of `sxtb16 ..., ror #8` (fa2f)
    was decoded as a 32-bit coprocessor store of 0x2f words."""
    cmp_and_next = bytes([0xAB, 0x45, 0x2F, 0xFA])
    assert plugin_lib.et_insn_size(cmp_and_next, 4) == 2
    assert decode(plugin_lib, cmp_and_next) == ("other", 0)
    ldr_w = bytes([0x56, 0xF8, 0x04, 0xCF])  # ldr.w ip, [r6, #4]!: a 32-bit instruction stays one
    assert plugin_lib.et_insn_size(ldr_w, 4) == 4
    assert decode(plugin_lib, ldr_w) == ("load", 0)


@pytest.mark.skipif(shutil.which("arm-none-eabi-as") is None or shutil.which("arm-none-eabi-objdump") is None,
                    reason="no ARM binutils")
def test_decoder_classifies_known_encodings(plugin_lib, tmp_path):
    encodings = assemble([line for line, _, _ in ENCODINGS], tmp_path)
    assert len(encodings) == len(ENCODINGS)
    got = [(line, *decode(plugin_lib, enc)) for (line, _, _), enc in zip(ENCODINGS, encodings)]
    assert got == ENCODINGS
    # in an IT block a branch (even one that is unconditional outside) is conditional; other
    # instructions keep their class
    for line in ("bx lr", "pop {r4, pc}", "b.n .+20"):
        assert decode(plugin_lib, assemble([line], tmp_path)[0], in_it=True)[0] == "cond"
    assert decode(plugin_lib, assemble(["ldr r0, [r1]"], tmp_path)[0], in_it=True) == ("load", 0)


# --- kernels under QEMU -------------------------------------------------------------------------
N = 11  # odd: the even/odd branch in mix is taken 5 times, not taken 6
KERNELS = r"""
__asm__(
"    .syntax unified\n"
"    .thumb\n"
"    .text\n"
/* loads_n(p, n): n loads */
"    .global loads_n\n    .type loads_n, %function\n    .align 2\n    .thumb_func\n"
"loads_n:\n"
"1:  ldr r2, [r0], #4\n"
"    subs r1, r1, #1\n"
"    bne 1b\n"
"    bx lr\n"
"    .size loads_n, .-loads_n\n"
/* smlad_n(n): n SMLADs */
"    .global smlad_n\n    .type smlad_n, %function\n    .align 2\n    .thumb_func\n"
"smlad_n:\n"
"    movs r2, #0\n"
"1:  smlad r2, r2, r2, r2\n"
"    subs r0, r0, #1\n"
"    bne 1b\n"
"    mov r0, r2\n"
"    bx lr\n"
"    .size smlad_n, .-smlad_n\n"
/* sdiv_n(n): n SDIVs */
"    .global sdiv_n\n    .type sdiv_n, %function\n    .align 2\n    .thumb_func\n"
"sdiv_n:\n"
"    movs r2, #100\n"
"    movs r3, #7\n"
"1:  sdiv r1, r2, r3\n"
"    subs r0, r0, #1\n"
"    bne 1b\n"
"    bx lr\n"
"    .size sdiv_n, .-sdiv_n\n"
/* mix(n, buf): one instruction of every class per iteration; an even/odd branch taken half the time */
"    .global mix\n    .type mix, %function\n    .align 2\n    .thumb_func\n"
"mix:\n"
"    push {r4, r5, lr}\n"
"1:  ldrd r2, r3, [r1]\n"
"    strd r2, r3, [r1, #8]\n"
"    mul r4, r2, r3\n"
"    smull r4, r5, r2, r3\n"
"    ssat r4, #8, r2\n"
"    vldr s0, [r1]\n"
"    vmla.f32 s1, s0, s0\n"
"    vsqrt.f32 s2, s0\n"
"    vadd.f32 s3, s0, s1\n"
"    vstr s3, [r1, #16]\n"
"    cbz r0, 2f\n"
"    nop\n"
"2:  tst r0, #1\n"
"    beq 3f\n"
"    nop\n"
"3:  cmp r0, #1\n"
"    it eq\n"
"    moveq r4, #0\n"
"    subs r0, r0, #1\n"
"    bne 1b\n"
"    pop {r4, r5, pc}\n"
"    .size mix, .-mix\n"
);
"""

MAIN = r"""
int loads_n(const int *p, int n);
int smlad_n(int n);
int sdiv_n(int n);
void mix(int n, int *buf);

static int buf[256];

__attribute__((noinline, used)) void et_icount_mark(int i)
{
    __asm__ volatile("" : : "r"(i) : "memory");
}

int main(void)
{
    et_icount_mark(0); loads_n(buf, %(n)d); et_icount_mark(1);
    et_icount_mark(2); smlad_n(%(n)d); et_icount_mark(3);
    et_icount_mark(4); sdiv_n(%(n)d); et_icount_mark(5);
    et_icount_mark(6); mix(%(n)d, buf); et_icount_mark(7);
    return 0;
}
"""


def hand_counts(n: int) -> dict[str, tuple[dict[str, int], int]]:
    """{kernel: ({class: count}, words)} counted by hand from KERNELS for n iterations."""
    loop_branch = {"branch_taken": n - 1 + 1, "branch_not_taken": 1}  # bne n-1 times taken, then bx / pop
    even = n // 2  # beq taken when r0 is even (r0 = n, ..., 1)
    return {
        "loads_n": ({"load": n, "other": n, **loop_branch}, 0),
        "smlad_n": ({"simd": n, "other": 2 + n, **loop_branch}, 0),
        "sdiv_n": ({"div": n, "other": 2 + n, **loop_branch}, 0),
        "mix": ({"store_multiple": 1 + n, "load_multiple": n, "mul": n, "mac": n, "simd": n, "fp_load": n,
                 "fp_mac": n, "fp_div": n, "fp": n, "fp_store": n,
                 # cbz never taken: its nop runs; tst; beq's nop when odd; cmp, it, moveq, subs
                 "other": n + n + (n - even) + 4 * n,
                 "branch_taken": (n - 1) + even + 1, "branch_not_taken": 1 + n + (n - even)},
                # push 3, ldrd 2 + strd 2 + vldr 1 + vstr 1 per iteration, pop 3
                3 + 6 * n + 3),
    }


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory):
    if cortexm.missing_tools() or (shutil.which("cc") is None and shutil.which("gcc") is None):
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'cc'}")
    runs = {}
    for target in sorted(cortexm.TARGETS):
        d = tmp_path_factory.mktemp(target)
        files = cortexm.firmware_files(target, (np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32)))
        files["main.c"] = MAIN % {"n": N}
        files["model.c"] = KERNELS
        for name, text in files.items():
            (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
        cortexm.build(d)
        run = cortexm.run_qemu(d, target, icount=True)
        assert run.exit_code == 0, run.lines
        runs[target] = run
        runs[target, "elf"] = d / "firmware.elf"
    return runs


@pytest.mark.parametrize("target", sorted(FIRMWARE_TARGETS))
def test_kernel_counts_equal_the_hand_count(kernel_run, target):
    run = kernel_run[target]
    steps = dict(zip(("loads_n", "smlad_n", "sdiv_n", "mix"), run.counts_per_step))
    assert len(run.counts_per_step) == 4
    for kernel, (by_class, words) in hand_counts(N).items():
        got = steps[kernel].functions[kernel]
        assert got.as_dict() == {k: by_class.get(k, 0) for k in cycles.CLASSES}, kernel
        assert got.words == words, kernel
    # the classes add up to the plugin's plain instruction count, step by step
    for s in run.counts_per_step:
        assert s.total.instructions == s.instructions
    assert run.instructions_per_step == tuple(s.instructions for s in run.counts_per_step)
    assert run.cycles_per_step == tuple(cycles.timing(target).cycles(s.total) for s in run.counts_per_step)
    size = cortexm.firmware_size(kernel_run[target, "elf"], run)
    assert size.cycles_per_step == round(sum(run.cycles_per_step) / len(run.cycles_per_step))
    assert "cycles" in size.describe()


def test_kernel_cycles_equal_the_table_applied_by_hand(kernel_run):
    n = N
    funcs = lambda target, i, name: kernel_run[target].counts_per_step[i].functions[name]
    m4, m7 = cycles.timing("cortex-m4"), cycles.timing("cortex-m7")
    # M4: load 2, other 1, taken branch 3, not taken 1, SMLAD 1, SDIV 7
    assert m4.cycles(funcs("cortex-m4", 0, "loads_n")) == 2 * n + n + 3 * n + 1
    assert m4.cycles(funcs("cortex-m4", 1, "smlad_n")) == n + (2 + n) + 3 * n + 1
    assert m4.cycles(funcs("cortex-m4", 2, "sdiv_n")) == 7 * n + (2 + n) + 3 * n + 1
    # M7: load 1, taken branch 2
    assert m7.cycles(funcs("cortex-m7", 0, "loads_n")) == n + n + 2 * n + 1
    # mix on the M4: push 1 + 3; per iteration LDRD 1 + 2, STRD 1 + 2, MUL 1, SMULL 1, SSAT 1,
    # VLDR 1 + 1, VMLA 3, VSQRT 14, VADD 1, VSTR 1 + 1, 6 others 1 (and the nop after beq when
    # r0 is odd), cbz not taken 1, beq taken (r0 even) 3 / not taken (odd) 1; bne 3 (n - 1
    # times) and 1; pop {pc} 3 + 3
    even = n // 2
    want = (1 + 3) + n * (3 + 3 + 1 + 1 + 1 + 2 + 3 + 14 + 1 + 2) + (2 * n + (n - even) + 4 * n) + n \
        + 3 * even + (n - even) + 3 * (n - 1) + 1 + (3 + 3)
    assert m4.cycles(funcs("cortex-m4", 3, "mix")) == want
