"""`edgetrain compile`: a model file that is not in the zoo to a firmware project, its memory
report and checkpoint; QEMU runs the firmware; bad input gives a clear message, a meaningful
exit code and writes nothing."""
from __future__ import annotations

import json

import pytest

from edgetrain.backends.c import cortexm
from edgetrain.app.checkpoint import load_checkpoint

from .conftest import INPUT, snapshot

NO_ARM = cortexm.missing_tools()


def test_help_is_complete(cli):
    code, out, _ = cli("--help")
    assert code == 0
    for cmd in ("compile", "train", "export", "schedule", "inspect", "profile", "demo"):
        assert cmd in out
    assert "exit codes" in out and "3  does not fit" in out and "4  training stopped" in out
    for cmd, words in (("compile", ("--input", "--sram", "--flash", "--update", "--quantize", "--target", "--verify",
                                    "--calibrate", "--contributions", "exit codes")),
                       ("train", ("--data", "--resume", "--init", "--epochs", "--skip-bad-images", "exit codes")),
                       ("export", ("safetensors", "exit codes")), ("schedule", ("--device", "--input"))):
        code, out, _ = cli(cmd, "--help")
        assert code == 0 and all(w in out for w in words), (cmd, [w for w in words if w not in out])


def test_compile_host_project(cli, model_file, tmp_path):
    out = tmp_path / "out"
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--target", "host", "--update",
                       "last:2", "--sram", "256KB", "-o", out)
    assert code == 0, err
    for name in ("model.c", "model.h", "main.c", "samples.h", "Makefile", "memory.json", "memory.png", "program.ckpt"):
        assert (out / name).is_file(), name
    report = json.loads((out / "memory.json").read_text())
    assert report["budget"]["sram"] == 256 * 1024 and report["peak_bytes"] <= 256 * 1024
    assert report["update"] == "last:2" and set(report["trainable"]) == {"pw.weight", "pw.bias", "head.weight",
                                                                        "head.bias"}
    assert report["arena_bytes"] > 0 and len(report["timeline"]) > 0
    ck = load_checkpoint(out / "program.ckpt")
    assert ck.config.inputs == (INPUT,) and ck.steps == 0 and ck.train["reason"] == "compiled"
    assert "peak" in err  # progress lines: stderr


@pytest.mark.skipif(bool(NO_ARM), reason=f"missing {', '.join(NO_ARM)} (Debian: gcc-arm-none-eabi "
                                         f"libnewlib-arm-none-eabi qemu-system-arm)")
@pytest.mark.parametrize("quantize,target,banks", [("none", "cortex-m4", "1"), ("int8", "cortex-m7", "2")])
def test_compile_verify_under_qemu(cli, model_file, image_folder, tmp_path, quantize, target, banks):
    """Done criterion of issue 7: a model written for the tests goes through `edgetrain compile`
    to a firmware that QEMU runs, printing the reference runtime's losses."""
    out = tmp_path / target
    extra = ("--calibrate", image_folder) if quantize == "int8" else ()
    code, text, err = cli("compile", f"{model_file}:build", "--input", "1x3x32x32", "--sram", "256KB", "--flash",
                          "1MB", "--quantize", quantize, *extra, "--target", target, "--weight-banks", banks, "--samples", "3", "--verify",
                          "--no-plot", "-o", out)
    assert code == 0, err + text
    assert "verified: 3 steps" in err and f"QEMU {target}: step 3 loss" in err  # progress lines: stderr
    report = json.loads((out / "memory.json").read_text())
    assert report["verify"]["ok"] and len(report["verify"]["losses"]) == 3
    fw = report["firmware"]
    assert 0 < fw["sram"] <= 256 * 1024 and 0 < fw["flash"] <= 1024 * 1024 and fw["stack_high_water"] > 0
    assert (out / "firmware.elf").is_file()
    assert ("et_bank_boot" in (out / "model.c").read_text()) == (banks == "2")


def test_budget_that_cannot_fit(cli, model_file, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = snapshot(out)
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--sram", "4KB", "-o", out)
    assert code == 3
    assert "over the budget of 4,096 B" in err and "the smallest budget that fits this update scheme is" in err
    smallest = int(err.split("smallest budget that fits this update scheme is ")[1].split(" B")[0].replace(",", ""))
    assert snapshot(out) == before  # nothing written
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--sram", str(smallest), "--target",
                       "host", "--no-plot", "-o", out)
    assert code == 0, err  # and that budget does fit
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--flash", "8", "--no-plot", "-o", out)
    assert code == 3 and "read-only weights need" in err


