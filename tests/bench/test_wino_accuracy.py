"""bench/wino_accuracy.py on torchvision's resnet18 at 32x32, batch 2: the float32 reference's row, then the C
program with every 3x3 stride-1 convolution as F(4x4, 3x3) (its 13 convolutions' three passes each on the path,
all of them so), its gradients within F(4x4, 3x3)'s rounding of both references (tests/backends/c/test_wino.py's
tolerance for it); an unknown mode is refused before anything is built."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from edgetrain.backends.c import blas

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import wino_accuracy  # noqa: E402

pytestmark = pytest.mark.skipif(blas.library_blas() is None, reason="no BLAS installed")


def test_the_rows_of_every_convolution_as_f4x4():
    args = argparse.Namespace(model="resnet18", size=32, batch=2, modes="f4")
    ref, f4 = wino_accuracy.rows(args)
    assert (ref["mode"], ref["passes"]) == ("float32 reference", None)
    assert 0 < ref["vs_float64"] < 1e-5
    assert (f4["mode"], f4["passes"], f4["f4"]) == ("f4", 13 * 3, 13 * 3)
    assert 0 < f4["vs_float32"] < 3e-5 and 0 < f4["vs_float64"] < 3e-5
    assert f4["worst_float32"].endswith((".weight", ".bias")) and f4["worst_float64"].endswith((".weight", ".bias"))
    assert "| resnet18 32x32 b2 | f4 | 39 (39) |" in wino_accuracy.table([ref, f4])


def test_an_unknown_mode_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        wino_accuracy.main(["--modes", "f4,f8"])
    assert e.value.code == 2
    assert "unknown modes ['f8']" in capsys.readouterr().err
