"""`edgetrain train` and `edgetrain export`: fine-tuning on an ImageFolder with a checkpoint per
epoch, exact resume, weights back into PyTorch; bad data, labels out of range and a diverging
run give clear errors and lose nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetrain.app.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from edgetrain.app.usermodel import load_model

from .conftest import IMAGES_PER_CLASS, INPUT, make_image_folder, snapshot

N_IMAGES = 3 * IMAGES_PER_CLASS


def train_args(model_file, data, out, *extra):
    return ("train", f"{model_file}:build", "--input", INPUT, "--data", data, "-o", out, "--no-progress", *extra)


def assert_same_state(a, b):
    assert a.steps == b.steps
    assert set(a.state) == set(b.state)
    for k in a.state:
        assert a.state[k].dtype == b.state[k].dtype and np.array_equal(a.state[k], b.state[k]), k


@pytest.mark.parametrize("opts", [("--lr", "0.05", "--momentum", "0.9"),
                                  ("--quantize", "int8", "--lr", "0.02", "--update", "last:2")],
                         ids=["float-momentum", "int8"])
def test_train_resume_equals_uninterrupted(cli, model_file, image_folder, tmp_path, opts):
    full, part = tmp_path / "full", tmp_path / "part"
    code, out, err = cli(*train_args(model_file, image_folder, full, "--epochs", "3", *opts))
    assert code == 0, err
    assert [p.name for p in sorted(full.glob("*.ckpt"))] == ["epoch-0001.ckpt", "epoch-0002.ckpt", "epoch-0003.ckpt"]
    assert f"epoch 3/3: mean loss" in err and f"over {N_IMAGES} steps" in err  # progress: stderr
    final = load_checkpoint(full / "epoch-0003.ckpt")
    assert final.steps == 3 * N_IMAGES and final.train["epoch"] == 3 and len(final.train["history"]) == 3
    # one epoch, then resume (from the folder: its furthest checkpoint) to three
    code, _, err = cli(*train_args(model_file, image_folder, part, "--epochs", "1", *opts))
    assert code == 0, err
    code, out, err = cli("train", "--resume", part, "--data", image_folder, "--epochs", "3", "-o", part,
                         "--no-progress", "--model-file", model_file)
    assert code == 0, err
    assert "epochs 2..3" in err
    resumed = load_checkpoint(part / "epoch-0003.ckpt")
    assert_same_state(final, resumed)
    assert resumed.train["history"] == final.train["history"]
    # the weights were trained: they differ from the start
    start = load_checkpoint(part / "epoch-0001.ckpt")
    assert any(not np.array_equal(start.state[k], final.state[k]) for k in final.state)



def test_threads_train_the_same_weights_and_a_resume_may_change_them(cli, model_file, image_folder, tmp_path):
    """--threads N (the C library built with OpenMP) trains the same weights as the serial library,
    and is not part of the program: a run resumes on another thread count."""
    serial, threaded = tmp_path / "serial", tmp_path / "threaded"
    opts = ("--backend", "c", "--lr", "0.05", "--momentum", "0.9")
    code, _, err = cli(*train_args(model_file, image_folder, serial, "--epochs", "2", *opts))
    assert code == 0, err
    code, _, err = cli(*train_args(model_file, image_folder, threaded, "--epochs", "1", "--threads", "2", *opts))
    assert code == 0 and "on the c backend (2 threads)" in err, err
    code, _, err = cli("train", "--resume", threaded, "--data", image_folder, "--epochs", "2", "-o", threaded,
                       "--no-progress", "--model-file", model_file, "--threads", "3")
    assert code == 0 and "(3 threads)" in err, err
    assert_same_state(load_checkpoint(serial / "epoch-0002.ckpt"), load_checkpoint(threaded / "epoch-0002.ckpt"))


@pytest.mark.parametrize("extra,msg", [
    (("--backend", "reference", "--threads", "2"), "--threads applies to the C backend, not the reference one"),
    (("--threads", "0"), "argument --threads: expected an integer from 1 to 1,024"),
])
def test_threads_usage_errors(cli, model_file, image_folder, tmp_path, extra, msg):
    out = tmp_path / "run"
    code, _, err = cli(*train_args(model_file, image_folder, out, *extra))
    assert code == 2 and msg in err, err
    assert not out.exists()


def test_export_loads_into_the_model(cli, model_file, image_folder, tmp_path):
    from safetensors.torch import load_file

    run = tmp_path / "run"
    code, _, err = cli(*train_args(model_file, image_folder, run, "--epochs", "1", "--lr", "0.1"))
    assert code == 0, err
    code, out, err = cli("export", run, "-o", tmp_path / "w.safetensors", "--model-file", model_file)
    assert code == 0, err
    sd = load_file(str(tmp_path / "w.safetensors"))
    model = load_model(f"{model_file}:build")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(sd)  # strict: every key, every shape
    assert not torch.equal(model.head.weight, before["head.weight"])
    ck = load_checkpoint(run)
    np.testing.assert_array_equal(sd["head.weight"].numpy(), ck.state["head.weight"])
    # the exported model predicts what the program predicts
    built = ck.restore(model_file=model_file)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(model(torch.from_numpy(x)).numpy(), built.prog.predict(x), rtol=1e-4, atol=1e-5)


def test_init_starts_a_new_run_from_compiled_program(cli, model_file, image_folder, tmp_path):
    prog_dir, run = tmp_path / "prog", tmp_path / "run"
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--target", "host", "--no-plot",
                       "-o", prog_dir)
    assert code == 0, err
    # a compiled program's checkpoint is resumed as a fresh run
    code, out, err = cli("train", "--resume", prog_dir / "program.ckpt", "--data", image_folder, "-o", run,
                         "--no-progress", "--model-file", model_file)
    assert code == 0, err
    assert load_checkpoint(run / "epoch-0001.ckpt").steps == N_IMAGES
    # --init may change the learning rate only
    code, _, err = cli("train", "--init", run, "--data", image_folder, "-o", tmp_path / "r2", "--update", "bias")
    assert code == 2 and "--update-spec: the program is fixed by the checkpoint" in err
    code, _, err = cli("train", "--init", run, "--data", image_folder, "-o", tmp_path / "r2", "--lr", "0.001",
                       "--no-progress", "--model-file", model_file)
    assert code == 0, err
    assert load_checkpoint(tmp_path / "r2").config.lr == 0.001


def test_compiled_normalisation_carries_into_train(cli, model_file, image_folder, tmp_path):
    """compile --mean/--std (the calibration's normalisation) is the one `train --resume` uses."""
    prog_dir = tmp_path / "prog"
    code, _, err = cli("compile", f"{model_file}:build", "--input", INPUT, "--quantize", "int8", "--calibrate",
                       image_folder, "--mean", "0.5", "--std", "0.25", "--target", "host", "--no-plot", "-o", prog_dir)
    assert code == 0, err
    meta = load_checkpoint(prog_dir / "program.ckpt").train
    assert meta["mean"] == [0.5] and meta["std"] == [0.25]
    code, _, err = cli("train", "--resume", prog_dir / "program.ckpt", "--data", image_folder, "-o",
                       tmp_path / "run", "--mean", "0.5", "--no-progress", "--model-file", model_file)
    assert code == 0, err
    assert load_checkpoint(tmp_path / "run").train["std"] == [0.25]
    code, _, err = cli("train", "--resume", prog_dir / "program.ckpt", "--data", image_folder, "-o",
                       tmp_path / "run2", "--std", "1", "--no-progress", "--model-file", model_file)
    assert code == 2 and "--std: the int8 program was calibrated on images normalised with [0.25]" in err


def test_resume_refuses_other_data(cli, model_file, image_folder, tmp_path):
    run = tmp_path / "run"
    assert cli(*train_args(model_file, image_folder, run, "--epochs", "1"))[0] == 0
    other = make_image_folder(tmp_path / "other", seed=5)
    before = snapshot(run)
    code, _, err = cli("train", "--resume", run, "--data", other, "--epochs", "2", "-o", run, "--model-file",
                       model_file)
    assert code == 2 and "is not the data this run trained on" in err and "--init" in err
    code, _, err = cli("train", "--resume", run, "--data", image_folder, "--epochs", "2", "-o", run, "--seed", "3",
                       "--model-file", model_file)
    assert code == 2 and "the resumed run uses seed 0" in err
    assert snapshot(run) == before


def test_corrupt_and_truncated_images(cli, model_file, tmp_path):
    data = make_image_folder(tmp_path / "pets")
    good = (data / "cat" / "1.png").read_bytes()
    (data / "cat" / "1.png").write_bytes(good[:len(good) // 2])  # truncated PNG
    jpg = (data / "dog" / "0.jpg").read_bytes()
    (data / "dog" / "0.jpg").write_bytes(jpg[:len(jpg) // 2])  # truncated JPEG
    (data / "owl" / "2.jpg").write_bytes(b"this is not a picture")  # corrupt
    (data / "owl" / "notes.txt").write_text("ignored: not an image suffix")
    before = snapshot(data)
    out = tmp_path / "run"
    code, _, err = cli(*train_args(model_file, data, out))
    assert code == 2
    assert f"3 of {N_IMAGES} images in {data} cannot be read" in err
    for f in ("cat/1.png", "dog/0.jpg", "owl/2.jpg"):
        assert str(data / f) in err
    assert "--skip-bad-images" in err and "Traceback" not in err
    assert not out.exists() and snapshot(data) == before
    code, _, err = cli(*train_args(model_file, data, out, "--skip-bad-images"))
    assert code == 0, err
    assert "warning: skipped 3 unreadable image(s)" in err and f"{N_IMAGES - 3} images in 3 classes" in err
    assert load_checkpoint(out / "epoch-0001.ckpt").steps == N_IMAGES - 3


@pytest.mark.parametrize("layout,msg", [
    ("missing", "does not exist"), ("file", "is not a folder"), ("flat", "has no class subfolders"),
    ("empty-class", "class folder(s) owl hold no images"),
])
def test_unusable_folders(cli, model_file, tmp_path, layout, msg):
    data = tmp_path / "d"
    if layout == "file":
        data.write_text("x")
    elif layout == "flat":
        data.mkdir()
        (data / "a.png").write_bytes(b"")
    elif layout == "empty-class":
        make_image_folder(data, classes=("cat", "dog"))
        (data / "owl").mkdir()
    code, _, err = cli(*train_args(model_file, data, tmp_path / "run"))
    assert code == 2 and msg in err, err


def test_model_without_an_image_input(cli, tmp_path, image_folder):
    net = tmp_path / "mlp.py"
    net.write_text("from torch import nn\ndef build():\n    return nn.Linear(8, 3)\n")
    code, _, err = cli("train", f"{net}:build", "--input", "1x8", "--data", image_folder, "-o", tmp_path / "run")
    assert code == 2 and "training on images needs a float input (batch, 1 or 3 channels, height, width)" in err
    assert not (tmp_path / "run").exists()


def test_labels_out_of_range(cli, model_file, image_folder, tmp_path):
    code, _, err = cli(*train_args(model_file, image_folder, tmp_path / "run", "--classes", "2"))
    assert code == 2
    assert "labels out of range: " in err and "has 3 classes (cat, dog, owl) but the model outputs 2" in err
    assert not list((tmp_path / "run").glob("*.ckpt")) if (tmp_path / "run").exists() else True


def test_non_finite_loss_stops_and_keeps_last_good_weights(cli, model_file, image_folder, tmp_path):
    import re

    run, wild = tmp_path / "run", tmp_path / "wild"
    assert cli(*train_args(model_file, image_folder, run, "--epochs", "1", "--lr", "0.05"))[0] == 0
    good = snapshot(run)
    # a new run from those weights with a learning rate that diverges
    ck = load_checkpoint(run / "epoch-0001.ckpt")
    code, _, err = cli("train", "--init", run, "--data", image_folder, "-o", wild, "--lr", "1e30", "--epochs", "2",
                       "--no-progress", "--model-file", model_file)
    assert code == 4
    # caught while still finite (the weights' growth) or when not finite any more
    m = re.search(r"training stopped: step (\d+)(: loss is (nan|inf)| diverged: )", err)
    assert m and "the last good weights" in err and str(wild / "stopped.ckpt") in err, err
    stopped = load_checkpoint(wild / "stopped.ckpt")
    assert stopped.train["reason"] in ("non-finite", "diverged")
    # the weights of the step before the one that failed, all finite
    assert stopped.steps == int(m.group(1)) - 1 >= ck.steps
    assert stopped.train["position"] == stopped.steps - ck.steps
    assert all(np.all(np.isfinite(v)) for v in stopped.state.values() if v.dtype.kind == "f")
    if stopped.steps == ck.steps:
        assert_same_state(ck, stopped)
    assert snapshot(run) == good  # the earlier run is untouched


def predictions(ck, data, model_file):
    """The outputs of checkpoint `ck`'s program for every image of `data`."""
    from edgetrain.data.folder import load_images
    from edgetrain.app.train import image_shape

    prog = ck.restore(model_file).prog
    _, c, h, w = image_shape(prog)
    images = load_images(str(data), (c, h, w))
    with np.errstate(all="ignore"):
        return prog.predict(images.batch(np.arange(len(images)), (c, h, w), ck.train["mean"], ck.train["std"]))


@pytest.mark.parametrize("opts,sign", [
    (("--lr", "30"), "the loss .* times the run's starting loss|the trained weights grew"),
    (("--lr", "1e30"), "the trained weights grew to RMS"),
    (("--lr", "1e30", "--backend", "c"), "the trained weights grew to RMS"),
    (("--quantize", "int8", "--lr", "1000"), "saturated"),
], ids=["float-lr30", "float-lr1e30", "c-lr1e30", "int8-lr1000"])
def test_finite_blow_up_stops_with_weights_that_predict_finitely(cli, model_file, image_folder, tmp_path, opts,
                                                                 sign):
    """Issue 18 item 5: at a learning rate that diverges, the run blew up while finite and
    either stopped late (`stopped.ckpt` held weights of 6e29 whose predictions were not
    finite) or never (lr 30 and int8 at lr 1000 exited 0 at chance). Now it stops at the
    step that shows the blow-up (exit 4), saying what and where, and keeps the weights from
    before that step: finite predictions on every image."""
    import re

    run = tmp_path / "run"
    code, out, err = cli(*train_args(model_file, image_folder, run, "--epochs", "3", *opts))
    assert code == 4, out + err
    m = re.search(r"training stopped: step (\d+) diverged: (.*); weights kept from step (\d+)", err)
    assert m and re.search(sign, m.group(2)) and int(m.group(3)) == int(m.group(1)) - 1, err
    stopped = load_checkpoint(run / "stopped.ckpt")
    assert stopped.train["reason"] == "diverged" and stopped.steps == int(m.group(3))
    assert stopped.train["position"] == stopped.steps % N_IMAGES
    out = predictions(stopped, image_folder, model_file)
    assert out.shape == (N_IMAGES, 3) and np.all(np.isfinite(out)) and np.abs(out).max() < 1e6
    assert not list(run.glob("epoch-*.ckpt"))  # it stopped within the first epoch, before any epoch ended


def test_normal_runs_are_not_taken_for_blow_ups(cli, model_file, image_folder, tmp_path):
    """The divergence criteria stay far from sound training: a high but workable learning
    rate with momentum, for many epochs, in float and int8 (the other tests train at the
    usual rates without tripping them)."""
    for i, opts in enumerate([("--lr", "0.5", "--momentum", "0.9"), ("--quantize", "int8", "--lr", "0.1")]):
        code, _, err = cli(*train_args(model_file, image_folder, tmp_path / str(i), "--epochs", "10", *opts))
        assert code == 0, err


def test_new_run_does_not_overwrite_another(cli, model_file, image_folder, tmp_path):
    run = tmp_path / "run"
    assert cli(*train_args(model_file, image_folder, run, "--epochs", "1"))[0] == 0
    before = snapshot(run)
    code, _, err = cli(*train_args(model_file, image_folder, run, "--epochs", "1", "--lr", "0.5"))
    assert code == 2 and f"{run} already holds checkpoints (epoch-0001.ckpt) of another run" in err
    code, _, err = cli("train", "--init", run, "--data", image_folder, "-o", run, "--model-file", model_file)
    assert code == 2 and "already holds checkpoints" in err
    assert snapshot(run) == before


def test_truncated_or_corrupt_checkpoint(cli, model_file, image_folder, tmp_path):
    run = tmp_path / "run"
    assert cli(*train_args(model_file, image_folder, run, "--epochs", "2"))[0] == 0
    data = (run / "epoch-0002.ckpt").read_bytes()
    (run / "epoch-0002.ckpt").write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(run / "epoch-0002.ckpt")
    assert latest_checkpoint(run).train["epoch"] == 1  # the complete one before
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    (run / "epoch-0002.ckpt").write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="do not match their recorded sha256"):
        load_checkpoint(run / "epoch-0002.ckpt")
    code, _, err = cli("export", run / "epoch-0002.ckpt", "-o", tmp_path / "w.safetensors")
    assert code == 2 and "corrupt" in err and not (tmp_path / "w.safetensors").exists()
    code, _, err = cli("export", tmp_path / "nothing.ckpt", "-o", tmp_path / "w.safetensors")
    assert code == 2 and "does not exist" in err
    # resuming from the folder continues from epoch 1 and redoes epoch 2 exactly
    code, _, err = cli("train", "--resume", run, "--data", image_folder, "--epochs", "2", "-o", tmp_path / "again",
                       "--no-progress", "--model-file", model_file)
    assert code == 0, err
    (run / "epoch-0002.ckpt").write_bytes(data)
    assert_same_state(load_checkpoint(run / "epoch-0002.ckpt"), load_checkpoint(tmp_path / "again/epoch-0002.ckpt"))
