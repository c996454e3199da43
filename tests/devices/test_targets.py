"""The target registry (devices/targets.py): one record per emit target, read by the C backend,
the firmware builder and the capability table; a chip is one entry (a copy of the Cortex-M4
under another name builds and runs)."""
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgetrain.backends import capabilities
from edgetrain.backends import c as cbackend
from edgetrain.backends.c import cortexm
from edgetrain.devices import DEVICES, TARGETS, get_device, get_target
from edgetrain.devices.targets import resolve_target


def test_every_target_has_a_cost_profile_and_a_capability_row():
    for name, t in TARGETS.items():
        assert t.name == name and t.device is DEVICES[t.profile]
        assert capabilities.backend_of_target(name) == t.backend
        if t.firmware:
            assert t.isa and t.toolchain and t.emulator and t.memory and t.runtime and t.startup_files
            assert t.fpu in ("none", "single") and t.simd in ("none", "arm-dsp", "helium", "rvv")
            assert t.sram_bytes == t.memory.sram_bytes and t.flash_bytes == t.memory.flash_bytes
            assert t.machine == t.emulator.machine and "portable" in t.kernels
            # its runtime folder exists and every file it copies is found there or in runtime/cortexm
            for name in (*t.startup_files, "link.ld.in", "README.md.in"):
                assert cortexm.runtime_file(t, name).exists(), (name, t.runtime)


def test_cortex_m7_runs_on_the_m7_profile():
    assert get_target("cortex-m7").device.name == "m7"
    assert get_target("cortex-m4").device.name == "m4f"
    assert get_device("cortex-m7") is DEVICES["m7"]


def test_backends_read_the_registry():
    assert cbackend.TARGETS == tuple(TARGETS)
    assert set(cbackend.FIRMWARE_TARGETS) == set(cortexm.FIRMWARE_TARGETS) == {n for n, t in TARGETS.items()
                                                                               if t.firmware}
    assert set(cbackend.CORTEX_M_TARGETS) == set(cortexm.TARGETS) == {"cortex-m4", "cortex-m7", "cortex-m55"}
    assert {"rv32imafc", "rv32imc"} <= set(cortexm.FIRMWARE_TARGETS)
    assert cortexm.get_target("cortex-m4") is TARGETS["cortex-m4"]
    with pytest.raises(cortexm.CortexMError):
        cortexm.get_target("host")
    with pytest.raises(ValueError, match="unknown target"):
        get_target("cortex-m0")


def test_a_name_is_resolved_once_and_a_record_passes_through():
    t = TARGETS["rv32imc"]
    assert resolve_target("rv32imc") is t and resolve_target(t) is t and cortexm.resolve(t) is t
    fake = dataclasses.replace(t, name="not-registered")
    assert cortexm.resolve(fake) is fake and capabilities.backend_of_target(fake) == "riscv"
    assert t.fpu == "none" and TARGETS["rv32imafc"].fpu == "single" and TARGETS["cortex-m7"].simd == "arm-dsp"
    assert "-march=rv32imc" in t.toolchain.arch_flags and "-mabi=ilp32" in t.toolchain.arch_flags
    assert TARGETS["rv32imafc"].toolchain.tool("gcc") == "riscv64-unknown-elf-gcc"


def test_firmware_regions_come_from_the_target():
    files = cortexm.firmware_files("cortex-m7", ([[0.0]], [[0]]))
    t = TARGETS["cortex-m7"]
    assert "ram_bytes" not in files["link.ld"] and str(t.sram_bytes) in files["link.ld"]
    assert f"MACHINE = {t.machine}" in files["config.mk"] and f"CPU = {t.cpu}" in files["config.mk"]


def test_riscv_targets_have_the_firmware_capability_row():
    """A RISC-V firmware lacks what every bare-metal firmware lacks (no file system), refused at
    compile time (exit 2 in the CLI) like the Cortex-M's; float code on rv32imc is soft-float."""
    table = capabilities.capabilities()
    for name in ("rv32imafc", "rv32imc"):
        assert capabilities.backend_of_target(name) == "riscv"
    assert table["riscv"].ops == table["cortex-m"].ops and dict(table["riscv"].lacks) == dict(table["cortex-m"].lacks)
    assert "file system" in table["riscv"].lacks["page_in"]


