"""The executor layer without starting Ray (seconds): the results file keeps what finished
and refuses what it cannot trust, a rerun skips finished pieces, the serial path needs no
Ray, and asking for Ray without it says how to install it."""
import json
import sys

import pytest

from edgetrain.scale import (Executor, RayExecutor, ResultsFile, ScaleError, SerialExecutor, as_executor,
                             run_pieces)
from edgetrain.sparse import analyze_contributions

from ..sparse.nets import FAST, Counting, task, tiny_net



def square(shared, arg):
    return shared * arg * arg


def test_serial_results_in_order_of_the_pieces():
    seen = []
    out = run_pieces(square, 2, {"b": 3, "a": 1}, progress=lambda k, v: seen.append((k, v)))
    assert list(out.items()) == [("b", 18), ("a", 2)]
    assert seen == [("b", 18), ("a", 2)]


def test_rerun_skips_finished_pieces(tmp_path):
    path = tmp_path / "r.jsonl"
    first = Counting()
    assert run_pieces(square, 1, {"x": 2, "y": 3}, executor=first, results=path, job="j") == {"x": 4, "y": 9}
    assert first.ran == ["x", "y"]
    again = Counting()
    seen = []
    out = run_pieces(square, 1, {"y": 3, "z": 4, "x": 2}, executor=again, results=path, job="j",
                     progress=lambda k, v: seen.append(k))
    assert out == {"y": 9, "z": 16, "x": 4} and list(out) == ["y", "z", "x"]
    assert again.ran == ["z"]  # only the new piece ran
    assert sorted(seen) == ["x", "y", "z"]
    assert ResultsFile(path, "j").load() == {"x": 4, "y": 9, "z": 16}


def test_a_killed_writer_loses_only_the_line_it_was_writing(tmp_path):
    path = tmp_path / "r.jsonl"
    run_pieces(square, 1, {"x": 2}, results=path, job="j")
    with open(path, "ab") as f:
        f.write(b'{"key":"y","val')  # died mid-line
    assert ResultsFile(path, "j").load() == {"x": 4}
    run_pieces(square, 1, {"y": 3}, results=path, job="j")
    assert ResultsFile(path, "j").load() == {"x": 4, "y": 9}


@pytest.mark.parametrize("text, reason", [
    ('{"format": "something-else/1", "job": "j"}\n', "not an edgetrain results file"),
    ("hello\n", "line 1 is damaged"),
    ('{"format": "edgetrain-scale-results/1", "job": "other"}\n', "another job"),
    ('{"format": "edgetrain-scale-results/1", "job": "j"}\n{"key": "x", "value": 4}\nnot json\n', "line 3"),
    ('{"format": "edgetrain-scale-results/1", "job": "j"}\n{"key": 1, "value": 4}\n', "line 2"),
    ("no newline at all", "no header line"),
])
def test_foreign_or_damaged_results_are_refused(tmp_path, text, reason):
    path = tmp_path / "r.jsonl"
    path.write_text(text)
    ran = Counting()
    with pytest.raises(ScaleError, match=reason):
        run_pieces(square, 1, {"x": 2}, executor=ran, results=path, job="j")
    assert ran.ran == []


def test_results_must_survive_json(tmp_path):
    with pytest.raises(ScaleError, match="survive JSON"):
        run_pieces(lambda s, a: (a, a), None, {"x": 1}, results=tmp_path / "r.jsonl", job="j")
    with pytest.raises(ScaleError, match="cannot be saved as JSON"):
        run_pieces(lambda s, a: float("nan"), None, {"x": 1}, results=tmp_path / "q.jsonl", job="j")


def test_bad_arguments_are_refused():
    with pytest.raises(ScaleError, match="executor must be one of"):
        as_executor("threads")
    with pytest.raises(ScaleError, match="address"):
        RayExecutor(address="")
    with pytest.raises(ScaleError, match="max_retries"):
        RayExecutor(max_retries=-1)
    with pytest.raises(ScaleError, match="num_cpus"):
        RayExecutor(num_cpus=0)
    with pytest.raises(ScaleError, match="mapping"):
        run_pieces(square, 1, [1, 2])
    assert isinstance(as_executor(None)[0], SerialExecutor) and isinstance(as_executor("ray")[0], RayExecutor)
    mine = SerialExecutor()
    assert as_executor(mine) == (mine, False)


def test_without_ray_the_serial_path_runs_and_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    model = tiny_net()
    data = task(48, seed=1), task(32, seed=2)
    table = analyze_contributions(model, *data, layers=[6], ratios=[0.5], bias_ks=[2], config=FAST)
    assert set(table.weight_gains) == {(6, 0.5)}
    with pytest.raises(ScaleError, match=r'pip install -e "\.\[scale\]"'):
        analyze_contributions(model, *data, layers=[6], ratios=[0.5], bias_ks=[2], config=FAST, executor="ray")


def test_an_executor_is_an_interface():
    with pytest.raises(TypeError):
        Executor()  # map is abstract


def test_the_results_file_is_json_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    run_pieces(square, 1, {"x": 2}, results=path, job="j")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"format": "edgetrain-scale-results/1", "job": "j"}, {"key": "x", "value": 4}]
