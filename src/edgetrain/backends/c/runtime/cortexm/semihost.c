/* Arm semihosting calls: `bkpt 0xab` with the operation in r0 and its argument in r1. */
#include "semihost.h"

#include <stdint.h>

#define SYS_OPEN 0x01u
#define SYS_WRITE 0x05u
#define SYS_EXIT 0x18u
#define SYS_EXIT_EXTENDED 0x20u
#define ADP_STOPPED_APPLICATION_EXIT 0x20026u

static uintptr_t semihost_call(uintptr_t op, const void *arg)
{
    register uintptr_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

/* SYS_OPEN mode 4 ("w") of the special file ":tt": the host's standard output. (SYS_WRITE0
 * would go to QEMU's semihosting console, which is its stderr.) */
#define OPEN_MODE_W 4u
static uintptr_t console = (uintptr_t)-1;

void et_semihost_puts(const char *s)
{
    static const char tt[] = ":tt";
    if (console == (uintptr_t)-1) {
        const uintptr_t open_args[3] = {(uintptr_t)tt, OPEN_MODE_W, sizeof tt - 1u};
        console = semihost_call(SYS_OPEN, open_args);
    }
    uintptr_t len = 0;
    while (s[len] != '\0')
        ++len;
    const uintptr_t write_args[3] = {console, (uintptr_t)s, len};
    semihost_call(SYS_WRITE, write_args);
}

void et_semihost_exit(int status)
{
    if (status == 0) {
        /* AArch32 SYS_EXIT takes the reason code itself (not a parameter block). */
        semihost_call(SYS_EXIT, (const void *)(uintptr_t)ADP_STOPPED_APPLICATION_EXIT);
    } else {
        const uintptr_t block[2] = {ADP_STOPPED_APPLICATION_EXIT, (uintptr_t)status};
        semihost_call(SYS_EXIT_EXTENDED, block);
    }
    for (;;) {
        /* a debugger without semihosting: stop here */
    }
}
