/* RISC-V entry of edgetrain training firmware (QEMU virt, machine mode, no OpenSBI: -bios none).
 * QEMU's reset vector jumps here (the ELF's entry, the start of DRAM) with a0 = hart id. Only
 * hart 0 runs the firmware; the stack pointer and the global pointer come from link.ld, traps go
 * to et_trap_entry, the FPU (where the target has one: __riscv_flen) and the vector unit (where
 * it has one: __riscv_vector) are switched on, then the C reset handler (startup.c) copies .data,
 * zeroes .bss, paints the stack and calls main. */
/* the CSR instructions (Zicsr) are part of every core this runs on; gcc 12's -march=rv32imc
 * leaves them out and a "_zicsr" suffix would miss the rv32 multilibs, so they are named here */
    .option arch, +zicsr
    .section .text.init, "ax", @progbits
    .globl _start
_start:
    csrr t0, mhartid
    bnez t0, .Lpark
.option push
.option norelax
    la gp, __global_pointer$
.option pop
    la sp, __stack_top
    la tp, __tls_base         /* the C library's thread-local errno (local-exec) */
    la t0, et_trap_entry
    csrw mtvec, t0
#ifdef __riscv_flen
    li t0, (1 << 13)          /* mstatus.FS = Initial: F instructions allowed */
    csrs mstatus, t0
    csrwi fcsr, 0             /* round to nearest, no flags */
#endif
#ifdef __riscv_vector
    li t0, (1 << 9)           /* mstatus.VS = Initial: vector instructions allowed */
    csrs mstatus, t0
#endif
    j Reset_Handler
.Lpark:
    wfi
    j .Lpark

/* A trap (an illegal instruction, a misaligned or faulting access, an ecall) ends the firmware:
 * the C handler prints the cause and exits with ET_EXIT_FAULT. Interrupts stay disabled, so
 * nothing else arrives here; mtvec's direct mode needs a 4-byte aligned entry. */
    .balign 4
    .globl et_trap_entry
et_trap_entry:
    j et_trap_handler
