"""Fast defaults and honest output (issue 34, items 2-4): one rule for the default backend of
every command ("c" with a host C compiler, else "reference"), a build past a second says what it
builds and why with its elapsed time, and the demo names its target device, shows the program
that fits it beside the host fine-tune, explains its fallback to digits and shows progress."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest

from edgetrain.app.cli import build_parser
from edgetrain.backends.c import front_pch, kernel_lib, toolchain
from edgetrain.backends.c.toolchain import ToolResult

from .conftest import INPUT


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    """A PATH with no C compiler on it and no $CC: what a machine without one looks like."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)


def _config(argv):
    from edgetrain.app.cli_config import config_from_options

    args = build_parser().parse_args(argv)
    return config_from_options(args, args.model)


def _commands(model_file):
    return (["compile", f"{model_file}:build", "--input", INPUT, "-o", "out"],
            ["train", f"{model_file}:build", "--input", INPUT, "--data", "photos", "-o", "out"])


def test_the_default_backend_is_c_with_a_compiler(model_file):
    if toolchain.host_compiler() is None:
        pytest.skip("no host C compiler on this machine")
    assert toolchain.default_backend() == "c"
    for argv in _commands(model_file):
        assert _config(argv).backend == "c", argv
        assert _config(argv + ["--backend", "reference"]).backend == "reference", argv


def test_the_default_backend_is_reference_without_a_compiler(model_file, no_compiler):
    from edgetrain.app.cli_federate import default_backend as federate_default

    assert toolchain.host_compiler() is None
    assert toolchain.default_backend() == "reference"
    assert federate_default() == "reference"  # federate: the same rule
    for argv in _commands(model_file):
        assert _config(argv).backend == "reference", argv
        assert _config(argv + ["--backend", "c"]).backend == "c", argv  # asked for: kept (and fails to build)


def test_cc_names_the_compiler(tmp_path, monkeypatch):
    cc = tmp_path / "my-cc"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "my-cc")
    assert toolchain.host_compiler() == str(cc)
    assert toolchain.default_backend() == "c"


@pytest.mark.parametrize("command", ["compile", "train", "demo", "federate"])
def test_every_backend_option_states_the_rule(cli, command):
    _, out, _ = cli(command, "--help")
    text = " ".join(out.split())
    assert "--backend" in text and "C compiler is found" in text, command


# --- a build past a second says what and why -------------------------------------------------------
def test_a_long_build_says_what_and_why_with_its_elapsed_time(caplog, capsys):
    caplog.set_level(logging.INFO, logger="edgetrain")
    with toolchain.announced_build("the thing", "it is not cached", after=0.05):
        time.sleep(0.4)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "building the thing (it is not cached)"
    assert lines[-1].startswith("built the thing in ")
    assert "building: 00:00 elapsed" in capsys.readouterr().err  # the progress line, on stderr


def test_a_quick_build_says_nothing(caplog, capsys):
    caplog.set_level(logging.INFO, logger="edgetrain")
    with toolchain.announced_build("the thing", "it is not cached", after=5):
        pass
    assert not caplog.records and capsys.readouterr().err == ""


def test_a_quiet_command_shows_no_build_progress(caplog, capsys):
    caplog.set_level(logging.WARNING, logger="edgetrain")
    with toolchain.announced_build("the thing", "it is not cached", after=0.01):
        time.sleep(0.2)
    assert not caplog.records and capsys.readouterr().err == ""


KERNEL_HEADER = "ET_INLINE void et_twice(float *x, int n) {\n" + "    x[0] *= 2;\n" * 7 + "}\n"


def _slow_compiler(seconds, calls):
    """A stand-in for run_tool: `--version` at once; a compile waits `seconds`, then writes its -o."""
    def run(argv, cwd=None, timeout=None):
        calls.append(list(argv))
        if "--version" in argv:
            return ToolResult(0, "cc (fake) 1.0\n", "")
        if "-dM" in argv:  # front_pch.is_gcc: its predefined macros
            return ToolResult(0, "#define __GNUC__ 1\n", "")
        time.sleep(seconds)
        Path(cwd, argv[argv.index("-o") + 1]).write_bytes(b"\0")
        return ToolResult(0, "", "")
    return run


