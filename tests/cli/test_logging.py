"""Messages through `logging` (issue 34, item 8): the library logs to the "edgetrain" logger,
which shows nothing unless the program configures logging; the command line writes its
progress lines to stderr at INFO, -v adds debug lines, -q leaves warnings and errors only,
before or after the command."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from edgetrain.app.cli_logging import LOGGER

from .conftest import INPUT


def _compile(model_file, out, *flags):
    return ("compile", f"{model_file}:build", "--input", INPUT, "--target", "host", "--backend", "reference",
            "--no-plot", "-o", out, *flags)


LIBRARY_USER = """
import logging, torch, edgetrain as et
net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 3))
prog = et.compile(net, (torch.randn(2, 1, 8, 8),), update=et.LastK(1))
prog.step(torch.randn(2, 1, 8, 8).numpy(), torch.tensor([0, 2]).numpy())
logging.getLogger("edgetrain.user_test").warning("a warning no handler shows")
"""


def test_a_library_user_sees_nothing_by_default():
    """A compile, a step and even a warning record print nothing: the "edgetrain" logger has a
    NullHandler (so Python's last-resort handler stays silent) and no level of its own."""
    r = subprocess.run([sys.executable, "-c", LIBRARY_USER], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""


def test_a_library_user_captures_the_records(caplog):
    import torch

    import edgetrain as et

    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger(LOGGER).handlers)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 3))
    et.compile(net, (torch.randn(2, 1, 8, 8),), update=et.LastK(1))
    steps = [r.getMessage() for r in caplog.records if r.name == "edgetrain.pipeline"]
    assert steps and steps[0].startswith("compiler step captured: ") and all(r.levelno == logging.DEBUG
                                                                             for r in caplog.records)


def test_the_cli_prints_progress_on_stderr_and_quiet_silences_it(cli, model_file, tmp_path):
    code, out, err = cli(*_compile(model_file, tmp_path / "a"))
    assert code == 0, err
    assert out == "" and err.startswith(f"compiled {model_file}:build") and "wrote the host project" in err
    assert "debug:" not in err
    for argv in (_compile(model_file, tmp_path / "b", "-q"), ("-q", *_compile(model_file, tmp_path / "c")),
                 _compile(model_file, tmp_path / "d", "--quiet")):
        code, out, err = cli(*argv)
        assert code == 0 and out == "" and err == "", (argv, err)
    assert (tmp_path / "b" / "program.ckpt").is_file() and (tmp_path / "c" / "program.ckpt").is_file()


def test_verbose_adds_debug_lines(cli, model_file, tmp_path):
    for argv in (_compile(model_file, tmp_path / "a", "-v"), ("--verbose", *_compile(model_file, tmp_path / "b"))):
        code, _, err = cli(*argv)
        assert code == 0, err
        lines = err.splitlines()
        assert f"compiled {model_file}:build" in err  # the INFO lines as without -v
        assert any(line.startswith("edgetrain compile: debug: compiler step captured: ") for line in lines), err


def test_quiet_still_prints_an_error_and_its_exit_code(cli, model_file, tmp_path):
    code, out, err = cli(*_compile(model_file, tmp_path / "small", "-q", "--sram", "4KB"))
    assert code == 3 and out == ""
    assert err.startswith("edgetrain compile: error: ") and len(err.strip().splitlines()) == 1


def test_verbose_and_quiet_exclude_each_other(cli, model_file, tmp_path):
    code, _, err = cli("-v", *_compile(model_file, tmp_path / "x", "-q"))
    assert code == 2 and "-v/--verbose and -q/--quiet exclude each other" in err
    assert not (tmp_path / "x").exists()


def test_the_cli_leaves_the_logger_as_it_found_it(cli, model_file, tmp_path):
    logger = logging.getLogger(LOGGER)
    handlers, level = list(logger.handlers), logger.level
    code, _, err = cli(*_compile(model_file, tmp_path / "a", "-v"))
    assert code == 0, err
    assert logger.handlers == handlers and logger.level == level


@pytest.mark.parametrize("flag", ["-v", "--verbose", "-q", "--quiet"])
def test_every_command_takes_the_verbosity_flags(cli, flag):
    from edgetrain.app.cli import _subparsers, build_parser

    for name, command in _subparsers(build_parser()).items():
        assert flag in command._option_string_actions, (name, flag)
    code, out, _ = cli("--help")
    assert code == 0 and "--verbose" in out and "--quiet" in out
