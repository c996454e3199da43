/* RISC-V startup for edgetrain training firmware (crt0.S sets sp, gp, mtvec and the FPU and
 * jumps here): copy .data, zero .bss, paint the stack, run main and exit through the board
 * (board.c); the trap handler; a bounded heap for the C library and the stack high-water mark.
 * The symbols come from link.ld. The same contract as the Cortex-M startup.c (cortexm.h). */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "cortexm.h"
#include "board.h"

extern uint32_t _sidata[], _sdata[], _edata[], _sbss[], _ebss[];
extern uint8_t __heap_start[], __heap_end[];
extern uint32_t __stack_bottom[], __stack_top[];

int main(void);

/* Painted into the unused stack at reset; the lowest word that no longer holds it marks the
 * deepest the stack has grown. The bottom word is a guard: overwritten = stack overflow. */
#define STACK_PAINT 0xC5AC5AC5u
#define STACK_GUARD 0x5AFE57ACu
/* Words below the reset handler's own frame left unpainted (the painting loop runs there). */
#define PAINT_MARGIN_WORDS 16u

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
    volatile uint32_t *limit = (volatile uint32_t *)(sp - PAINT_MARGIN_WORDS * sizeof(uint32_t));
    for (volatile uint32_t *p = __stack_bottom; p < limit; ++p)
        *p = STACK_PAINT;
    __stack_bottom[0] = STACK_GUARD;

    et_board_exit(main());
}

uint32_t et_stack_high_water(void)
{
    const uint32_t *p = __stack_bottom + 1;
    while (p < __stack_top && *p == STACK_PAINT)
        ++p;
    return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)p);
}

uint32_t et_stack_reserve(void)
{
    return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)__stack_bottom);
}

int et_stack_guard_ok(void)
{
    return __stack_bottom[0] == STACK_GUARD;
}

/* The C library's heap stays inside the heap reserve of link.ld, so that the SRAM the size
 * report counts is all the firmware can use (picolibc's malloc calls sbrk). */
void *sbrk(ptrdiff_t incr)
{
    static uint8_t *brk = __heap_start;
    if (incr < 0 || incr > __heap_end - brk) {
        errno = ENOMEM;
        return (void *)-1;
    }
    uint8_t *prev = brk;
    brk += incr;
    return prev;
}
