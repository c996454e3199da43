"""bench/poet.py runs its solves as independent pieces (scale.run_pieces): whatever order
an executor finishes them in (Ray's is arrival order), the rows written are the serial
ones, in the order of the grid."""
import json
import sys
from argparse import Namespace
from pathlib import Path

from edgetrain.scale import SerialExecutor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import poet  # noqa: E402

TIMING = ("solve_s",)  # seconds measured, not results


class Backwards(SerialExecutor):
    """Finishes the pieces last first, as a busy cluster might."""

    def map(self, fn, shared, pieces):
        for key in reversed(list(pieces)):
            yield key, fn(shared, pieces[key])


def rows_of(tmp_path, executor, name):
    out = tmp_path / f"{name}.jsonl"
    args = Namespace(cases=["mbv2-w0.35:1:32"], devices=["m7"], fractions=[1.0, 0.5], solvers=["none", "chen"],
                     time_limit=10.0, deadline_factor=None, map_fraction=0.5, out=str(out), charts="",
                     executor=executor)
    printed = poet.run(args)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == printed
    return [{k: v for k, v in r.items() if k not in TIMING} for r in written]


def test_rows_do_not_depend_on_the_order_pieces_finish(tmp_path, capsys):
    serial = rows_of(tmp_path, None, "serial")
    backwards = rows_of(tmp_path, Backwards(), "backwards")
    assert backwards == serial
    assert [(r["fraction"], r["solver"]) for r in serial] == [(1.0, "none"), (1.0, "chen"), (0.5, "none"),
                                                              (0.5, "chen")]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["fraction"], r["solver"]) for r in printed[4:]] == [(0.5, "chen"), (0.5, "none"), (1.0, "chen"),
                                                                   (1.0, "none")]  # as they finished
