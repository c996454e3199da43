"""Device profiles: m0, m4f, m7, a72, tx2, host. Every number carries its source.

Sources: POET (Patil et al., ICML 2022) and its code's ``poet/chipsets.py`` profiles; the vendors'
datasheets; EEMBC CoreMark scores; the SD / eMMC figures POET measured. "estimate" marks a figure
reasoned from the hardware rather than measured or published; the reasoning is beside it.

Choices where POET's published profiles are inconsistent or missing:

- **A72 (Raspberry Pi 4B).** POET's table gives FLOPS = 2e9 while the comment beside it says
  120.34 MFLOP/s, and its FLOP/J (4.01e7) is derived from the 120 MFLOP/s figure: a scalar benchmark
  (1.6283e9 FLOP in 13.53 s) at 3 W (600 mA at 5 V). Throughput and energy therefore describe two
  different machines. We keep POET's 2e9 FLOP/s (the figure its solver uses for time, and a modest
  sustained figure for four NEON cores at 1.5 GHz) and POET's 3 W of active power, and derive
  FLOP/J = 2e9 / 3 W = 6.67e8. Compute energy is thus 16.6x cheaper than POET's table says;
  relative to it, paging and recomputation cost more.
- **TX2 (Jetson TX2).** POET gives storage figures only. We take the GPU (training runs there) in
  the Max-Q power mode, the energy-efficient one: 256 Pascal CUDA cores at 854 MHz, 2 FLOP per FMA
  -> 437 GFLOP/s fp32 peak; half of it sustained (``GPU_SUSTAINED_FRACTION``) -> 219 GFLOP/s; at the
  Max-Q module power of 7.5 W -> 2.9e10 FLOP/J. (POET's own TX2 "POWER" of 0.766 W is one loaded CPU
  core above idle, not the GPU.)
- **M7 (STM32F746)** is not in POET; it is the profile of the ``cortex-m7`` emit target (``targets``).
  Its throughput is POET's measured M4F rate scaled by CoreMark
  (1082 at 216 MHz vs the nRF52840's 212 at 64 MHz); power from the datasheet's run-mode current.
- **One page latency per profile.** POET has separate page-in and page-out latencies, partly
  measured through the OS page cache (the A72's 5 us read). A page operation here is one tensor
  read or written through a file, so we use one latency per storage: SD card 1 ms (MCUs over SPI;
  POET measured 0.11 ms for the raw transfer, a FAT file's block + directory update and the card's
  programming busy time add the rest: estimate), Pi's SD card 2 ms (between POET's cached 5 us read
  and its uncached 4.24 ms write), TX2 eMMC 1.47 ms (mean of POET's 0.54 ms read, 2.40 ms write).

Memory: ``mem_j_per_byte`` = active power / ``mem_bytes_per_s`` throughout, i.e. a memory-bound op
costs its roofline time at the device's active power (a consistent estimate, not a measurement).
MCUs hold their frozen weights in flash (``weights_in_flash``); the others load them into RAM.
"""
from __future__ import annotations

from types import MappingProxyType

from .device import Device

KIB, GIB = 1024, 1024**3

# --- shared storage figures (POET chipsets.py) ---------------------------------------------------
#: SD card over SPI on the MCU boards, POET's measured MKR1000 figures (used by POET for the M4F too)
SD_SPI_IN_BPS = 4616.51e3          # POET: PAGEIN_THROUGHPUT 4616.51 KB/s
SD_SPI_OUT_BPS = 4440e3            # POET: PAGEOUT_THROUGHPUT 4440 KB/s
SD_SPI_W = 0.100 * 3.3             # POET: MEMORY_POWER 100 mA at 3.3 V = 0.33 W
SD_SPI_LATENCY_S = 1e-3            # estimate (see module docstring); POET's raw transfer: 0.109 / 0.113 ms

# --- m0: Arduino MKR1000, Microchip SAMD21G18A Cortex-M0+ at 48 MHz, no FPU -----------------------
M0_FLOPS = 2000 / 0.012            # POET: 2000 FLOP (soft float) measured in 12 ms = 1.67e5 FLOP/s
M0_W = 0.020 * 3.3                 # POET: 20 mA at 3.3 V = 0.066 W -> 2.53e6 FLOP/J
M0_MEM_BPS = 48e6                  # estimate: ~1 byte moved per cycle at 48 MHz (LDR/STR 2 cycles each + loop)

