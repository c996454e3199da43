/* RISC-V startup for edgetrain training firmware (crt0.S sets sp, gp, mtvec and the FPU and
 * jumps here): copy .data, zero .bss, paint the stack, run main and exit through the board
 * (board.c); the trap handler; a bounded heap for the C library and the stack high-water mark.
 * The symbols come from link.ld. The same contract as the Cortex-M startup.c (cortexm.h). */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "cortexm.h"
#include "board.h"
#include "et_stack.h"

extern uint32_t _sidata[], _sdata[], _edata[], _sbss[], _ebss[];

int main(void);

static void put_hex(char *out, uint32_t v)
{
    for (int i = 7; i >= 0; --i, v >>= 4)
        out[i] = "0123456789abcdef"[v & 15u];
}

/* crt0.S's et_trap_entry jumps here: report mcause and mepc, exit with ET_EXIT_FAULT */
__attribute__((noreturn, used)) void et_trap_handler(void)
{
    uint32_t cause, epc;
    /* Zicsr named here: gcc 12's -march=rv32imc leaves it out (crt0.S) */
    __asm__ volatile(".option push\n.option arch, +zicsr\ncsrr %0, mcause\n.option pop" : "=r"(cause));
    __asm__ volatile(".option push\n.option arch, +zicsr\ncsrr %0, mepc\n.option pop" : "=r"(epc));
    char line[] = "edgetrain: unexpected trap mcause 0x........ mepc 0x........\n";
    put_hex(line + sizeof "edgetrain: unexpected trap mcause 0x" - 1, cause);
    put_hex(line + sizeof "edgetrain: unexpected trap mcause 0x........ mepc 0x" - 1, epc);
    et_console_puts(line);
    et_board_exit(ET_EXIT_FAULT);
}

__attribute__((noreturn)) void Reset_Handler(void)
{
    uint32_t *src = _sidata;
    for (uint32_t *dst = _sdata; dst < _edata; ++dst)
        *dst = *src++;
    for (uint32_t *dst = _sbss; dst < _ebss; ++dst)
        *dst = 0u;

    uintptr_t sp;
    __asm__ volatile("mv %0, sp" : "=r"(sp));
    et_stack_paint(sp);

    et_board_exit(main());
}

/* the C library's heap hook (picolibc: sbrk): bounded by link.ld's heap reserve (et_stack.h) */
void *sbrk(ptrdiff_t incr)
{
    return et_heap_grow(incr);
}
