"""bench/real_models.py: the row of one small real model (timm ResNet10-T) is complete, every
cell measured with a finite figure within the tolerances the realmodels tests hold, and the
table prints it; an error in one cell is recorded and the row goes on."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_models  # noqa: E402


@pytest.fixture(scope="module")
def resnet10t_row():
    return real_models.row("timm.resnet10t")


def test_row_is_complete_and_finite(resnet10t_row):
    r = resnet10t_row
    for key in real_models.CELLS:
        assert "error" not in r[key], f"{key}: {r[key]}"
    assert r["capture"]["ok"]
    assert r["ref_grad"]["max_rel_err"] <= 1e-10  # float64 vs torch.autograd
    assert r["c"]["max_rel_err"] <= 1e-5  # float32 C vs float32 reference
    assert math.isfinite(r["int8"]["loss"])
    assert r["torch_compile"]["max_rel_diff"] <= 1e-4 and len(r["torch_compile"]["losses"]) == real_models.STEPS
    assert r["torch_compile_train"]["max_rel_diff"] <= 1e-6  # train(), float64, seeded
    mem = r["memory"]
    assert mem["edgetrain_peak_bytes"] > 0 and mem["torch_peak_bytes"] > 0
    assert math.isclose(mem["ratio"], mem["torch_peak_bytes"] / mem["edgetrain_peak_bytes"])
    line = real_models.table([r]).splitlines()[-1]
    assert line.startswith("| timm.resnet10t | ok |") and "error" not in line.lower() and "nan" not in line


def test_a_failing_cell_is_recorded_and_the_row_goes_on(monkeypatch):
    def broken_capture(*a, **k):
        raise RuntimeError("no converter for aten.fake_op\nsecond line")

    monkeypatch.setattr("edgetrain.frontend.capture", broken_capture)
    r = real_models.row("timm.resnet10t", cells=["capture", "int8"])
    assert r["capture"] == {"error": "RuntimeError: no converter for aten.fake_op"}
    assert math.isfinite(r["int8"]["loss"])
    assert "RuntimeError: no converter for aten.fake_op |" in real_models.table([r])