# --- m4f: Nordic nRF52840, Cortex-M4F at 64 MHz ---------------------------------------------------
M4F_FLOPS = 16283 * 100 * 1000 / 255.6237   # POET: 1.6283e9 FLOP measured in 255.6 s = 6.37e6 FLOP/s
M4F_W = 3.328e-3 * 3.3             # POET / nRF52840 PS: 3.3 mA CPU at 64 MHz, 3.3 V = 11 mW -> 5.80e8 FLOP/J
M4F_MEM_BPS = 64e6                 # estimate: ~1 byte moved per cycle at 64 MHz

# --- m7: STMicroelectronics STM32F746, Cortex-M7 at 216 MHz, single-precision FPU ----------------
COREMARK_NRF52840 = 212            # Nordic nRF52840 product spec: 212 CoreMark at 64 MHz (from flash)
COREMARK_STM32F746 = 1082          # ST STM32F746 product page: 1082 CoreMark at 216 MHz
M7_FLOPS = M4F_FLOPS * COREMARK_STM32F746 / COREMARK_NRF52840  # = 3.25e7 FLOP/s (POET's M4F rate scaled)
M7_W = 0.100 * 3.3                 # estimate from DS10916 run-mode supply current, ~100 mA at 216 MHz, 3.3 V
M7_MEM_BPS = 2 * 216e6             # estimate: ~2 bytes per cycle (dual issue, 64-bit AXI / TCM)

# --- a72: Raspberry Pi 4B, Broadcom BCM2711, 4x Cortex-A72 at 1.5 GHz, LPDDR4-3200 ----------------
A72_FLOPS = 2e9                    # POET: FLOPS = 2e9 (kept; see module docstring)
A72_W = 0.6 * 5                    # POET: 600 mA at 5 V = 3 W active (above idle) -> 6.67e8 FLOP/J
A72_MEM_BPS = 0.25 * 12.8e9        # estimate: a quarter of the 32-bit LPDDR4-3200 bus's 12.8 GB/s
A72_SD_IN_BPS = 45.5e6             # POET: SD card read 45.5 MB/s
A72_SD_OUT_BPS = 24.5e6            # POET: SD card write 24.5 MB/s (with the page cache)
A72_SD_W = 0.030 * 5               # POET: 30 mA at 5 V = 0.15 W
A72_SD_LATENCY_S = 2e-3            # between POET's 5 us cached read and 4.24 ms uncached write

# --- tx2: NVIDIA Jetson TX2, 256-core Pascal GPU, 8 GB 128-bit LPDDR4-1866, 32 GB eMMC 5.1 --------
TX2_CUDA_CORES = 256               # NVIDIA Jetson TX2 module datasheet
TX2_MAXQ_GPU_HZ = 854e6            # nvpmodel Max-Q mode: GPU at 854 MHz
GPU_SUSTAINED_FRACTION = 0.5       # estimate: cuDNN training kernels at batch 1-32 reach about half of peak
TX2_FLOPS = TX2_CUDA_CORES * 2 * TX2_MAXQ_GPU_HZ * GPU_SUSTAINED_FRACTION   # = 2.19e11 FLOP/s
TX2_W = 7.5                        # NVIDIA: Max-Q module power 7.5 W -> 2.9e10 FLOP/J
TX2_MEM_BPS = 0.5 * 59.7e9         # estimate: half of 128-bit LPDDR4 at 1866 MHz = 59.7 GB/s
TX2_EMMC_IN_BPS = 108.5e6          # POET: eMMC read 108.5 MB/s
TX2_EMMC_OUT_BPS = 94.37e6         # POET: eMMC write 94.37 MB/s
TX2_EMMC_W = 0.309                 # POET: 309 mW (read power, used for writes too)
TX2_EMMC_LATENCY_S = (0.54e-3 + 2.396e-3) / 2   # mean of POET's 0.54 ms read, 2.396 ms write