def test_the_kernel_library_and_a_program_build_say_what_and_why(tmp_path, monkeypatch, caplog, capsys):
    from edgetrain.backends.c import host

    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(toolchain, "ANNOUNCE_AFTER_S", 0.05)
    calls: list = []
    fake = _slow_compiler(0.3, calls)
    monkeypatch.setattr(kernel_lib, "run_tool", fake)
    monkeypatch.setattr(kernel_lib, "run_tools", lambda argvs, cwd, timeout, jobs: [fake(a, cwd, timeout) for a in argvs])
    monkeypatch.setattr(host, "run_tool", fake)
    monkeypatch.setattr(front_pch, "run_tool", fake)
    kernel_lib.compiler_version.cache_clear()
    front_pch.is_gcc.cache_clear()
    caplog.set_level(logging.INFO, logger="edgetrain")
    files = {"et_fake.h": KERNEL_HEADER, "model.c": "void f(float *x) { et_twice(x, 1); }\n"}
    try:
        lib = host.build_library(files, ("-O2",))
    finally:
        kernel_lib.compiler_version.cache_clear()
        front_pch.is_gcc.cache_clear()
    assert lib.is_file()
    lines = [r.getMessage() for r in caplog.records]
    kernels = [ln for ln in lines if ln.startswith("building the runtime's kernel library (1 kernel,")]
    assert len(kernels) == 1 and "first use" in kernels[0] and str(tmp_path / "cache" / "c") in kernels[0]
    headers = [ln for ln in lines if ln.startswith("building the runtime headers, precompiled (et_front.h.gch)")]
    assert len(headers) == 1 and "first use" in headers[0] and str(tmp_path / "cache" / "c") in headers[0]
    program = [ln for ln in lines if ln.startswith("building this program's C library")]
    assert len(program) == 1 and "not in the cache" in program[0] and str(tmp_path / "cache" / "c") in program[0]
    assert [ln.split(" in ")[0] for ln in lines if ln.startswith("built ")] == [
        "built the runtime's kernel library (1 kernel, et_kernels.o)",
        "built the runtime headers, precompiled (et_front.h.gch)", "built this program's C library (libmodel.so)"]
    err = capsys.readouterr().err
    assert "building: 00:00 elapsed" in err and err.count("\n") == 3  # one progress line per build
    # built: the second time nothing is compiled and nothing said
    caplog.clear()
    n = len(calls)
    assert host.build_library(files, ("-O2",)) == lib and len(calls) == n and not caplog.records


# --- the demo ------------------------------------------------------------------------------------------
def test_missing_assets_says_what_where_and_how(tmp_path, monkeypatch):
    from edgetrain.app import demo
    from edgetrain.data import assets

    monkeypatch.delenv("EDGETRAIN_ASSETS", raising=False)
    monkeypatch.setattr(assets, "checkout_assets_dir", lambda: None)
    text = demo.missing_assets()
    assert "mbv2-w0.35.pkl" in text and "no assets folder is set" in text and "--assets DIR" in text
    assert "github.com/mit-han-lab/tiny-training" in text and "cifar-10-python.tar.gz" in text
    folder = tmp_path / "assets"
    (folder / "tiny-training").mkdir(parents=True)
    (folder / demo.MBV2_FILE).write_bytes(b"x")
    text = demo.missing_assets(folder)
    assert "missing CIFAR-10" in text and "mbv2" not in text.split("missing")[1].split(";")[0]
    assert f"looked in {folder} (from --assets)" in text
    (folder / "cifar-10-batches-py").mkdir()
    assert demo.missing_assets(folder) is None and demo.resolve_task("auto", folder) == "cifar10"


