"""The command line's probes, round 2 (issue 34, items 5, 6, 21, 22 and 23): --traceback after
the command; exit 1 only for a bug (its traceback saved to a file the message names), 2 for the
user's input, demo's "no improvement" its own code, every --help's table true; a signal at any
moment of start-up ends in exit 130 and one line; every count, size and seed has an upper bound
its help states; a results line nested 100k deep is a ScaleError; a single-class image folder
trains with a one-line warning."""
from __future__ import annotations

import argparse

import errno
import re
import signal

import pytest

from .conftest import INPUT, make_image_folder


# --- item 5: --traceback before or after the command ---------------------------------------------
@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_is_accepted_before_or_after_the_command(cli, where):
    """`edgetrain profile ... --traceback` was "unrecognized arguments" (a top-level option only)."""
    argv = ["profile", "--device", "no-such-device"]
    argv = ["--traceback", *argv] if where == "before" else [*argv, "--traceback"]
    code, _, err = cli(*argv)
    assert code == 2, err
    assert "unrecognized" not in err and "Traceback (most recent call last)" in err
    assert err.strip().endswith("edgetrain profile: error: unknown device 'no-such-device': use one of m0, m4f, m7, "
                                "a72, tx2, host (or a Device; edgetrain.devices.calibrate_host() measures this "
                                "machine)")


def test_every_command_takes_traceback():
    from edgetrain.app.cli import _subparsers, build_parser

    p = build_parser()
    for name, command in _subparsers(p).items():
        assert "--traceback" in command.format_help(), name
        assert p.parse_args([*_minimal(name), "--traceback"]).traceback is True, name
        assert p.parse_args(_minimal(name)).traceback is False, name


def _minimal(command: str) -> list[str]:
    return {"compile": ["compile", "m", "-o", "o"], "train": ["train", "--data", "d", "-o", "o"],
            "export": ["export", "c", "-o", "o"], "federate": ["federate", "m", "--data", "d"],
            "inspect": ["inspect", "m"], "schedule": ["schedule", "m"], "report": ["report", "m"]}.get(command,
                                                                                                   [command])


# --- item 6: exit codes ---------------------------------------------------------------------------
@pytest.fixture
def failing_profile(monkeypatch, tmp_path):
    """set(error) makes `edgetrain profile` raise `error`; tracebacks are saved under tmp_path."""
    import tempfile

    from edgetrain.app import cli as cli_module

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def make(error):
        def fail(args):
            raise error

        monkeypatch.setattr(cli_module, "_profile", fail)

    return make


@pytest.mark.parametrize("error", [TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'"),
                                   RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
                                   FileNotFoundError(errno.ENOENT, "No such file or directory",
                                                     "/nonexistent/edgetrain-cache/kernels.so"),
                                   KeyError("weight"), AttributeError("'NoneType' object has no attribute 'shape'")])
def test_a_bug_is_exit_1_with_its_traceback_saved(cli, failing_profile, tmp_path, error):
    """A TypeError, RuntimeError or OSError raised inside edgetrain was exit 2 "bad usage or input",
    with no traceback anywhere: bugs looked like the user's mistakes."""
    failing_profile(error)
    code, _, err = cli("profile")
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgetrain profile: internal error: {type(error).__name__}: ")
    saved = re.search(r"its traceback is in (\S+); please report it", lines[0])
    assert saved, lines[0]
    text = open(saved.group(1)).read()
    assert saved.group(1).startswith(str(tmp_path))
    assert "command: edgetrain profile" in text and "Traceback (most recent call last)" in text
    assert f"{type(error).__name__}: " in text and "in fail" in text


@pytest.mark.parametrize("error,code", [
    (ValueError("--input: expected a shape"), 2),
    (PermissionError(errno.EACCES, "Permission denied", "OUT/memory.json"), 2),  # under the -o the user named
    (NotADirectoryError("OUT is a file, not a folder: give -o a folder"), 2),  # the path named in the message
    (OSError(errno.ENOSPC, "No space left on device"), 2),  # the disk the user writes to is full
    (PermissionError(errno.EACCES, "Permission denied", "/root/.cache/edgetrain/lib.so"), None),  # not the user's
    (RuntimeError("CUDA error"), None), (TypeError("bad argument"), None),
    (MemoryError(), 2),  # what the input asked for does not fit this machine
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to "
                  "allocate 4800000000000 bytes"), 2),
])
def test_exit_2_is_the_users_input_and_an_oserror_elsewhere_is_a_bug(tmp_path, error, code):
    from edgetrain.app.exit_codes import exit_code_for

    out = str(tmp_path / "report")
    if isinstance(error, OSError) and error.filename:
        error.filename = error.filename.replace("OUT", out)
    elif "OUT" in str(error):
        error = type(error)(str(error).replace("OUT", out))
    assert exit_code_for(error, ["mbv2-w0.35", out, "a72"]) == code


