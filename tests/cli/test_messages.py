"""Output that used to confuse (issue 18, item 13): the memory summary's "trainable 88 KB" above
"all weights 17.9 KB" (the optimizer state counted as trainable, unnamed), "gap 0.91%
(optimal)" and "(optimal)" on heuristics, KB beside MiB, torch's pytree FutureWarning leaking
into every user script, and a named data set silently converted to the model's input."""
from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.config import format_bytes, parse_bytes
from edgetrain.data.folder import ImageSet
from edgetrain.app.usermodel import load_model

from .conftest import INPUT, SIDE


def _bytes(text: str, label: str) -> int:
    """The figure printed after `label` ("604 B", "1.9 KB"), read back as bytes."""
    return parse_bytes(re.search(label + r" ([0-9,.]+ [KM]?B)", text).group(1).replace(",", "").replace(" ", ""))


def test_the_memory_summary_names_the_optimizer_state(model_file):
    """int8 weights with float32 momentum: the state in RAM is mostly momentum, and the summary
    says so instead of calling all of it trainable weights."""
    model = load_model(f"{model_file}:build")
    x = torch.randn(2, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    prog = et.compile(model, (x,), update=et.Full(), quantize="int8", optimizer=et.SGD(lr=0.01, momentum=0.9),
                      calibration=[x.numpy()])
    m, text = prog.memory, prog.memory.summary()
    assert m.optimizer_bytes > m.trainable_bytes - m.optimizer_bytes > 0  # momentum (float32) outweighs int8 weights
    assert "optimizer state" in text and "trainable" not in text
    assert _bytes(text, "trained weights") <= _bytes(text, "all weights")
    assert _bytes(text, "optimizer state") == pytest.approx(m.optimizer_bytes, abs=52)
    plain = et.compile(model, (x,), update=et.Full()).memory  # no momentum: no optimizer state to name
    assert plain.optimizer_bytes == 0 and "optimizer state" not in plain.summary()


@pytest.mark.parametrize("n", [1, 1000, 1023 * 1024, 1024 * 1024, 37_840_000, 3 << 30])
def test_one_unit_family_that_reads_back_as_a_budget(n):
    text = format_bytes(n)
    assert text.endswith((" B", " KB", " MB")) and "iB" not in text
    assert parse_bytes(text.replace(",", "").replace(" ", "")) == pytest.approx(n, rel=0.01, abs=52)


def test_schedule_summaries_claim_only_what_the_solver_proved():
    from edgetrain.remat.build import build_problem
    from edgetrain.devices import get_device
    from edgetrain.remat.solvers import SOLVERS

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(4))
    x = torch.randn(1, 3, 12, 12)
    model(x)
    problem = build_problem(et.compile(model, (x,)), get_device("a72"))
    for name in ("chen", "dtr", "none"):
        text = SOLVERS[name](problem, None, None, 10.0).summary()
        assert text.endswith("a heuristic (no bound on how far from optimal)") and "MiB" not in text, text
    milp = SOLVERS["milp"](problem, None, None, 10.0)
    assert milp.status == "optimal"
    close = dataclasses.replace(milp, gap=0.0091)
    assert "within 0.91% of optimal" in close.summary() and "(optimal)" not in close.summary()
    stopped = dataclasses.replace(milp, gap=0.2, status="time_limit")
    assert "stopped by the time limit: within 20.00% of optimal" in stopped.summary()
    assert dataclasses.replace(milp, gap=0.0).quality() == "optimal"


@pytest.mark.fresh_capture
def test_compiling_does_not_leak_torchs_pytree_warning(model_file):
    """torch.export printed a FutureWarning about LeafSpec on every capture, in every user
    script; edgetrain silences that one warning around its own export call, nothing else."""
    model = load_model(f"{model_file}:build")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        et.compile(model, (torch.randn(1, 3, SIDE, SIDE),))
        assert warnings.filters == filters  # the user's own warning settings are left as they were
    assert not [w for w in caught if "LeafSpec" in str(w.message)], [str(w.message) for w in caught]


def test_a_converted_data_set_is_announced(cli, model_file, tmp_path):
    grey = ImageSet(np.zeros((4, 28, 28), np.uint8), np.arange(4) % 2, ("a", "b"), "fashion-mnist (train)")
    assert grey.conversion((1, 28, 28)) is None
    note = grey.conversion((3, 32, 32))
    assert note == ("fashion-mnist (train): 1x28x28 images converted to the model's input 3x32x32 (grey copied "
                    "to 3 channels, resized (bilinear) from 28x28)")
    colour = ImageSet(np.zeros((2, 32, 32, 3), np.uint8), np.arange(2), ("a", "b"), "cifar10 (train)")
    assert colour.conversion((1, 32, 32)).endswith("(colour turned to grey)")
    code, out, err = cli("train", f"{model_file}:build", "--input", INPUT, "--data", "fashion-mnist", "--limit", "20",
                         "--classes", "10", "-o", tmp_path / "run", "--no-progress")
    assert code == 0, err
    assert f"note: fashion-mnist (train): 1x28x28 images converted to the model's input 3x{SIDE}x{SIDE}" in err


def test_inspect_shows_each_ops_model_line(cli, model_file):
    """The tutorial's promise: `inspect` prints each captured op with the model line it came from."""
    code, out, _ = cli("inspect", f"{model_file}:build", "--input", INPUT)
    assert code == 0
    ops = [line for line in out.splitlines() if re.match(r"\s+\d+: %", line)]
    assert ops and all("  # " in line for line in ops)
    pw = next(line for line in ops if "conv2d(" in line and "pw.weight" in line)
    assert pw.endswith("x = torch.relu(self.pw(torch.relu(self.dw(x))))")
    assert re.search(r"petnet\.py:\d+: ", pw)
    head = next(line for line in ops if " = linear(" in line)
    assert head.endswith("return self.head(x.mean((2, 3)))")
