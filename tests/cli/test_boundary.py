"""The command line's boundary (issue 18, items 8, 10 and 11): every number a user types is
checked where it is read (exit 2 naming the option, never an internal error or a silent
default); SIGTERM and Ctrl-C end in exit 130 without a traceback, train saving its state;
every command's --help is complete; a mistyped option gets the command's own usage; and
--help, --version and usage errors answer without importing torch."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from edgetrain.app.checkpoint import load_checkpoint

from .conftest import INPUT, edgetrain_process

NINES = "9" * 400  # read as a float: infinity, whose int() was an OverflowError


@pytest.mark.parametrize("argv,option", [
    (["compile", "m.py:build", "-o", "out", "--sram", NINES], "--sram/--ram"),
    (["compile", "m.py:build", "-o", "out", "--flash", "2048GB"], "--flash"),
    (["compile", "m.py:build", "-o", "out", "--lr", "nan"], "--lr"),
    (["compile", "m.py:build", "-o", "out", "--momentum", "-0.5"], "--momentum"),
    (["compile", "m.py:build", "-o", "out", "--rounding-seed", "-1"], "--rounding-seed"),
    (["compile", "m.py:build", "-o", "out", "--classes", "0"], "--classes"),
    (["schedule", "mbv2-w0.35", "--fraction", "inf"], "--fraction"),
    (["schedule", "mbv2-w0.35", "--batch", "0"], "--batch"),
    (["schedule", "mbv2-w0.35", "--deadline", "nan"], "--deadline"),
    (["schedule", "mbv2-w0.35", "--deadline-factor", "-1"], "--deadline-factor"),
    (["schedule", "mbv2-w0.35", "--time-limit", "0"], "--time-limit"),
    (["schedule", "mbv2-w0.35", "--size", "-8"], "--size"),
    (["schedule", "mbv2-w0.35", "--ram", NINES], "--ram/--sram"),
    (["schedule", "mbv2-w0.35", "--ram", "1MB", "--fraction", "0.5"], "--fraction"),
    (["inspect", "mbv2-w0.35", "--classes", "0"], "--classes"),
    (["report", "mbv2-w0.35", "--batch", "-2"], "--batch"),
    (["demo", "--epochs", "0"], "--epochs"),
    (["demo", "--test-images", "-1"], "--test-images"),
    (["demo", "--train-images", "0"], "--train-images"),
    (["demo", "--seed", "-3"], "--seed"),
    (["train", "m.py:build", "--data", "d", "-o", "o", "--std", "-1"], "--std"),
    (["train", "m.py:build", "--data", "d", "-o", "o", "--std", "0"], "--std"),
    (["train", "m.py:build", "--data", "d", "-o", "o", "--mean", "inf"], "--mean"),
    (["train", "m.py:build", "--data", "d", "-o", "o", "--seed", "-1"], "--seed"),
])
def test_bad_numbers_are_usage_errors(cli, tmp_path, argv, option):
    """Each of these was an internal error (exit 1) or silently reinterpreted (0 images meaning
    the default, 0 classes meaning 10, a NaN deadline accepted)."""
    code, out, err = cli(*argv)
    assert code == 2, err
    assert f"usage: edgetrain {argv[0]}" in err and f"argument {option}" in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert len(err) < 2000  # a 400-digit number is not echoed whole


def test_a_flash_region_below_the_firmwares_code_is_refused(cli, model_file, tmp_path):
    """--flash 1B passed the weights check (a model with no read-only weights under full update;
    here 1KB, over this model's 72 B of batch-norm constants) and wrote a linker script that
    cannot link, exit 0."""
    out = tmp_path / "fw"
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--target", "cortex-m4", "--flash", "1KB",
                       "--no-plot", "-o", out)
    assert code == 2 and "--flash 1,024 B cannot hold the firmware" in err, err
    assert not (out / "link.ld").exists() and not (out / "program.ckpt").exists()
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--target", "host", "--flash", "1KB",
                       "--no-plot", "-o", tmp_path / "host")
    assert code == 0, err  # a host library has no flash region: the budget only bounds read-only weights


def test_sigterm_during_train_saves_and_exits_130(model_file, image_folder, tmp_path):
    """SIGTERM (a service manager stopping the job) does what Ctrl-C does: the step finishes,
    stopped.ckpt holds the state after it, exit 130, no traceback."""
    run = tmp_path / "run"
    proc = edgetrain_process("train", f"{model_file}:build", "--input", INPUT, "--data", image_folder, "-o", run,
                             "--no-progress", pause="step:5:3")
    try:
        for line in proc.stderr:
            if "paused in step 5" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    stopped = load_checkpoint(run / "stopped.ckpt")
    assert stopped.train["reason"] == "interrupted" and stopped.steps == 5


def test_ctrl_c_at_start_up_or_twice_is_quiet(cli, monkeypatch):
    """Ctrl-C before the command runs (while modules load) and a second Ctrl-C while the first
    error is being reported: exit 130 and one line, not a traceback."""
    from edgetrain.app import cli as cli_module
    from edgetrain.app import exit_codes

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(cli_module, "build_parser", interrupted)
        code, _, err = cli("profile")
    assert code == 130 and err.strip() == "edgetrain: interrupted"
    with monkeypatch.context() as m:
        m.setattr(exit_codes, "exit_code_for", interrupted)
        code, _, err = cli("profile", "--device", "no-such-device")  # an error, reported as Ctrl-C comes
    assert code == 130 and "Traceback" not in err and err.strip().endswith("edgetrain: interrupted")


def test_a_second_ctrl_c_stops_train_at_once_quietly(cli, model_file, image_folder, tmp_path, monkeypatch):
    """The first Ctrl-C asks train to stop after the step; a second one means now: exit 130 with
    one line, the checkpoints on disk untouched."""
    import os

    from edgetrain.app import cli_program

    def hook(what, value):
        if what == "step" and value == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(cli_program, "train_hook", lambda: hook)
    run = tmp_path / "run"
    code, _, err = cli("train", f"{model_file}:build", "--input", INPUT, "--data", image_folder, "-o", run,
                       "--no-progress", "-q")  # -q: no progress lines (on stderr), so the error is all there is
    assert code == 130 and err.strip() == "edgetrain train: interrupted", err
    assert not run.exists() or not any(p.suffix == ".ckpt" for p in run.iterdir())


COMMANDS = ("compile", "train", "export", "inspect", "demo", "profile", "schedule", "report")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(cli, command):
    code, out, _ = cli(command, "--help")
    assert code == 0
    usage, description = out.split("\n\n")[:2]
    assert usage.startswith(f"usage: edgetrain {command}")
    assert len(description.split()) >= 12, description  # a sentence or more, not the one-line summary
    assert "example" in out and f"  edgetrain {command} " in out
    assert "exit codes:" in out and "130  interrupted" in out
    if "--update" in out:
        assert "--update SCHEME" in out and "--update UPDATE" not in out


def test_version_and_consistent_names(cli):
    from edgetrain import __version__
    from edgetrain.app.cli import build_parser

    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"edgetrain {__version__}"
    p = build_parser()
    # the RAM budget has both spellings on every command that takes one
    for spelling in ("--sram", "--ram"):
        assert p.parse_args(["compile", "m", "-o", "o", spelling, "64KB"]).sram == "64KB"
        assert p.parse_args(["train", "m", "--data", "d", "-o", "o", spelling, "64KB"]).sram == "64KB"
        assert p.parse_args(["schedule", "m", spelling, "64KB"]).ram == "64KB"
        assert p.parse_args(["report", "m", spelling, "64KB"]).ram == "64KB"


def test_update_reads_the_same_everywhere(cli):
    """--update SCHEME reads full, bias, last:K on every command; auto (compile and train only)
    is refused by the others with the command that takes it."""
    from edgetrain.app.cli import build_parser

    p = build_parser()
    for command in (["inspect", "m"], ["schedule", "m"], ["report", "m"]):
        assert p.parse_args([*command, "--update", "LAST:3"]).update == "last:3"
    assert p.parse_args(["compile", "m", "-o", "o", "--update", "Bias"]).update_spec == "bias"
    code, _, err = cli("inspect", "mbv2-w0.35", "--update", "auto")
    assert code == 2 and "edgetrain compile MODEL --update auto --contributions" in err, err


@pytest.mark.parametrize("argv,usage,hint", [
    (["schedule", "mbv2-w0.35", "--sramm", "3KB"], "usage: edgetrain schedule", "did you mean --ram?"),
    (["compile", "m.py:build", "-o", "o", "--flsh", "1MB"], "usage: edgetrain compile", "did you mean --flash?"),
    (["demo", "--epoch", "2", "--tsk", "digits"], "usage: edgetrain demo", "did you mean --task?"),
    (["profile", "extra"], "usage: edgetrain profile", "unrecognized arguments: extra"),
])
def test_a_mistyped_option_gets_the_commands_usage(cli, argv, usage, hint):
    code, _, err = cli(*argv)
    assert code == 2 and err.startswith(usage) and hint in err, err


LIGHT_CHECK = """
import sys
from edgetrain.app.cli import main
codes = []
for argv in (["--help"], ["--version"], ["compile", "--help"], ["schedule", "--help"], ["train", "--help"],
             ["schedule", "mbv2-w0.35", "--batch", "0"], ["compile", "m.py:b", "-o", "o", "--sram", "lots"],
             ["demo", "--epochs", "0"], ["inspect", "m", "--nope"]):
    try:
        codes.append(main(argv))
    except SystemExit as e:
        codes.append(e.code)
heavy = sorted(m for m in ("torch", "numpy", "scipy", "matplotlib") if m in sys.modules)
import edgetrain as et
light_package = "torch" not in sys.modules
compile_fn = et.compile  # imports torch now
import edgetrain.remat.plan
print(json.dumps({"codes": codes, "heavy": heavy, "light_package": light_package,
                  "compile": compile_fn.__module__, "schedule": et.schedule.__module__,
                  "torch_after": "torch" in sys.modules}))
"""


def test_help_and_usage_errors_do_not_import_torch():
    """`edgetrain --help` took 4 s importing torch first: help, --version and usage errors now
    answer before any heavy import, and `import edgetrain` alone is light too."""
    r = subprocess.run([sys.executable, "-c", "import json\n" + LIGHT_CHECK], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["codes"] == [0, 0, 0, 0, 0, 2, 2, 2, 2]
    assert got["heavy"] == [] and got["light_package"]
    assert got["compile"] == "edgetrain.api" and got["schedule"] == "edgetrain.remat.solve" and got["torch_after"]