def test_riscv_firmware_files_come_from_its_runtime_folder():
    files = cortexm.firmware_files("rv32imc", ([[0.0]], [[0]]))
    assert "crt0.S" in files and "MARCH = rv32imc" in files["config.mk"] and "MABI = ilp32\n" in files["config.mk"]
    assert "ORIGIN = 0x80000000" in files["link.ld"] and "ORIGIN = 0x80400000" in files["link.ld"]
    assert b"0x10000000" in files["board.c"]  # virt's UART, not the MPS2's
    assert files["main.c"] == (cortexm.RUNTIME_DIR / "main.c").read_bytes()  # shared with the Cortex-M
    assert "__global_pointer$ = " in files["link.ld"] and "rv32imc" in files["README.md"]


def test_cortex_m55_firmware_files_come_from_its_runtime_folder():
    """The M55 (MPS3 AN547) differs in its linker script (vectors in the ITCM at 0, code in the
    SRAM at 0x01000000), its UART0 and watchdog addresses (board.c's, named by -D) and its flags."""
    t = TARGETS["cortex-m55"]
    files = cortexm.firmware_files(t, ([[0.0]], [[0]]))
    assert t.simd == "helium" and "helium" in t.kernels and "-mcpu=cortex-m55" in t.toolchain.arch_flags
    assert "ORIGIN = 0x00000000" in files["link.ld"] and "ORIGIN = 0x01000000" in files["link.ld"]
    assert "> VECTORS" in files["link.ld"] and "MACHINE = mps3-an547" in files["config.mk"]
    assert "-DUART0_BASE=0x59303000u" in files["config.mk"] and "FPU = auto" in files["config.mk"]
    # no auto-vectorised float loops: Helium's vector float arithmetic flushes subnormals
    assert "-fno-tree-vectorize" in files["config.mk"]
    assert files["board.c"] == (cortexm.RUNTIME_DIR / "board.c").read_bytes()  # shared, its addresses by -D


# --- a chip is one entry: a copy of the Cortex-M4 under another name -----------------------------
FAKE = dataclasses.replace(TARGETS["cortex-m4"], name="fake-m4")


def test_a_fake_targets_project_is_the_m4s_but_for_its_name():
    samples = (np.zeros((2, 1, 2), np.float32), np.zeros((2, 1, 1), np.float32))
    fake, m4 = cortexm.firmware_files(FAKE, samples), cortexm.firmware_files("cortex-m4", samples)
    assert fake.keys() == m4.keys()
    for name in fake:
        if name in ("config.mk", "README.md"):
            assert fake[name].replace("fake-m4", "cortex-m4") == m4[name].replace("fake-m4", "cortex-m4")
            assert "fake-m4" in fake[name]
        else:
            assert fake[name] == m4[name], name


@pytest.mark.skipif(bool(cortexm.missing_tools(FAKE)), reason=f"missing {', '.join(cortexm.missing_tools(FAKE))}")
def test_a_fake_target_builds_and_runs_firmware(tmp_path):
    """A target record that is in no registry: emit, build, run and size read it alone."""
    import torch
    import torch.nn as nn

    import edgetrain as et
    from edgetrain.backends.c.export import emit_c

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(8, 4))
    prog = et.compile(model, (torch.zeros(1, 2, 2, 2),), optimizer=et.SGD(lr=0.05))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((1, 2, 2, 2)).astype(np.float32), np.array([i % 4])) for i in range(2)]
    d = emit_c(prog, tmp_path / "fake", FAKE, data)
    assert (Path(d) / "config.mk").read_text().startswith("# generated by edgetrain.backends.c.cortexm for fake-m4")
    elf = cortexm.build(d, target=FAKE)
    run = cortexm.run_qemu(d, FAKE, icount=True)
    assert run.exit_code == 0, run.lines
    np.testing.assert_allclose(run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)
    assert run.cycles_per_step is not None  # the M4's cycle table, named by the record
    size = cortexm.firmware_size(elf, run, FAKE)
    assert size.stack_bound is not None and run.stack_high_water <= size.stack_bound
    assert shutil.which(FAKE.emulator.binary)
