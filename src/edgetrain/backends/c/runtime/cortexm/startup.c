/* Cortex-M startup for edgetrain training firmware: vector table, reset handler (copy .data,
 * zero .bss, enable the FPU, paint the stack), a bounded heap for the C library and the stack
 * high-water mark. The symbols come from link.ld. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "cortexm.h"
#include "board.h"

extern uint32_t _sidata[], _sdata[], _edata[], _sbss[], _ebss[];
extern uint8_t __heap_start[], __heap_end[];
extern uint32_t __stack_bottom[], __stack_top[];

int main(void);

/* CPACR (Coprocessor Access Control Register): full access to CP10 and CP11 (the FPU). */
#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)
#define CPACR_CP10_CP11_FULL (0xFu << 20)

/* Painted into the unused stack at reset; the lowest word that no longer holds it marks the
 * deepest the stack has grown. The bottom word is a guard: overwritten = stack overflow. */
#define STACK_PAINT 0xC5AC5AC5u
#define STACK_GUARD 0x5AFE57ACu
/* Words below the reset handler's own frame left unpainted (the painting loop runs there). */
#define PAINT_MARGIN_WORDS 16u

static void default_handler(void)
{
    et_console_puts("edgetrain: unexpected exception\n");
    et_board_exit(ET_EXIT_FAULT);
}

__attribute__((noreturn)) void Reset_Handler(void)
{
    uint32_t *src = _sidata;
    for (uint32_t *dst = _sdata; dst < _edata; ++dst)
        *dst = *src++;
    for (uint32_t *dst = _sbss; dst < _ebss; ++dst)
        *dst = 0u;

    SCB_CPACR |= CPACR_CP10_CP11_FULL;
    __asm__ volatile("dsb\n\tisb" ::: "memory");

    uintptr_t sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
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

/* The C library's heap (printf's number conversion allocates) stays inside the heap reserve
 * of link.ld, so that the SRAM the size report counts is all the firmware can use. */
void *_sbrk(ptrdiff_t incr)
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

/* Cortex-M vector table: initial stack pointer, then the handlers. */
#define ET_NUM_VECTORS 16
__attribute__((section(".isr_vector"), used)) static void (*const vectors[ET_NUM_VECTORS])(void) = {
    (void (*)(void))__stack_top, /* initial SP */
    Reset_Handler,
    et_board_nmi_handler, /* NMI (the watchdog's, on the way out: board.c) */
    default_handler, /* HardFault */
    default_handler, /* MemManage */
    default_handler, /* BusFault */
    default_handler, /* UsageFault */
    0, 0, 0, 0,      /* reserved */
    default_handler, /* SVCall */
    default_handler, /* DebugMonitor */
    0,               /* reserved */
    default_handler, /* PendSV */
    default_handler, /* SysTick */
};