def test_another_librarys_error_is_one_line(cli, failing_profile):
    """A huge --batch printed torch's message with its 20-line C++ backtrace (exit 2)."""
    failing_profile(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9e15 bytes\n"
                                 "Exception raised from alloc_cpu at ../c10/core/impl/alloc_cpu.cpp:90\n"
                                 "frame #0: c10::Error::Error(...) + 0x96"))
    code, _, err = cli("profile")
    assert code == 2 and err.strip() == ("edgetrain profile: error: DefaultCPUAllocator: can't allocate memory: you "
                                         "tried to allocate 9e15 bytes"), err


def test_the_projects_own_data_errors_are_exit_2(image_folder):
    from edgetrain.app.exit_codes import exit_code_for
    from edgetrain.backends.c import CBackendError
    from edgetrain.data.folder import FolderError
    from edgetrain.safepickle import Refused

    assert exit_code_for(FolderError("2 of 9 images cannot be read")) == 2  # a RuntimeError of ours
    assert exit_code_for(Refused("refused to load: it asks for posix.system")) == 2
    assert exit_code_for(CBackendError("cc failed")) == 5
    assert exit_code_for(KeyboardInterrupt()) == 130


def test_demo_without_improvement_has_its_own_exit_code(cli, monkeypatch):
    """demo documented exit 1 for "accuracy did not improve", the code of a bug."""
    from edgetrain.app import demo
    from edgetrain.app.exit_codes import NOT_IMPROVED

    monkeypatch.setattr(demo, "run_demo", lambda cfg: {"before": 0.5, "after": 0.5})
    code, _, err = cli("demo", "--task", "digits")
    assert code == NOT_IMPROVED and NOT_IMPROVED not in (0, 1, 2, 3, 4, 5, 130), err
    monkeypatch.setattr(demo, "run_demo", lambda cfg: {"before": 0.5, "after": 0.6})
    assert cli("demo", "--task", "digits")[0] == 0


def test_every_commands_exit_code_table_is_its_own_and_true(cli):
    from edgetrain.app.cli import _subparsers, build_parser
    from edgetrain.app.exit_codes import COMMAND_EXIT_CODES, EXIT_CODE_LINES, NOT_IMPROVED

    commands = _subparsers(build_parser())
    assert set(commands) == set(COMMAND_EXIT_CODES)
    for name in commands:
        code, out, _ = cli(name, "--help")
        assert code == 0
        table = out[out.index("exit codes:"):]
        listed = [int(m.group(1)) for m in re.finditer(r"^\s*(\d+)  ", table, re.M)]
        assert listed == list(COMMAND_EXIT_CODES[name]), name
        assert "1  internal error: a bug" in table and "saved" in table
    _, out, _ = cli("demo", "--help")
    assert f"{NOT_IMPROVED} when it did not" in " ".join(out.split())
    assert "1 otherwise" not in " ".join(out.split())
    code, out, _ = cli("--help")
    assert all(line in out for line in EXIT_CODE_LINES.values())


# --- item 21: a signal at any moment of start-up ----------------------------------------------------
#: seconds after main() started (it imports cli_program to build the parser), through `import torch`
#: (where 8 of 12 probes ended in a traceback and exit 1) and the first compile; counted from there,
#: not from the spawn, so that a loaded machine's slow interpreter start does not move them (a
#: signal in Python's own start-up, before edgetrain's code runs, gets Python's default)
DELAYS_S = (0.0, 0.1, 0.25, 0.5, 1.0)
MAIN_STARTED = "| edgetrain.app.cli_program"  # -X importtime's line for that import


