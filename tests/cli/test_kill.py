"""Crash safety of `edgetrain train`: the process is killed (SIGKILL) in the middle of writing
a checkpoint and in the middle of an epoch, or interrupted (Ctrl-C) mid-epoch; the checkpoint
on disk is always a complete one, and resuming ends with the weights of an uninterrupted run."""
from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from edgetrain.app.checkpoint import TMP_PREFIX, latest_checkpoint, load_checkpoint
from edgetrain.app.outlock import LOCK_NAME

from .conftest import IMAGES_PER_CLASS, INPUT, edgetrain_process

EPOCHS = 3
STEPS_PER_EPOCH = 3 * IMAGES_PER_CLASS
OPTS = ("--quantize", "int8", "--momentum", "0.9", "--lr", "0.02")
#: a child must reach its pause within this (it imports torch and compiles first)
START_TIMEOUT_S = 240


def _train_argv(model_file, data, out):
    return ("train", f"{model_file}:build", "--input", INPUT, "--data", data, "-o", out, "--epochs", EPOCHS,
            "--no-progress", *OPTS)


class Child:
    """A training process whose stderr is read by a thread."""

    def __init__(self, argv, pause):
        self.proc = edgetrain_process(*argv, pause=pause)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, text: str):
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            if any(text in l for l in self.lines):
                return
            if self.proc.poll() is not None:
                self._reader.join(5)
                pytest.fail(f"the child exited with {self.proc.returncode} before {text!r}:\n{''.join(self.lines)}")
            time.sleep(0.05)
        self.proc.kill()
        pytest.fail(f"the child did not reach {text!r} in {START_TIMEOUT_S} s:\n{''.join(self.lines)}")

    def finish(self, sig) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self._reader.join(5)
        self.proc.stdout.close()
        return code


def assert_same_state(a, b):
    assert a.steps == b.steps
    assert set(a.state) == set(b.state)
    for k in a.state:
        assert np.array_equal(a.state[k], b.state[k]), k


KILL_STEP = STEPS_PER_EPOCH + 5  # in epoch 2, after 4 of its steps changed the weights in memory


@pytest.fixture(scope="module")
def uninterrupted(model_file, image_folder, tmp_path_factory):
    """() -> the last checkpoint of the uninterrupted run (made in this process on first call,
    so that a test can start its children first)."""
    from edgetrain.app.cli import main

    done = []

    def get():
        if not done:
            out = tmp_path_factory.mktemp("full")
            assert main([str(a) for a in _train_argv(model_file, image_folder, out)]) == 0
            done.append(load_checkpoint(out / f"epoch-{EPOCHS:04d}.ckpt"))
        return done[0]

    return get


def test_kill_mid_save_and_mid_step_then_resume(cli, model_file, image_folder, tmp_path, uninterrupted):
    mid_save, mid_step = tmp_path / "save", tmp_path / "step"
    children = {
        # paused after epoch 2's temporary file is written and fsynced, before its rename
        "save": Child(_train_argv(model_file, image_folder, mid_save), "save:2:300"),
        "step": Child(_train_argv(model_file, image_folder, mid_step), f"step:{KILL_STEP}:300"),
    }
    try:
        full = uninterrupted()  # meanwhile, in this process
        children["save"].wait_for("paused in save 2")
        children["step"].wait_for(f"paused in step {KILL_STEP}")
        assert children["save"].finish(signal.SIGKILL) == -signal.SIGKILL
        assert children["step"].finish(signal.SIGKILL) == -signal.SIGKILL
    finally:
        for c in children.values():
            if c.proc.poll() is None:
                c.proc.kill()

    # killed mid-save: epoch 1 complete on disk, epoch 2 only as a (complete) temporary file
    names = sorted(p.name for p in mid_save.iterdir())
    assert "epoch-0001.ckpt" in names and "epoch-0002.ckpt" not in names
    assert any(n.startswith(TMP_PREFIX + "epoch-0002.ckpt") for n in names), names
    assert latest_checkpoint(mid_save).train["epoch"] == 1
    # killed mid-step: the epoch-1 checkpoint, nothing else
    assert sorted(p.name for p in mid_step.iterdir() if p.name != LOCK_NAME) == ["epoch-0001.ckpt"]  # + a dead lock
    assert load_checkpoint(mid_step / "epoch-0001.ckpt").steps == STEPS_PER_EPOCH
    for run in (mid_save, mid_step):
        resume_and_compare(cli, run, image_folder, full, model_file)


def resume_and_compare(cli, run, image_folder, full, model_file):
    code, out, err = cli("train", "--resume", run, "--data", image_folder, "--epochs", EPOCHS, "-o", run,
                         "--model-file", model_file, "--no-progress")
    assert code == 0, err
    assert not any(p.name.startswith(TMP_PREFIX) for p in run.iterdir())  # a killed save's leftovers are gone
    resumed = load_checkpoint(run / f"epoch-{EPOCHS:04d}.ckpt")
    assert_same_state(full, resumed)
    assert resumed.train["history"] == full.train["history"]


def test_ctrl_c_mid_epoch_saves_and_resumes(cli, model_file, image_folder, tmp_path, uninterrupted, monkeypatch):
    """SIGINT during a step: the step finishes, stopped.ckpt holds the state after it (the
    middle of epoch 2), exit 130; resuming from the folder continues mid-epoch."""
    import os

    from edgetrain.app import cli_program

    def hook(what, value):
        if what == "step" and value == KILL_STEP:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(cli_program, "train_hook", lambda: hook)
    run = tmp_path / "int"
    code, _, err = cli(*_train_argv(model_file, image_folder, run))
    assert code == 130, err
    assert "interrupted: training interrupted; the last good weights" in err and str(run / "stopped.ckpt") in err
    stopped = load_checkpoint(run / "stopped.ckpt")
    assert stopped.train["reason"] == "interrupted" and stopped.steps == KILL_STEP
    assert stopped.train["epoch"] == 1 and stopped.train["position"] == KILL_STEP - STEPS_PER_EPOCH
    assert sorted(p.name for p in run.iterdir()) == ["epoch-0001.ckpt", "stopped.ckpt"]
    monkeypatch.undo()
    resume_and_compare(cli, run, image_folder, uninterrupted(), model_file)
