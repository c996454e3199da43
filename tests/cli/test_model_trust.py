"""A checkpoint never makes edgetrain run code the user did not name (issue 18, item 1).

The attack: a crafted `.ckpt` whose header names a Python file that `touch`es a marker when
imported. `export`, `train --resume` and `train --init` must refuse it (exit 2, naming the
file and what to pass) without running anything; the file runs when the user names it with
--model-file and its sha256 matches the checkpoint's record, or with --trust-model-file."""
from __future__ import annotations

import dataclasses

import pytest

from edgetrain.app.checkpoint import (Checkpoint, CheckpointError, ProgramConfig, atomic_write, build_program,
                                  load_checkpoint, to_bytes)
from edgetrain.app.modeltrust import UntrustedModelError
from edgetrain.app.usermodel import source_digest

from .conftest import INPUT, MODEL_SOURCE

COMMANDS = ("export", "resume", "init")


@pytest.fixture(scope="module")
def program_checkpoint(tmp_path_factory):
    """A genuine checkpoint of the tests' model file (compiled once for the module)."""
    folder = tmp_path_factory.mktemp("genuine")
    model = folder / "petnet.py"
    model.write_text(MODEL_SOURCE)
    built = build_program(ProgramConfig(model=f"{model}:build", inputs=(INPUT,)))
    path = atomic_write(folder / "program.ckpt", to_bytes(Checkpoint.of(built, {"reason": "compiled"})))
    return model, path


def evil_source(marker) -> str:
    """The tests' model, plus a line that creates `marker` when the file is imported."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n" + MODEL_SOURCE


def craft(genuine, folder, model_text: str, record: str = "sha256"):
    """A copy of checkpoint `genuine` whose header names the model file `model_text`
    (path:factory); record "sha256": with that file's sha256 and text, as edgetrain writes
    them now; "none": as an older edgetrain wrote them (neither)."""
    ck = load_checkpoint(genuine)
    path = folder / "crafted.ckpt"
    file = folder / model_text.rpartition(":")[0]  # (an absolute path stays itself)
    text = file.read_text() if record == "sha256" else None
    ck.config = dataclasses.replace(ck.config, model=model_text,
                                    model_sha256=source_digest(text) if text is not None else None)
    ck.model_source = text
    atomic_write(path, to_bytes(ck))
    return path


def argv(command, ck, tmp_path, image_folder, *extra):
    if command == "export":
        return ("export", ck, "-o", tmp_path / "w.safetensors", *extra)
    return ("train", f"--{command}", ck, "--data", image_folder, "-o", tmp_path / "run", "--no-progress", *extra)


@pytest.mark.parametrize("record", ["sha256", "none", "relative"])
@pytest.mark.parametrize("command", COMMANDS)
def test_crafted_checkpoint_runs_no_code(cli, program_checkpoint, image_folder, tmp_path, monkeypatch, command,
                                         record):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.py"
    evil.write_text(evil_source(marker))
    if record == "relative":  # a relative path would resolve against the current folder
        monkeypatch.chdir(tmp_path)
        ck = craft(program_checkpoint[1], tmp_path, "evil.py:build")
    else:
        ck = craft(program_checkpoint[1], tmp_path, f"{evil}:build", record)
    code, _, err = cli(*argv(command, ck, tmp_path, image_folder))
    assert code == 2, err
    assert not marker.exists()
    assert "evil.py" in err and "--model-file" in err and "--trust-model-file" in err and "Traceback" not in err
    if record == "none":
        assert "records no sha256" in err
    assert not (tmp_path / "w.safetensors").exists() and not (tmp_path / "run").exists()
    # --trust-model-file with a relative recorded path is refused too (it names no definite file)
    if record == "relative":
        code, _, err = cli(*argv(command, ck, tmp_path, image_folder, "--trust-model-file"))
        assert code == 2 and "relative path" in err and not marker.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_named_file_with_matching_sha256_runs(cli, program_checkpoint, image_folder, tmp_path, command):
    marker = tmp_path / "ran"
    evil = tmp_path / "mine.py"
    evil.write_text(evil_source(marker))
    ck = craft(program_checkpoint[1], tmp_path, f"{evil}:build")
    code, _, err = cli(*argv(command, ck, tmp_path, image_folder, "--model-file", evil))
    assert code == 0, err
    assert marker.exists()  # the user named the file: it ran


@pytest.mark.parametrize("command", COMMANDS)
def test_modified_model_file_is_refused(cli, program_checkpoint, image_folder, tmp_path, command):
    model, genuine = program_checkpoint
    marker = tmp_path / "pwned"
    changed = tmp_path / "petnet.py"
    changed.write_text(evil_source(marker))  # same model, one line more: another sha256
    code, _, err = cli(*argv(command, genuine, tmp_path, image_folder, "--model-file", changed))
    assert code == 2, err
    assert f"--model-file {changed} is not the model file" in err and str(model) in err
    assert "first difference at line 1" in err and not marker.exists()
    # trusting it runs it (the weights still fit: it builds the same model)
    code, _, err = cli(*argv(command, genuine, tmp_path, image_folder, "--model-file", changed,
                             "--trust-model-file"))
    assert code == 0, err
    assert marker.exists()


def test_trust_flag_runs_the_recorded_file(cli, program_checkpoint, tmp_path):
    model, genuine = program_checkpoint
    code, _, err = cli("export", genuine, "-o", tmp_path / "w.safetensors")
    assert code == 2 and f"--model-file {model}" in err
    code, _, err = cli("export", genuine, "-o", tmp_path / "w.safetensors", "--trust-model-file")
    assert code == 0, err
    code, _, err = cli("export", genuine, "-o", tmp_path / "w2.safetensors", "--model-file", f"{model}:build")
    assert code == 0, err
    code, _, err = cli("export", genuine, "-o", tmp_path / "w3.safetensors", "--model-file", f"{model}:other")
    assert code == 2 and "built by 'build', not 'other'" in err


def test_old_checkpoint_loads_only_with_the_file_named(cli, program_checkpoint, tmp_path):
    model, genuine = program_checkpoint
    old = craft(genuine, tmp_path, f"{model}:build", record="none")
    with pytest.raises(UntrustedModelError, match="records no sha256"):
        load_checkpoint(old).restore()
    built = load_checkpoint(old).restore(model_file=model)
    assert built.config.model_sha256 == source_digest(MODEL_SOURCE)  # recorded from now on
    assert built.model_source == MODEL_SOURCE


def test_recorded_text_must_match_its_sha256(program_checkpoint, tmp_path):
    ck = load_checkpoint(program_checkpoint[1])
    assert ck.model_source == MODEL_SOURCE and ck.config.model_sha256 == source_digest(MODEL_SOURCE)
    ck.model_source = MODEL_SOURCE + "\nprint('hi')\n"
    atomic_write(tmp_path / "x.ckpt", to_bytes(ck))
    with pytest.raises(CheckpointError, match="model file text does not match its recorded sha256"):
        load_checkpoint(tmp_path / "x.ckpt")


def test_model_file_options_apply_to_checkpoints_only(cli, model_file, image_folder, tmp_path):
    code, _, err = cli("train", f"{model_file}:build", "--input", INPUT, "--data", image_folder, "-o",
                       tmp_path / "run", "--model-file", model_file)
    assert code == 2 and "apply to --resume / --init" in err
