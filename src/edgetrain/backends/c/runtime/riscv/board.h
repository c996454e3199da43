/* QEMU virt's devices a training firmware uses instead of semihosting: console output on UART0
 * (an NS16550A; QEMU's `-serial stdio`) and an exit through the test device (the "finisher",
 * which ends the emulation). No host file, no host command: what the firmware can reach is its
 * own memory and these two devices. The same interface as the Cortex-M board.h. */
#ifndef ET_BOARD_H
#define ET_BOARD_H

#include <stddef.h>

/* Writes `len` bytes / a NUL-terminated string to UART0. */
void et_console_write(const char *buf, size_t len);
void et_console_puts(const char *s);
/* Prints the line `edgetrain: exit <status>` (the host runner turns it into the run's exit
 * status), then ends the emulation through the test device. Never returns. */
void et_board_exit(int status) __attribute__((noreturn));

#endif