def test_the_demo_names_its_device_the_program_that_fits_it_and_its_fallback(cli, tmp_path, monkeypatch):
    """The whole digits demo on 48 training and 32 test images (MNIST replaced by random digits:
    the lines are under test, not the accuracy), on the reference backend."""
    rng = np.random.default_rng(0)
    monkeypatch.setattr("edgetrain.data.load_mnist", lambda split, n: (
        rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)))
    code, out, err = cli("demo", "--assets", tmp_path / "nothing", "--train-images", 48, "--test-images", 32,
                         "--backend", "reference")
    assert code in (0, demo_exit_not_improved())
    lines = out.splitlines()
    assert lines[0].startswith("the paper's model was not found for the cifar10 task: missing "
                               "tiny-training/mbv2-w0.35.pkl")
    assert f"looked in {tmp_path / 'nothing'} (from --assets, which does not exist)" in lines[0]
    assert lines[0].endswith("Running the digits task instead.")
    assert any(ln.startswith("target device: STM32F746 (Cortex-M7, 216 MHz), 256 KB of SRAM") for ln in lines)
    fits = next(ln for ln in lines if "the program that fits it" in ln)
    assert "batch 1, SGD without momentum, sparse update" in fits and "fits 256 KB" in fits
    host = next(ln for ln in lines if "the host fine-tune this demo runs" in ln)
    assert "batch 16, SGD with momentum 0.9, full update" in host and "does NOT fit 256 KB" in host
    assert "reference backend" in out
    for bar in ("int8 accuracy before", "int8 accuracy after", "epoch 1/1"):  # progress, on stderr
        assert bar in err and bar not in out, bar
    assert "Traceback" not in err
    peak = float(fits.split("peak ")[1].split(" KB")[0])
    assert 0 < peak <= 256



def test_the_demo_on_threads(cli, tmp_path, monkeypatch):
    """--threads N: the host fine-tune on the C library built with OpenMP; refused, before any data
    is read, on the reference backend."""
    code, _, err = cli("demo", "--assets", tmp_path / "nothing", "--backend", "reference", "--threads", 2)
    assert code == 2 and "--threads applies to the C backend, not the reference one" in err, err
    rng = np.random.default_rng(0)
    monkeypatch.setattr("edgetrain.data.load_mnist", lambda split, n: (
        rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)))
    code, out, err = cli("demo", "--assets", tmp_path / "nothing", "--train-images", 32, "--test-images", 16,
                         "--backend", "c", "--threads", 2)
    assert code in (0, demo_exit_not_improved()), err
    assert "c backend on 2 threads" in out and "Traceback" not in err


def demo_exit_not_improved():
    from edgetrain.app.exit_codes import NOT_IMPROVED

    return NOT_IMPROVED


def test_a_build_inside_a_phase_shows_one_progress_line(caplog, capsys):
    caplog.set_level(logging.INFO, logger="edgetrain")
    with toolchain.elapsed_progress("the phase", after=0.05):
        time.sleep(0.2)
        with toolchain.announced_build("the thing", "it is not cached", after=0.05):
            time.sleep(0.3)
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "building the thing (it is not cached)", "built the thing"]
    err = capsys.readouterr().err
    assert "the phase: 00:00 elapsed" in err and "building:" not in err  # the outer line only


def test_train_says_which_backend_it_runs_on(cli, model_file, image_folder, tmp_path, no_compiler):
    """Without a compiler the default is the reference runtime, and train says so."""
    code, out, err = cli("train", f"{model_file}:build", "--input", INPUT, "--data", image_folder, "--epochs", "1",
                         "--no-progress", "-o", tmp_path / "run")
    assert code == 0, err
    assert "on the reference backend" in out + err


def test_verify_compares_with_the_reference_runtime_on_the_c_backend():
    """compile --verify's reference losses come from the reference runtime, whatever backend
    the program runs on (C by default now)."""
    import torch

    import edgetrain as et
    from edgetrain.app.cli_compile import _reference_of

    if toolchain.host_compiler() is None:
        pytest.skip("no host C compiler on this machine")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 3))
    prog = et.compile(model, (torch.randn(2, 3, 8, 8),), loss="cross_entropy", backend="c")
    spec = _reference_of(prog)
    assert prog.backend == "c" and spec.backend == "reference"
    x, y = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32), np.array([0, 2])
    assert spec.step(x, y) == pytest.approx(prog.step(x, y), rel=1e-5)
