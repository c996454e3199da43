/* Cortex-M startup for edgetrain training firmware: vector table, reset handler (copy .data,
 * zero .bss, enable the FPU, paint the stack), a bounded heap for the C library and the stack
 * high-water mark. The symbols come from link.ld. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "cortexm.h"
#include "board.h"
#include "et_stack.h"

extern uint32_t _sidata[], _sdata[], _edata[], _sbss[], _ebss[];

int main(void);

/* CPACR (Coprocessor Access Control Register): full access to CP10 and CP11 (the FPU). */
#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)
#define CPACR_CP10_CP11_FULL (0xFu << 20)

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
    et_stack_paint(sp);

    et_board_exit(main());
}

/* the C library's heap hook (newlib: _sbrk): bounded by link.ld's heap reserve (et_stack.h) */
void *_sbrk(ptrdiff_t incr)
{
    return et_heap_grow(incr);
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
