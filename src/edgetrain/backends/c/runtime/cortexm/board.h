/* The MPS2 board's devices a training firmware uses instead of semihosting: console output on
 * UART0 (a CMSDK APB UART; QEMU's `-serial stdio`) and an exit through the CMSDK APB watchdog
 * (QEMU's `-watchdog-action poweroff` ends the emulation when it fires). No host file, no host
 * command: what the firmware can reach is its own memory and these two devices. */
#ifndef ET_BOARD_H
#define ET_BOARD_H

#include <stddef.h>

/* Writes `len` bytes / a NUL-terminated string to UART0. */
void et_console_write(const char *buf, size_t len);
void et_console_puts(const char *s);
/* Prints the line `edgetrain: exit <status>` (the host runner turns it into the run's exit
 * status), then lets the watchdog end the emulation. Never returns. */
void et_board_exit(int status) __attribute__((noreturn));
/* The NMI handler: the watchdog's first time-out raises an NMI on the way to its reset. */
void et_board_nmi_handler(void);

#endif
