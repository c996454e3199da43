"""bench/wino_accuracy.py on torchvision's resnet18 at 32x32, batch 2: the float32 reference's row, then the C
program with every 3x3 stride-1 convolution as F(4x4, 3x3) (its 13 convolutions' three passes each on the path,
all of them so), its gradients within F(4x4, 3x3)'s rounding of both references (tests/backends/c/test_wino.py's
tolerance for it); the same after a step, with the kinks' float64 runs; an unknown mode or model is refused
before anything is built."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from edgetrain.backends.c import blas

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import wino_accuracy  # noqa: E402

pytestmark = pytest.mark.skipif(blas.library_blas() is None, reason="no BLAS installed")


def _args(**kw):
    return argparse.Namespace(**{"model": "resnet18", "size": 32, "batch": 2, "modes": "f4", "gemm": "chosen",
                                 "after_step": False, "kinks": False, **kw})


def _is_a_parameter(name: str) -> bool:
    return name.endswith((".weight", ".bias"))


def test_the_rows_of_every_convolution_as_f4x4():
    ref, f4 = wino_accuracy.rows(_args())
    assert (ref["mode"], ref["passes"]) == ("float32 reference", None)
    assert 0 < ref["vs_float64"] < 1e-5
    assert (f4["mode"], f4["passes"], f4["f4"]) == ("f4", 13 * 3, 13 * 3)
    assert 0 < f4["vs_float32"] < 3e-5 and 0 < f4["vs_float64"] < 3e-5
    assert _is_a_parameter(f4["worst_float32"]) and _is_a_parameter(f4["worst_float64"])
    assert "flips" not in f4
    assert "| resnet18 32x32 b2 | chosen | f4 | 39 (39) |" in wino_accuracy.table([ref, f4])


def test_after_a_step_with_the_kinks():
    """The references' row at the C program's state after its step; the passes counted are the gradients()
    call's alone, not the step's; each row's least error over the kinks' float64 runs, with its flips."""
    ref, f4 = wino_accuracy.rows(_args(after_step=True, kinks=True))
    assert ref["mode"] == "float32 reference (at f4's state)"
    assert (f4["passes"], f4["f4"]) == (13 * 3, 13 * 3)
    assert 0 < f4["vs_float64_flipped"] < 3e-5 and isinstance(f4["flips"], str)
    assert 0 <= ref["vs_float64_flipped"] < 1e-5
    table = wino_accuracy.table([ref, f4])
    assert "| resnet18 32x32 b2, after a step | chosen | f4 | 39 (39) |" in table
    assert "kinks flipped (flips) |" in table


def test_an_unknown_mode_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        wino_accuracy.main(["--modes", "f4,f8"])
    assert e.value.code == 2
    assert "unknown modes ['f8']" in capsys.readouterr().err


def test_an_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        wino_accuracy.main(["--model", "resnet19"])
    assert e.value.code == 2
    assert "--model resnet19: not one of torchvision's classification models" in capsys.readouterr().err
