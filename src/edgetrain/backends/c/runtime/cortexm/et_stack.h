/* The stack and heap accounting every edgetrain firmware shares (Cortex-M and RISC-V startup.c
 * include it once): the stack painted at reset, its high-water mark and guard word, and a
 * bounded heap for the C library. The symbols come from link.ld. */
#ifndef ET_STACK_H
#define ET_STACK_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

extern uint8_t __heap_start[], __heap_end[];
extern uint32_t __stack_bottom[], __stack_top[];

/* Painted into the unused stack at reset; the lowest word that no longer holds it marks the
 * deepest the stack has grown. The bottom word is a guard: overwritten = stack overflow. */
#define STACK_PAINT 0xC5AC5AC5u
#define STACK_GUARD 0x5AFE57ACu
/* Words below the reset handler's own frame left unpainted (the painting loop runs there). */
#define PAINT_MARGIN_WORDS 16u

/* Paint the stack from its bottom up to PAINT_MARGIN_WORDS below `sp` (the caller's stack
 * pointer) and set the guard word. */
static inline void et_stack_paint(uintptr_t sp)
{
    volatile uint32_t *limit = (volatile uint32_t *)(sp - PAINT_MARGIN_WORDS * sizeof(uint32_t));
    for (volatile uint32_t *p = __stack_bottom; p < limit; ++p)
        *p = STACK_PAINT;
    __stack_bottom[0] = STACK_GUARD;
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
 * report counts is all the firmware can use: the body of its sbrk (newlib: _sbrk). */
static void *et_heap_grow(ptrdiff_t incr)
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

#endif
