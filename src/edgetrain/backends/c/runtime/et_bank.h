/* edgetrain C runtime: two weight banks (emit option weight_banks=2). The trained state
 * (trainable weights, the selected part of split weights, optimizer state) lives twice, as
 * bank 0 and bank 1 (model.c's et_bank_t). A training step copies the committed bank into the
 * other one and updates that copy in place; only after the step completed with a finite loss
 * it writes the copy's metadata {step, CRC-32 of the bank and the step} and then commits by
 * one word write of the header (ET_BANK_MAGIC | bank index). A reset in the middle of a step
 * leaves the committed bank, its metadata and the header untouched: et_bank_boot (called by
 * et_init) takes the header's bank when its checksum holds, else the other bank when its
 * checksum holds, else reports a fresh start. Header-only. */
#ifndef ET_BANK_H
#define ET_BANK_H
#include <stddef.h>
#include <stdint.h>

/* the header word: ET_BANK_MAGIC | index of the committed bank (0 or 1) */
#define ET_BANK_MAGIC 0xB7A4C0E0u
/* orders the metadata writes before the header write (on a real MCU: a DMB, or the flash
 * controller's program-complete wait) */
#if defined(__GNUC__) || defined(__clang__)
#define ET_BANK_BARRIER() __asm__ volatile("" ::: "memory")
#else
#define ET_BANK_BARRIER() ((void)0)
#endif

/* where the banks, their metadata and the header live: on a bare-metal Arm or RISC-V target
 * the .noinit section (link.ld: neither the reset handler nor a system reset clears it),
 * elsewhere ordinary static storage */
#ifndef ET_NOINIT
#if (defined(__arm__) || defined(__riscv)) && !defined(__linux__)
#define ET_NOINIT __attribute__((section(".noinit")))
#else
#define ET_NOINIT
#endif
#endif

/* a bank's metadata: the step count it holds (-1: not valid) and its checksum */
typedef struct { int32_t step; uint32_t crc; } et_bank_meta_t;

/* CRC-32 (IEEE 802.3, reflected 0xEDB88320; zlib.crc32's), a nibble table: 64 bytes of flash */
static uint32_t et_crc32(uint32_t crc, const void *data, size_t n) {
    static const uint32_t t[16] = {
        0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u, 0x4DB26158u, 0x5005713Cu,
        0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu, 0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu};
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        crc = (crc >> 4) ^ t[crc & 15u];
        crc = (crc >> 4) ^ t[crc & 15u];
    }
    return ~crc;
}

/* test hook (-DET_BANK_TEST_HOOKS, host tests): the train graph returns after node k, as if
 * the power failed there; et_train_step then returns NaN without committing */
#ifdef ET_BANK_TEST_HOOKS
static int et_test_abort_at = -1, et_test_aborted;
void et_test_abort_after_node(int k) { et_test_abort_at = k; et_test_aborted = 0; }
#define ET_BANK_ABORT_POINT(i) do { if (et_test_abort_at == (i)) { et_test_aborted = 1; return; } } while (0)
#elif defined(ET_BANK_RESET_AT_STEP) && defined(ET_BANK_RESET_AT_NODE) && defined(__arm__)
/* firmware test hook (-DET_BANK_RESET_AT_STEP=s -DET_BANK_RESET_AT_NODE=k): a real system reset
 * (SYSRESETREQ) after node k of the step that would complete step s, once (a .noinit flag) */
ET_NOINIT static volatile uint32_t et_test_reset_done;
static void et_test_reset(int node, int32_t steps_done) {
    if (node == ET_BANK_RESET_AT_NODE && steps_done + 1 == ET_BANK_RESET_AT_STEP &&
        et_test_reset_done != ET_BANK_MAGIC) {
        et_test_reset_done = ET_BANK_MAGIC;
        __asm__ volatile("dsb" ::: "memory");
        *(volatile uint32_t *)0xE000ED0Cu = 0x05FA0004u; /* SCB->AIRCR = VECTKEY | SYSRESETREQ */
        __asm__ volatile("dsb" ::: "memory");
        for (;;) {
        }
    }
}
#define ET_BANK_ABORT_POINT(i) et_test_reset((i), et_step)
#else
#define ET_BANK_ABORT_POINT(i) ((void)0)
#endif
#endif
