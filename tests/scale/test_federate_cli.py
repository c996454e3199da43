"""`edgetrain federate` takes the model argument and the option names of every other command
(issue 34, item 7): a zoo name or path/to/model.py:FACTORY (with --input NxCxHxW and
--model-arg), --update, -o DIR (results.json and the final weights); the old --scheme, --batch
and --out still work with a one-line deprecation warning each. Small runs: --serial, the
reference backend, a 16x16 model of the tests' own."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edgetrain.app.cli import build_parser
from edgetrain.app.cli_federate import RESULTS_FILE, WEIGHTS_FILE, job_of
from edgetrain.federated import run_flower, run_serial

from tests.cli.conftest import MODEL_SOURCE, make_image_folder
from tests.cli.conftest import cli  # noqa: F401  (the in-process `edgetrain` fixture)

SMALL = ("--serial", "--backend", "reference", "--clients", "2", "--rounds", "2", "--local-steps", "2")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fed")
    (d / "petnet.py").write_text(MODEL_SOURCE)
    return d / "petnet.py", make_image_folder(d / "pets", per_class=8)


def _argv(model_file, data, *extra):
    return ("federate", f"{model_file}:build", "--input", "4x3x16x16", "--model-arg", "width=4", "--data", data,
            "--test-data", data, *SMALL, *extra)


def test_a_model_file_with_trains_options_writes_results_and_weights(cli, files, tmp_path):
    import torch
    from safetensors.torch import load_file

    model_file, data = files
    out = tmp_path / "fl"
    code, stdout, err = cli(*_argv(model_file, data, "--update", "bias", "-o", out))
    assert code == 0, err
    rows = stdout.splitlines()  # the figures on stdout, round 0 first; progress on stderr
    assert [r.split(":")[0] for r in rows] == ["round  0", "round  1", "round  2"] and "of the model" in rows[1]
    assert f"{model_file}:build: 2 clients, 2 rounds" in err and "batch 4" in err
    assert f"wrote {out / RESULTS_FILE}" in err and f"wrote {out / WEIGHTS_FILE}" in err
    d = json.loads((out / RESULTS_FILE).read_text())
    job = d["job"]
    assert (job["model"], job["batch"], job["input_shape"], job["scheme"]) == (f"{model_file}:build", 4, [3, 16, 16],
                                                                              "bias")
    assert job["model_sha256"] == hashlib.sha256(MODEL_SOURCE.encode()).hexdigest() and "model_factory" not in job
    assert [r["round"] for r in d["rounds"]] == [0, 1, 2] and sum(d["shard_sizes"]) == 24
    r1 = d["rounds"][1]
    assert 0 < r1["client_bytes"] < r1["model_bytes"]  # bias only: a part of the model travels
    # the final weights load into the model the file builds (with --model-arg width=4)
    ns: dict = {}
    exec(MODEL_SOURCE, ns)
    net = ns["build"](width=4)
    sd = load_file(str(out / WEIGHTS_FILE))
    net.load_state_dict(sd)  # strict: every tensor of the model, each of its shape
    assert set(sd) == set(net.state_dict()) and all(torch.isfinite(v.float()).all() for v in sd.values())


def test_the_model_file_runs_as_it_was_read(files, tmp_path):
    """What runs in every process is the text read when the job was made: a file changed
    afterwards (or gone) changes nothing."""
    model_file, data = files
    copy = tmp_path / "net.py"
    copy.write_text(MODEL_SOURCE)
    args = build_parser().parse_args(list(map(str, _argv(copy, data))))
    job = job_of(args)
    copy.write_text("raise SystemExit('changed')\n")
    res = run_serial(job)
    assert [r.round for r in res.rounds] == [0, 1, 2]
    assert res.as_dict()["job"]["model_sha256"] == hashlib.sha256(MODEL_SOURCE.encode()).hexdigest()


def test_the_old_spellings_warn_once_each_and_still_work(cli, files, tmp_path):
    model_file, data = files
    new = tmp_path / "new"
    code, out_new, err = cli("federate", "digitnet", "--data", "mnist", "--train-images", "40", "--test-images", "20",
                             *SMALL, "--update", "bias", "--input", "4x1x28x28", "-o", new, "-q")
    assert code == 0 and err == "", err  # -q: the figures only
    code, out_old, err = cli("federate", "digitnet", "--data", "mnist", "--train-images", "40", "--test-images", "20",
                             *SMALL, "--scheme", "bias", "--batch", "4", "--out", tmp_path / "old.json", "-q")
    assert code == 0, err
    assert err.splitlines() == [
        "edgetrain federate: warning: --scheme is deprecated: use --update (it takes the same values)",
        "edgetrain federate: warning: --batch is deprecated: use --input NxCxHxW (batch first, e.g. --input "
        "8x1x28x28)",
        "edgetrain federate: warning: --out is deprecated: use -o DIR (it writes results.json and the final weights "
        "there)"]
    old, new = json.loads((tmp_path / "old.json").read_text()), json.loads((new / RESULTS_FILE).read_text())
    assert old["rounds"] == [{**r, "seconds": o["seconds"]} for r, o in zip(new["rounds"], old["rounds"])]
    assert (old["job"]["batch"], old["job"]["scheme"]) == (new["job"]["batch"], new["job"]["scheme"]) == (4, "bias")
    assert out_old.splitlines()[0] == out_new.splitlines()[0]


@pytest.mark.parametrize("extra,message", [
    (("--input", "4x3x16x16", "--batch", "4"), "--batch and --input both give the batch"),
    (("--input", "4x16",), "federate trains image classifiers"),
    (("--model-arg", "width=4"), "--model-arg applies to a model file"),
])
def test_zoo_model_option_mistakes_are_usage_errors(cli, extra, message):
    code, _, err = cli("federate", "digitnet", "--data", "mnist", *SMALL, *extra)
    assert code == 2 and message in err and "Traceback" not in err, err


def test_a_model_file_needs_its_input(cli, files):
    model_file, data = files
    code, _, err = cli("federate", f"{model_file}:build", "--data", data, *SMALL)
    assert code == 2 and err.strip() == (f"edgetrain federate: error: {model_file}:build: give the model's input "
                                         f"shape, e.g. --input 8x3x64x64 (batch first)")
    code, _, err = cli("federate", f"{model_file}:build", "--input", "4x1x16x16", "--data", data, *SMALL)
    assert code == 2 and f"{model_file}:build does not accept input 1x1x16x16: RuntimeError" in err, err
    assert len(err.strip().splitlines()) == 2  # the run's header line (INFO), then the error's one line


def test_federate_help_names_the_options_of_the_other_commands(cli):
    code, out, _ = cli("federate", "--help")
    assert code == 0
    for option in ("--input NxCxHxW", "--model-arg NAME=VALUE", "--update SCHEME", "-o DIR, --output DIR",
                   "path/to/model.py:FACTORY", "-v, --verbose", "-q, --quiet"):
        assert option in out, option
    for old in ("--scheme", "--batch", "--out FILE"):
        assert old not in out, old  # still read, no longer shown


@pytest.mark.slow
def test_flower_runs_a_model_file_as_the_serial_run(files):
    """Each Ray worker builds the model from the job's copy of the file's text: the Flower run
    equals the serial one bit for bit (about 35 s: Ray's start)."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    model_file, data = files
    job = job_of(build_parser().parse_args(list(map(str, _argv(model_file, data)))))
    fed, ref = run_flower(job, workers=2), run_serial(job)
    assert list(fed.values) == list(ref.values)
    assert all(np.array_equal(fed.values[k], ref.values[k]) for k in ref.values)
    assert [(r.round, r.accuracy, r.loss) for r in fed.rounds] == [(r.round, r.accuracy, r.loss) for r in ref.rounds]
    assert Path(str(model_file)).read_text() == MODEL_SOURCE
