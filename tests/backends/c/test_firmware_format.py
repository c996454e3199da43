"""runtime/cortexm/et_format.h: the firmware prints its losses without newlib's printf; its
"%.9g" of a float must be the host printf's text exactly (the firmware's loss lines are
compared with the host build's as text), checked here on the host against its printf."""
from __future__ import annotations

import subprocess

import pytest

from edgetrain.backends.c import cortexm
from edgetrain.backends.c.host import find_cc

DRIVER = r"""
#include <stdio.h>
#include "et_format.h"
static int bad;
static void check(uint32_t u) {
    union { uint32_t u; float f; } b = {u};
    char want[64], got[64];
    snprintf(want, sizeof want, "%.9g", (double)b.f);
    int n = et_format_g9(got, b.f);
    if (strcmp(want, got) || n != (int)strlen(want)) { if (bad++ < 10) printf("%08x: %s != %s\n", u, got, want); }
}
int main(void) {
    for (uint32_t u = 0; u < 4096; ++u) {  /* subnormals, the largest finite, NaNs, with both signs */
        check(u); check(u | 0x80000000u); check(0x7f800000u - u); check(0x7f800000u + u); check(0xff800000u + u);
    }
    for (uint32_t e = 0; e < 256; ++e)  /* around every power of two */
        for (int k = -3; k <= 3; ++k) check((e << 23) + (uint32_t)k);
    const float edges[] = {1e9f, 999999999.f, 999999940.f, 1e-4f, 9.9999997e-5f, 123456789.f, 2.44529676f, 0.5f,
                           100.f, 1.f, 10.f, 1e-5f, 3.4028235e38f, 1.17549435e-38f, 16777216.f, 0.1f};
    for (unsigned i = 0; i < sizeof edges / sizeof edges[0]; ++i) { union { float f; uint32_t u; } b = {edges[i]}; check(b.u); }
    uint64_t s = 88172645463325252ull;  /* random bit patterns */
    for (long i = 0; i < 300000; ++i) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; check((uint32_t)s); }
    char u[32];
    const unsigned long ints[] = {0, 7, 10, 2236, 4294967295ul};
    for (unsigned i = 0; i < 5; ++i) {
        char want[32]; snprintf(want, sizeof want, "%lu", ints[i]);
        if (et_format_u(u, ints[i]) != (int)strlen(want) || strcmp(u, want)) bad++;
    }
    printf("mismatches %d\n", bad);
    return bad != 0;
}
"""


def test_format_equals_the_host_printf(tmp_path):
    (tmp_path / "drv.c").write_text(DRIVER)
    r = subprocess.run([find_cc(), "-O2", "-std=gnu11", "-Wall", "-Werror", f"-I{cortexm.RUNTIME_DIR}", "-o", "drv",
                        "drv.c"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["./drv"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "mismatches 0" in r.stdout, r.stdout


@pytest.mark.skipif(bool(cortexm.missing_tools()), reason="no arm-none-eabi toolchain")
def test_firmware_links_no_printf(tmp_path):
    """The firmware's number formatting pulls in none of newlib's formatted output."""
    from tests.backends.c.test_cortexm import fixture_project, fixture_samples

    d = fixture_project(tmp_path, "cortex-m4", fixture_samples(2))
    elf = cortexm.build(d)
    names = subprocess.run(["arm-none-eabi-nm", str(elf)], capture_output=True, text=True, check=True).stdout
    assert " et_console_puts\n" in names  # the lines go out through the board's UART
    assert not [n for n in ("_svfprintf_r", "_dtoa_r", "_malloc_r") if f" {n}\n" in names]