def _interrupt_at(sig, delay: float) -> tuple[int, str]:
    """(exit code, stderr without -X importtime's lines) of `inspect resnet18` sent `sig` `delay`
    seconds after its main() started."""
    import os
    import subprocess
    import sys
    import threading
    import time

    # the CLI started with SIGINT at its default, through a first interpreter that sets it and execs: a shell
    # starts a background job with SIGINT ignored, and Python then installs no handler of its own (the
    # README's test command run with `&` failed here)
    default_sigint = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", default_sigint, "-X", "importtime", "-m", "edgetrain.app.cli",
                             "inspect", "resnet18"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines: list[str] = []
    started = threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if MAIN_STARTED in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(120), "".join(lines[-20:])
        time.sleep(delay)
        proc.send_signal(sig)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    return proc.returncode, "".join(line for line in lines if not line.startswith("import time:"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_start_up_is_exit_130_and_one_line(sig):
    seen = [(delay, *_interrupt_at(sig, delay)) for delay in DELAYS_S]
    bad = [(d, rc, e[-600:]) for d, rc, e in seen if rc != 130 or "Traceback" in e or len(e.strip().splitlines()) != 1
           or not e.strip().endswith("interrupted")]
    assert not bad, bad


def test_an_interrupt_reports_without_importing_anything(cli, monkeypatch):
    """The handler imported edgetrain.api (and so torch) to classify an interrupt: with torch half
    loaded by the interrupted import, that import raised again, out of main(), with a traceback."""
    from edgetrain.app import cli as cli_module
    from edgetrain.app import exit_codes

    def interrupted(args):
        raise KeyboardInterrupt

    def broken(*a, **kw):
        raise AttributeError("partially initialized module 'torch' has no attribute 'autograd'")

    monkeypatch.setattr(cli_module, "_profile", interrupted)
    monkeypatch.setattr(exit_codes, "exit_code_for", broken)
    code, _, err = cli("profile")
    assert code == 130 and err.strip() == "edgetrain profile: interrupted", err



def test_an_interrupt_a_library_swallows_still_stops_with_130(cli, monkeypatch):
    """CI once saw `inspect` exit 0 with no word after a SIGINT at start-up: the KeyboardInterrupt
    was caught by code the command ran (a bare `except:`). main() records the signal itself."""
    import os

    from edgetrain.app import cli as cli_module

    def swallows(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: B036 (the library's bare except, on purpose)
            pass
        return 0

    monkeypatch.setattr(cli_module, "_profile", swallows)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell (xdist's workers ignore it)
    try:
        code, _, err = cli("profile")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, outer)
    assert code == 130 and err.strip() == "edgetrain: interrupted", err


def test_a_signal_inside_the_torch_import_waits_for_its_end():
    """SIGINT inside `import torch`'s C++ start-up aborted the process (exit -6, a C++ stack): the
    import runs with signals held, and the signal takes effect when it ends."""
    import os

    from edgetrain.app.interrupts import deferred_interrupts

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    reached = False
    try:
        with pytest.raises(KeyboardInterrupt):
            with deferred_interrupts():
                os.kill(os.getpid(), signal.SIGINT)
                reached = True
        assert reached and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with deferred_interrupts():  # nothing held: nothing raised
            pass
    finally:
        signal.signal(signal.SIGINT, outer)


def test_torch_is_imported_with_signals_held_before_anything_else_can_import_it(cli, monkeypatch):
    """CI saw exit -6 again with the held import placed after --update's parsing, which imports
    edgetrain.sparse and so torch: the held import comes first."""
    from contextlib import contextmanager

    from edgetrain.app import cli as cli_module

    order = []

    @contextmanager
    def held():
        order.append("held")
        yield

    def scheme(text):
        order.append("update")
        raise KeyboardInterrupt  # stop there

    monkeypatch.setattr(cli_module, "deferred_interrupts", held)
    monkeypatch.setattr(cli_module, "_scheme", scheme)
    code, _, _ = cli("inspect", "mbv2-w0.35", "--update", "full")
    assert code == 130 and order == ["held", "update"]


def test_the_commands_that_import_torch_first_are_the_commands_but_profile():
    from edgetrain.app.cli import TORCH_COMMANDS, _subparsers, build_parser

    assert TORCH_COMMANDS == set(_subparsers(build_parser())) - {"profile"}

# --- item 22: every count, size and seed has an upper bound -------------------------------------------
HUGE = "99999999999999999999"


@pytest.mark.parametrize("argv,option", [
    (["compile", "m.py:build", "-o", "out", "--samples", HUGE], "--samples"),
    (["compile", "m.py:build", "-o", "out", "--momentum", "1e308"], "--momentum"),
    (["compile", "m.py:build", "-o", "out", "--weight-decay", "1e308"], "--weight-decay"),
    (["compile", "m.py:build", "-o", "out", "--classes", HUGE], "--classes"),
    (["compile", "m.py:build", "-o", "out", "--rounding-seed", HUGE], "--rounding-seed"),
    (["compile", "m.py:build", "-o", "out", "--calibrate-images", HUGE], "--calibrate-images"),
    (["federate", "digitnet", "--data", "mnist", "--workers", "100000"], "--workers"),
    (["federate", "digitnet", "--data", "mnist", "--clients", "100000"], "--clients"),
    (["federate", "digitnet", "--data", "mnist", "--batch", HUGE], "--batch"),
    (["schedule", "mbv2-w0.35", "--fraction", "1e308"], "--fraction"),
    (["schedule", "mbv2-w0.35", "--deadline-factor", "1e308"], "--deadline-factor"),
    (["schedule", "mbv2-w0.35", "--time-limit", "1e308"], "--time-limit"),
    (["schedule", "mbv2-w0.35", "--batch", HUGE], "--batch"),
    (["schedule", "mbv2-w0.35", "--size", HUGE], "--size"),
    (["inspect", "mbv2-w0.35", "--classes", HUGE], "--classes"),
    (["train", "m.py:build", "--data", "d", "-o", "o", "--epochs", HUGE], "--epochs"),
    (["train", "m.py:build", "--data", "d", "-o", "o", "--limit", HUGE], "--limit"),
    (["demo", "--seed", str(2 ** 64)], "--seed"),
])
def test_values_nothing_can_do_are_one_line_usage_errors(cli, argv, option):
    """--samples 1e20 grew memory without bound, --workers 100000 hung in Ray, --fraction 1e308
    was an OverflowError (exit 1), --momentum 1e308 compiled an infinite momentum (exit 0), and
    a huge --batch / --size / --classes printed torch's 20-line C++ backtrace."""
    code, _, err = cli(*argv)
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"edgetrain {argv[0]}: error: argument {option}"), err
    assert "at most" in last or re.search(r"from [01] to [0-9,]+, got", last), last
    assert "Traceback" not in err and "C++" not in err and len(err) < 2000


def _bounded(action) -> bool:
    name = getattr(action.type, "__name__", "")
    return name.startswith(("count_at_most_", "number_at_most_")) or name == "seed"


def test_every_count_size_and_seed_states_its_bound():
    """No option reads an unbounded integer, and each bounded one says its bound in --help."""
    from edgetrain.app.cli import _subparsers, build_parser

    for name, command in _subparsers(build_parser()).items():
        for a in command._actions:
            if a.type is int or getattr(a.type, "__name__", "") in ("positive_int", "nonnegative_int"):
                assert a.choices, f"{name} {a.option_strings}: an integer with no upper bound"
            if _bounded(a) and a.help != argparse.SUPPRESS:  # a hidden deprecated alias is bounded, unlisted
                assert "at most" in a.help, f"{name} {a.option_strings}: {a.help!r}"


def test_workers_are_held_to_this_machines_cpus(cli, monkeypatch):
    import os

    from edgetrain.federated.flower import check_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert check_workers(4) == 4
    with pytest.raises(ValueError, match="this machine has 4 CPUs"):
        check_workers(5)
    code, _, err = cli("federate", "digitnet", "--data", "mnist", "--workers", "64", "--clients", "2")
    assert code == 2 and err.strip() == ("edgetrain federate: error: 64 workers: this machine has 4 CPUs and Ray "
                                         "starts a process for each worker; use at most 4"), err


# --- item 23: a results line nested deep; a single-class image folder ----------------------------------
def test_a_results_line_nested_100k_deep_is_a_scale_error(tmp_path):
    from edgetrain.scale import ResultsFile, ScaleError

    path = tmp_path / "r.jsonl"
    ResultsFile(path, "job").append("a", 1)
    with open(path, "ab") as f:
        f.write(b'{"key": "b", "value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    with pytest.raises(ScaleError, match="line 3 is damaged"):
        ResultsFile(path, "job").load()
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ScaleError, match="cannot be saved as JSON"):
        ResultsFile(tmp_path / "s.jsonl", "job").append("c", deep)


def test_a_single_class_image_folder_warns(tmp_path):
    from edgetrain.data.folder import SingleClassWarning, load_images

    one = make_image_folder(tmp_path / "one", classes=("cat",))
    with pytest.warns(SingleClassWarning, match="a single class cannot teach a classifier"):
        load_images(str(one), (3, 16, 16))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", SingleClassWarning)
        load_images(str(one), (3, 16, 16), split="test")  # validating on one class is fine
        load_images(str(make_image_folder(tmp_path / "two", classes=("cat", "dog"))), (3, 16, 16))


def test_train_on_a_single_class_says_so_in_one_line(cli, model_file, tmp_path):
    one = make_image_folder(tmp_path / "one", classes=("cat",))
    code, _, err = cli("train", f"{model_file}:build", "--input", INPUT, "--data", one, "-o", tmp_path / "run",
                       "--no-progress")
    assert code == 0, err
    warned = [line for line in err.splitlines() if "single class" in line]
    assert warned == [f"edgetrain train: warning: {one}: all 6 training images are of one class ('cat'); a single "
                      f"class cannot teach a classifier: add a folder per class"], err
