/* What startup.c gives main.c. */
#ifndef ET_CORTEXM_H
#define ET_CORTEXM_H

#include <stdint.h>

/* Exit statuses of the firmware (its last line, `edgetrain: exit <status>`: board.c). */
#define ET_EXIT_OK 0
#define ET_EXIT_ARENA_GUARD 2   /* et_check_guards() failed: a kernel wrote outside its tensor */
#define ET_EXIT_STACK_GUARD 3   /* the stack grew past its reserve */
#define ET_EXIT_FAULT 4         /* a fault exception (a semihosting call, bkpt 0xab, is one) */

uint32_t et_stack_high_water(void); /* deepest stack use so far, bytes */
uint32_t et_stack_reserve(void);    /* the stack reserve of link.ld, bytes */
int et_stack_guard_ok(void);        /* 1 while the stack has stayed inside its reserve */

#endif
