/* Console output on QEMU virt's UART0 and exit through its test device (board.h).
 * UART0: an NS16550A at 0x10000000 (transmit holding register at +0, line status at +5, bit 5:
 * transmitter holding register empty); the test device ("sifive_test", the finisher) at
 * 0x100000: writing 0x5555 ends the emulation with status 0, (code << 16) | 0x3333 with `code`. */
#include "board.h"

#include <stdint.h>

#include "cortexm.h"

#define UART0_BASE 0x10000000u
#define UART_THR (*(volatile uint8_t *)(UART0_BASE + 0u))
#define UART_LSR (*(volatile uint8_t *)(UART0_BASE + 5u))
#define UART_LSR_THRE 0x20u

#define TEST_BASE 0x100000u
#define TEST_REG (*(volatile uint32_t *)TEST_BASE)
#define TEST_PASS 0x5555u
#define TEST_FAIL 0x3333u

static volatile int exiting;

void et_console_write(const char *buf, size_t len)
{
    for (size_t i = 0; i < len; ++i) {
        while (!(UART_LSR & UART_LSR_THRE)) {
        }
        UART_THR = (uint8_t)buf[i];
    }
}

void et_console_puts(const char *s)
{
    size_t len = 0;
    while (s[len] != '\0')
        ++len;
    et_console_write(s, len);
}

__attribute__((noreturn)) static void wait_forever(void)
{
    for (;;)
        __asm__ volatile("wfi");
}

void et_board_exit(int status)
{
    if (exiting)
        wait_forever(); /* a trap while exiting */
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
    while (!(UART_LSR & UART_LSR_THRE)) {
    } /* the last byte handed to the host before the emulation ends */
    TEST_REG = status == 0 ? TEST_PASS : (((uint32_t)status & 0xFFFFu) << 16) | TEST_FAIL;
    wait_forever();
}
