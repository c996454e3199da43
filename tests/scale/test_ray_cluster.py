"""Contribution analysis on a local Ray with 2 workers (one Ray for the module, about half a
minute): the table equals the serial one bit for bit, also when a worker is killed in the
middle of a piece (Ray runs the piece again), and pieces finished on Ray are skipped by a
serial rerun reading the same results file."""
import os
import warnings
from pathlib import Path

import pytest

from edgetrain.scale import RayExecutor, SerialExecutor, run_pieces
from edgetrain.sparse import analyze_contributions

from ..sparse.nets import GRID, task, tiny_net

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a local Ray starts (5-10 s) and runs three analyses: half a minute
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)



def same_table(a, b) -> bool:
    """Every measured figure equal (meta holds the seconds each run took)."""
    return (a.layers, a.base_accuracy, a.bias_gains, a.weight_gains, a.stderr, a.weight_base) == \
        (b.layers, b.base_accuracy, b.bias_gains, b.weight_gains, b.stderr, b.weight_base)


class KillFirstAttempt:
    """Runs a piece, except that the first attempt of piece `victim` kills its worker
    process (os._exit, as the OOM killer would), leaving `marker` behind."""

    def __init__(self, fn, victim: str, marker: str):
        self.fn, self.victim, self.marker = fn, victim, marker

    def __call__(self, shared, keyed):
        key, arg = keyed
        if key == self.victim and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        return self.fn(shared, arg)


class KillingRay(RayExecutor):
    """The Ray executor with one piece's worker killed on its first attempt."""

    def __init__(self, victim_index: int, marker: Path):
        super().__init__()
        self.victim_index, self.marker = victim_index, str(marker)

    def map(self, fn, shared, pieces):
        victim = list(pieces)[min(self.victim_index, len(pieces) - 1)]
        keyed = {key: (key, arg) for key, arg in pieces.items()}
        yield from super().map(KillFirstAttempt(fn, victim, self.marker), shared, keyed)


@pytest.fixture(scope="module")
def local_ray():
    executor = RayExecutor(num_cpus=2)  # starts a local Ray of 2 workers on first use:
    # use it now, so that every test of the module finds it running whichever pytest-xdist
    # worker runs that test (the killed-worker test's own executor then joins it, not starts one)
    assert run_pieces(echo, None, {"up": 1}, executor=executor) == {"up": 1}
    yield executor
    executor.close()
    assert not ray.is_initialized()  # the Ray it started is stopped


@pytest.fixture(scope="module")
def data():
    return task(96, seed=1), task(64, seed=2)


def test_ray_table_equals_the_serial_table(local_ray, data, tmp_path):
    serial = analyze_contributions(tiny_net(), *data, **GRID)
    seen = []
    on_ray = analyze_contributions(tiny_net(), *data, **GRID, executor=local_ray, results=tmp_path / "r.jsonl",
                                   progress=lambda label, top1: seen.append(label))
    assert same_table(serial, on_ray)
    assert len(seen) == 9 and ray.is_initialized()
    assert ray.cluster_resources().get("CPU") == 2

    class Refuse(SerialExecutor):
        def map(self, fn, shared, pieces):
            raise AssertionError(f"ran {list(pieces)} again")

    rerun = analyze_contributions(tiny_net(), *data, **GRID, executor=Refuse(), results=tmp_path / "r.jsonl")
    assert same_table(serial, rerun)


def test_a_killed_worker_is_retried_and_changes_nothing(local_ray, data, tmp_path):
    marker = tmp_path / "killed"
    killing = KillingRay(victim_index=1, marker=marker)
    try:
        table = analyze_contributions(tiny_net(), *data, **GRID, executor=killing)
    finally:
        killing.close()  # uses the module's Ray: leaves it running
    assert marker.exists()  # a worker did die
    assert ray.is_initialized()
    assert same_table(table, analyze_contributions(tiny_net(), *data, **GRID))


def test_a_piece_that_raises_is_not_retried(local_ray, tmp_path):
    """Its own error would come again: it is raised at once, after one attempt."""
    attempts = tmp_path / "attempts"
    with pytest.raises(ZeroDivisionError):
        run_pieces(divide, str(attempts), {"a": 1, "b": 0}, executor=local_ray)
    assert attempts.read_text().count("b") == 1


def divide(log: str, arg):
    with open(log, "a") as f:
        f.write("ab"[arg == 0])
    return 1 / arg


def echo(shared, arg):
    return arg
