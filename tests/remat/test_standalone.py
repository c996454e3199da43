"""A scheduled program as a standalone host binary (issue 21): `prog.apply(sched).emit_c(out,
embed_weights=False)`, `make main`, run on a samples file with the weights file, paging to a
real file; its weights after N steps, and the gradients of the next sample at them
(`--save-grads`: the scheduled gradient graph, a fused gradient+update's gradient computed
whole), are the unscheduled binary's bit for bit (the same kernels built with the same flags
on the same data: recomputation repeats a node's float sums in the same order and paging
copies bytes), and within the C tests' float tolerance of the reference runtime's."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from edgetrain.autodiff import grad_name
from edgetrain.backends.c.weights_file import read_weights
from tests.remat.test_apply import hand_schedule, mixed, tiny_case, zoo_case

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
STEPS = 3
#: the reference runtime against the C build (tests/backends/c's float tolerance)
RTOL, ATOL = 1e-5, 1e-6


def build_and_train(prog, x, y, d):
    """Emit `prog` with its weights in a file and its gradient graph, build main, train STEPS
    steps, then save the gradients of the next sample; (stdout, weights, gradients)."""
    out = prog.emit_c(d, target="host", samples=[(x, y)], embed_weights=False, graphs=("train", "grad"))
    subprocess.run(["make", "-s", "main"], cwd=out, check=True, capture_output=True, timeout=300)
    r = subprocess.run(["./main", "weights.bin", "samples.bin", "--steps", str(STEPS), "--pages", "pages.bin",
                        "--save", "trained.bin", "--save-grads", "grads.bin"], cwd=out, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "guards ok" in r.stdout
    return r.stdout, read_weights(out / "trained.bin"), read_weights(out / "grads.bin")


@pytest.mark.parametrize("which", ["cnn", "transformer"])
def test_scheduled_binary_trains_as_the_unscheduled_one(tmp_path, which):
    case = tiny_case() if which == "cnn" else zoo_case("bert-tiny")
    x, y = np.asarray(case.x), np.asarray(case.y)
    sched = hand_schedule(case.problem, mixed)
    assert sched.recomputations and sched.page_ins and sched.page_out
    sp = case.prog.apply(sched)
    assert "page_in" in {n.op for n in sp.grad_graph.nodes}  # the scheduled gradients, fused updates or not
    out, got, got_grads = build_and_train(sp, x, y, tmp_path / "scheduled")
    plain_out, want, want_grads = build_and_train(case.prog, x, y, tmp_path / "plain")
    assert set(got) == set(want) and set(got) >= set(case.prog.trainable)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert set(got_grads) == set(want_grads) == {grad_name(p) for p in case.prog.trainable} | {"loss"}
    for k in want_grads:
        np.testing.assert_array_equal(got_grads[k], want_grads[k], err_msg=k)
    losses = [float(v) for v in re.findall(r"loss (\S+)", out)]
    assert losses == [float(v) for v in re.findall(r"loss (\S+)", plain_out)]
    m = re.search(r"paged_in_bytes (\d+) paged_out_bytes (\d+)", out)
    assert (int(m.group(1)), int(m.group(2))) == (STEPS * sched.page_in_bytes, STEPS * sched.page_out_bytes)
    # a real file: the page store's bytes up to the end of its last tensor (the rest is alignment)
    assert sp.page_store.nbytes - 16 < (tmp_path / "scheduled" / "pages.bin").stat().st_size <= sp.page_store.nbytes
    assert int(re.search(r"peak_rss_kb (\d+)", out).group(1)) > 0
    ref = case.prog  # the reference runtime, the same steps, then the same gradients
    ref_state = {k: np.array(v, copy=True) for k, v in ref.state.items()}
    try:
        ref_losses = [ref.step(x, y) for _ in range(STEPS)]
        for k in case.prog.trainable:
            np.testing.assert_allclose(got[k], np.asarray(ref.state[k]).reshape(-1), rtol=RTOL, atol=ATOL, err_msg=k)
        ref_grads = ref.gradients(x, y)
        assert {grad_name(k) for k in ref_grads} == set(got_grads) - {"loss"}
        top = max(float(np.abs(g).max()) for g in ref_grads.values())
        for k, g in ref_grads.items():
            # C sums in another order: relative to the largest entry, or to 1 % of the model's largest gradient
            # (attention's key bias has a gradient of exactly zero in exact arithmetic: rounding noise)
            scale = max(float(np.abs(g).max()), 1e-2 * top)
            np.testing.assert_allclose(got_grads[grad_name(k)] / scale, np.asarray(g).reshape(-1) / scale,
                                       rtol=RTOL, atol=ATOL, err_msg=k)
    finally:
        ref.state = ref_state  # the case is shared with other tests
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
