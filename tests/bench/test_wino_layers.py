"""bench/wino_layers.py on small layers: a row per layer with each setting's three passes, the Winograd path's
GEMM library named where the path takes the layer and "not taken" where it does not (4 tiles), on one thread
and with --threads 2."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from edgetrain.backends.c import blas

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import wino_layers  # noqa: E402

pytestmark = pytest.mark.skipif(blas.library_blas() is None, reason="no BLAS installed")


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_of_a_taken_and_a_left_layer(threads):
    """On one thread (the serial library) and on two (--threads: the threaded library on 2 threads)."""
    args = argparse.Namespace(batch=1, repeats=1, warmup=0, cflags="", threads=threads)
    taken, left = wino_layers.measure(32, 16, args), wino_layers.measure(32, 4, args)
    assert taken["threads"] == left["threads"] == threads  # the runner's own thread count
    settings = {"direct", "wino_blas"} | ({"wino_onednn"} if blas.dnnl() is not None else set())
    for row in (taken, left):
        assert set(row["ms"]) == settings
        for passes in row["ms"].values():
            assert set(passes) == {"forward", "input gradient", "weight gradient"}
            assert all(v > 0 for v in passes.values())
    assert taken["gemm_library_chosen"] in ("BLAS", "oneDNN matmul")
    assert left["gemm_library_chosen"] == "not taken"
    assert "| 32:16, b1 | forward |" in wino_layers.table([taken, left])
