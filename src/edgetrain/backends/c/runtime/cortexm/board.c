/* Console output on the MPS2 board's UART0 and exit through its watchdog (board.h).
 * Register maps: Arm CMSDK Technical Reference Manual (DDI0479C), APB UART and APB watchdog;
 * both MPS2 images QEMU models (AN386: Cortex-M4, AN500: Cortex-M7) put them at these addresses
 * and wire the watchdog's interrupt to the NMI. */
#include "board.h"

#include <errno.h>
#include <stdint.h>

#include "cortexm.h"

#define REG(addr) (*(volatile uint32_t *)(addr))

/* A board whose UART0 and watchdog sit elsewhere names them with -D (its target's defines):
 * the MPS3 AN547 (Cortex-M55) has them at 0x59303000 and 0x5802E000 (secure aliases). */
#ifndef UART0_BASE
#define UART0_BASE 0x40004000u
#endif
#define UART_DATA (UART0_BASE + 0x00u)
#define UART_STATE (UART0_BASE + 0x04u)
#define UART_CTRL (UART0_BASE + 0x08u)
#define UART_BAUDDIV (UART0_BASE + 0x10u)
#define UART_STATE_TX_FULL 0x1u
#define UART_CTRL_TX_EN 0x1u
/* The smallest divider the UART accepts (its manual: BAUDDIV >= 16); QEMU ignores the rate. */
#define UART_MIN_BAUDDIV 16u

#ifndef WDOG_BASE
#define WDOG_BASE 0x40008000u
#endif
#define WDOG_LOAD (WDOG_BASE + 0x000u)
#define WDOG_CONTROL (WDOG_BASE + 0x008u)
#define WDOG_LOCK (WDOG_BASE + 0xC00u)
#define WDOG_UNLOCK_KEY 0x1ACCE551u
#define WDOG_CONTROL_INTEN_RESEN 0x3u /* interrupt on the first time-out, reset on the second */
/* The shortest count: the watchdog fires a tick after it is armed. */
#define WDOG_SHORTEST_LOAD 1u

static int uart_ready;
static volatile int exiting;

void et_console_write(const char *buf, size_t len)
{
    if (!uart_ready) {
        REG(UART_BAUDDIV) = UART_MIN_BAUDDIV;
        REG(UART_CTRL) = UART_CTRL_TX_EN;
        uart_ready = 1;
    }
    for (size_t i = 0; i < len; ++i) {
        while (REG(UART_STATE) & UART_STATE_TX_FULL) {
        }
        REG(UART_DATA) = (uint8_t)buf[i];
    }
}

void et_console_puts(const char *s)
{
    size_t len = 0;
    while (s[len] != '\0')
        ++len;
    et_console_write(s, len);
}

/* newlib's output (printf, puts) goes to the UART as well; other descriptors do not exist. */
int _write(int fd, const char *buf, int len)
{
    if (fd != 1 && fd != 2) {
        errno = EBADF;
        return -1;
    }
    et_console_write(buf, (size_t)len);
    return len;
}

__attribute__((noreturn)) static void wait_forever(void)
{
    for (;;)
        __asm__ volatile("wfi");
}

void et_board_exit(int status)
{
    if (exiting)
        wait_forever(); /* a fault while exiting: the watchdog is armed already */
    exiting = 1;
    /* "edgetrain: exit <status>\n" without the C library (a fault may have left it unusable) */
    char line[32] = "edgetrain: exit ";
    size_t n = sizeof "edgetrain: exit " - 1u;
    unsigned long magnitude = status < 0 ? 0ul - (unsigned long)status : (unsigned long)status;
    char digits[12];
    size_t k = 0;
    do {
        digits[k++] = (char)('0' + magnitude % 10u);
        magnitude /= 10u;
    } while (magnitude != 0u);
    if (status < 0)
        line[n++] = '-';
    while (k > 0)
        line[n++] = digits[--k];
    line[n++] = '\n';
    et_console_write(line, n);
    while (REG(UART_STATE) & UART_STATE_TX_FULL) {
    } /* the last byte handed to the host before the emulation ends */
    REG(WDOG_LOCK) = WDOG_UNLOCK_KEY;
    REG(WDOG_LOAD) = WDOG_SHORTEST_LOAD;
    REG(WDOG_CONTROL) = WDOG_CONTROL_INTEN_RESEN;
    wait_forever();
}

void et_board_nmi_handler(void)
{
    if (exiting)
        wait_forever(); /* the watchdog's first time-out: its reset (the end) follows */
    et_console_puts("edgetrain: unexpected NMI\n");
    et_board_exit(ET_EXIT_FAULT);
}
