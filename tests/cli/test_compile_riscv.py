"""`edgetrain compile --target rv32imafc|rv32imc --verify`: a RISC-V firmware for QEMU's virt
board, its losses equal to the reference runtime's (backends/c/cortexm.py with the targets'
records, runtime/riscv/)."""
from __future__ import annotations

import json

import pytest

from edgetrain.backends.c import cortexm

NO_RISCV = cortexm.missing_tools("rv32imc")


@pytest.mark.skipif(bool(NO_RISCV), reason=f"missing {', '.join(NO_RISCV)} (Debian: gcc-riscv64-unknown-elf "
                                           "picolibc-riscv64-unknown-elf qemu-system-misc)")
@pytest.mark.parametrize("quantize,target,banks", [("none", "rv32imc", "1"), ("int8", "rv32imafc", "2")])
def test_compile_verify_under_qemu_virt(cli, model_file, image_folder, tmp_path, quantize, target, banks):
    out = tmp_path / target
    extra = ("--calibrate", image_folder) if quantize == "int8" else ()
    code, text, err = cli("compile", f"{model_file}:build", "--input", "1x3x32x32", "--sram", "256KB", "--flash",
                          "1MB", "--quantize", quantize, *extra, "--target", target, "--weight-banks", banks,
                          "--samples", "3", "--verify", "--no-plot", "-o", out)
    assert code == 0, err + text
    assert "verified: 3 steps" in err and f"QEMU {target}: step 3 loss" in err
    report = json.loads((out / "memory.json").read_text())
    assert report["verify"]["ok"] and len(report["verify"]["losses"]) == 3
    fw = report["firmware"]
    assert 0 < fw["sram"] <= 256 * 1024 and 0 < fw["flash"] <= 1024 * 1024 and fw["stack_bound"] > 0
    assert int.from_bytes((out / "firmware.elf").read_bytes()[18:20], "little") == 243  # EM_RISCV
    assert "MARCH = " + target in (out / "config.mk").read_text()
    assert ("et_bank_boot" in (out / "model.c").read_text()) == (banks == "2")


@pytest.mark.skipif(bool(NO_RISCV), reason=f"missing {', '.join(NO_RISCV)}")
def test_integer_backward_firmware_has_no_float_instruction(cli, model_file, image_folder, tmp_path):
    """--backward integer on the FPU-less rv32imc: the losses equal the reference's and the ELF
    links no soft-float routine (backends/c/float_check.py); the float backward's does."""
    from edgetrain.backends.c.float_check import float_uses

    out = tmp_path / "integer"
    code, text, err = cli("compile", f"{model_file}:build", "--input", "1x3x32x32", "--quantize", "int8",
                          "--calibrate", image_folder, "--target", "rv32imc", "--backward", "integer", "--momentum",
                          "0.9", "--samples", "3", "--verify", "--no-plot", "-o", out)
    assert code == 0, err + text
    assert "verified: 3 steps" in err and "integer-only: no float instruction" in err
    report = json.loads((out / "memory.json").read_text())
    assert report["verify"]["float_uses"] == [] and float_uses(out / "firmware.elf") == []
    assert "#define ET_INTEGER_ONLY 1" in (out / "model.h").read_text()
    code, text, err = cli("compile", f"{model_file}:build", "--input", "1x3x32x32", "--quantize", "int8",
                          "--calibrate", image_folder, "--target", "rv32imc", "--samples", "1", "--verify",
                          "--no-plot", "-o", tmp_path / "float")
    assert code == 0, err + text
    assert any(name.startswith("__") for name in float_uses(tmp_path / "float" / "firmware.elf"))
    floats = json.loads((tmp_path / "float" / "memory.json").read_text())["verify"]["float_uses"]
    assert floats and f"float step on a core without an FPU: {len(floats)} soft-float routines linked" in err