def test_second_weight_bank_counts_against_the_budget(cli, model_file, tmp_path):
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--target", "host", "--no-plot",
                       "-o", tmp_path / "one")
    assert code == 0, err
    one = json.loads((tmp_path / "one" / "memory.json").read_text())
    assert one["weight_banks"] == 1 and one["peak_bytes"] == one["program_peak_bytes"]
    out = tmp_path / "two"
    args = ("compile", f"{model_file}:build", "--input", INPUT, "--target", "cortex-m4", "--weight-banks", "2",
            "--no-plot", "-o", out)
    code, _, err = cli(*args, "--sram", str(one["peak_bytes"]))
    assert code == 3 and "with --weight-banks 2 the program needs" in err and not out.exists()
    need = one["peak_bytes"] + one["trainable_bytes"]
    assert f"the smallest budget that fits is {need:,} B" in err
    code, _, err = cli(*args, "--sram", str(need))
    assert code == 0, err
    two = json.loads((out / "memory.json").read_text())
    assert two["weight_banks"] == 2 and two["second_bank_bytes"] == one["trainable_bytes"] > 0
    assert two["peak_bytes"] == need and two["program_peak_bytes"] == one["peak_bytes"]
    assert "two weight banks: +" in err  # progress lines: stderr


def test_update_auto_needs_contributions(cli, model_file, tmp_path):
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--update", "auto", "--sram", "64KB",
                       "-o", tmp_path / "o")
    assert code == 2 and "contributions=" in err
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--update", "auto", "-o", tmp_path / "o")
    assert code == 2 and "budget" in err
    assert not (tmp_path / "o").exists()


UNSUPPORTED = '''
import torch
from torch import nn


class Sorted(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(torch.cummax(x, 1).values)
'''


@pytest.mark.parametrize("argv,code,msg", [
    (["{bad}:Sorted", "--input", "1x8"], 2, r"unsupported op aten.cummax.default \(at .*bad.py:\d+: "
                                             r"return self.fc\(torch.cummax\(x, 1\).values\)\)"),
    (["{model}:build", "--input", "1x3x16"], 2, r"does not accept input 1x3x16: RuntimeError"),
    (["{model}:build", "--input", "1x3x16x16", "--input", "1x4"], 2, r"does not accept input 1x3x16x16, 1x4"),
    (["{model}:build"], 2, r"give the model's input shape"),
    (["{model}:build", "--input", "1x3x16x16:float64"], 2, r"dtype 'float64' is not one of"),
    (["{model}:nope", "--input", "1x3x16x16"], 2, r"defines no 'nope'; it defines PetNet, build"),
    (["{model}:build", "--input", "1x3x16x16", "--sram", "lots"], 2, r"--sram/--ram: cannot read 'lots'"),
    (["{model}:build", "--input", "1x3x16x16", "--update", "some"], 2, r"unknown update scheme 'some'"),
    (["{model}:build", "--input", "1x3x16x16", "--model-arg", "width=-1"], 2, r"calling build\(width=-1\) raised"),
    (["{model}:build", "--input", "1x3x16x16", "--calibrate", "{missing}"], 2, r"--calibrate applies to"),
    (["{model}:build", "--input", "1x3x16x16", "--target", "cortex-m4", "--sram", "8MB"], 2, r"QEMU boards"),
])
def test_bad_input(cli, model_file, tmp_path, argv, code, msg):
    import re

    bad = tmp_path / "bad.py"
    bad.write_text(UNSUPPORTED)
    argv = [a.format(bad=bad, model=model_file, missing=tmp_path / "none") for a in argv]
    got, _, err = cli("compile", *argv, "-o", tmp_path / "out")
    assert got == code, err
    assert re.search(msg, err), err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_schedule_and_inspect_take_a_model_file(cli, model_file):
    code, out, err = cli("inspect", f"{model_file}:build", "--input", INPUT, "--update", "bias")
    assert code == 0, err
    assert "# memory (BiasOnly(), batch 1)" in out
    code, out, err = cli("schedule", f"{model_file}:build", "--input", INPUT, "--solver", "chen", "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["solver"] == "chen"
