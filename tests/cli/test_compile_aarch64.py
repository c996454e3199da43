"""`edgetrain compile --target aarch64-linux --verify`: the host project cross-built with
aarch64-linux-gnu-gcc and run under qemu-aarch64 prints the reference runtime's losses
(backends/c/cross.py)."""
from __future__ import annotations

import json

import pytest

from edgetrain.app.cli_program import CROSS_TARGET_NAMES
from edgetrain.backends.c import cross

NO_AARCH64 = cross.missing_tools("aarch64")


def test_the_cli_names_every_cross_target():
    assert set(CROSS_TARGET_NAMES) == set(cross.CROSS_TARGETS)


@pytest.mark.skipif(bool(NO_AARCH64), reason=f"missing {', '.join(NO_AARCH64)} (Debian: gcc-aarch64-linux-gnu "
                                             "libc6-dev-arm64-cross qemu-user)")
def test_compile_verify_under_qemu_aarch64(cli, model_file, tmp_path):
    out = tmp_path / "a64"
    code, text, err = cli("compile", f"{model_file}:build", "--input", "1x3x32x32", "--target", "aarch64-linux",
                          "--samples", "3", "--verify", "--no-plot", "-o", out)
    assert code == 0, err + text
    assert "verified: 3 steps" in err and "qemu-aarch64 (aarch64): step 3 loss" in err
    report = json.loads((out / "memory.json").read_text())
    assert report["verify"]["ok"] and report["target"] == "aarch64-linux"
    elf = (out / "main").read_bytes()[:20]
    assert int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