# --- host: a generic x86-64 laptop (4 cores, AVX2+FMA, 16 GB dual-channel DDR4, NVMe SSD) ----------
HOST_FLOPS = 1e11                  # estimate: 4 cores x 3 GHz x 32 FLOP/cycle peak = 384 GFLOP/s, ~1/4 sustained
HOST_W = 15.0                      # estimate: a 15 W TDP U-series laptop processor under load
HOST_MEM_BPS = 20e9                # estimate: dual-channel DDR4-2666 (42.7 GB/s) at ~half for copies
HOST_SSD_IN_BPS = 2e9              # estimate: PCIe 3.0 x4 NVMe sequential read ~2 GB/s
HOST_SSD_OUT_BPS = 1e9             # estimate: NVMe sequential write ~1 GB/s
HOST_SSD_W = 3.0                   # estimate: M.2 NVMe active power 3-6 W
HOST_SSD_LATENCY_S = 0.5e-3        # estimate: write + fsync (cache flush) on a consumer NVMe


def _profile(name, title, ram, flops, watts, mem_bps, in_bps, out_bps, latency, storage_w, in_flash):
    """Energy figures follow from one active power: FLOP/J = FLOP/s / W, J/byte = W / (byte/s)."""
    return Device(name=name, title=title, ram_bytes=ram, flops_per_s=flops, flops_per_j=flops / watts,
                  mem_bytes_per_s=mem_bps, mem_j_per_byte=watts / mem_bps, page_in_bytes_per_s=in_bps,
                  page_out_bytes_per_s=out_bps, page_latency_s=latency, storage_w=storage_w,
                  weights_in_flash=in_flash)


#: active power (W) behind each profile's energy figures
ACTIVE_W = MappingProxyType({"m0": M0_W, "m4f": M4F_W, "m7": M7_W, "a72": A72_W, "tx2": TX2_W,
                             "host": HOST_W})

DEVICES = MappingProxyType({
    "m0": _profile("m0", "Arduino MKR1000 (SAMD21 Cortex-M0+, 48 MHz)", 32 * KIB,  # SAMD21G18A: 32 KB SRAM
                   M0_FLOPS, M0_W, M0_MEM_BPS, SD_SPI_IN_BPS, SD_SPI_OUT_BPS, SD_SPI_LATENCY_S, SD_SPI_W,
                   True),
    "m4f": _profile("m4f", "Nordic nRF52840 (Cortex-M4F, 64 MHz)", 256 * KIB,  # nRF52840 PS: 256 KB RAM
                    M4F_FLOPS, M4F_W, M4F_MEM_BPS, SD_SPI_IN_BPS, SD_SPI_OUT_BPS, SD_SPI_LATENCY_S, SD_SPI_W,
                    True),
    "m7": _profile("m7", "STM32F746 (Cortex-M7, 216 MHz)", 320 * KIB,  # DS10916: 320 KB SRAM incl. 64 KB DTCM
                   M7_FLOPS, M7_W, M7_MEM_BPS, SD_SPI_IN_BPS, SD_SPI_OUT_BPS, SD_SPI_LATENCY_S, SD_SPI_W,
                   True),
    "a72": _profile("a72", "Raspberry Pi 4B (Cortex-A72, 4 GB)", 4 * GIB,  # the 4 GB model (1-8 GB sold)
                    A72_FLOPS, A72_W, A72_MEM_BPS, A72_SD_IN_BPS, A72_SD_OUT_BPS, A72_SD_LATENCY_S, A72_SD_W,
                    False),
    "tx2": _profile("tx2", "NVIDIA Jetson TX2 (Pascal GPU, Max-Q)", 8 * GIB,  # TX2 datasheet: 8 GB LPDDR4
                    TX2_FLOPS, TX2_W, TX2_MEM_BPS, TX2_EMMC_IN_BPS, TX2_EMMC_OUT_BPS, TX2_EMMC_LATENCY_S,
                    TX2_EMMC_W, False),
    "host": _profile("host", "generic x86-64 laptop (defaults, not measured)", 16 * GIB,
                     HOST_FLOPS, HOST_W, HOST_MEM_BPS, HOST_SSD_IN_BPS, HOST_SSD_OUT_BPS, HOST_SSD_LATENCY_S,
                     HOST_SSD_W, False),
})
