"""bench/lora_lm.py and bench/lora_accuracy.py in their tiny modes: every row is measured, the peer
starts from edgetrain's adapters so their losses agree, the smallest-budget schedule runs the same
step, and the accuracy rows' perplexities are consistent between PyTorch + peft and edgetrain."""
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import lora_accuracy  # noqa: E402
import lora_lm  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no host C compiler")


def _rows(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def lm_rows(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-lm")
    out = d / "rows.jsonl"
    assert lora_lm.main(["--tiny", "--steps", "2", "--threads", "1", "--peer-dtypes", "float32", "--frozen", "none",
                         "int4", "--smallest", "int4", "--time-limit", "5", "--work", str(d), "--out", str(out)]) == 0
    return _rows(out)


def test_lora_lm_rows_and_matching_losses(lm_rows):
    by = {(r["system"], r.get("frozen") or r.get("dtype"), r.get("schedule")): r for r in lm_rows}
    assert set(by) == {("pytorch+peft", "float32", None), ("edgetrain", "float32", None),
                       ("edgetrain", "int4", None), ("edgetrain", "int4", "smallest")}
    for r in lm_rows:
        assert r["peak_rss_kb"] > 0 and r["step_s"] >= 0 and len(r["losses"]) == 3
        assert all(math.isfinite(v) for v in r["losses"])
    peer, f32 = by[("pytorch+peft", "float32", None)], by[("edgetrain", "float32", None)]
    assert f32["same_initial_adapters"] and by[("edgetrain", "int4", None)]["same_initial_adapters"]
    # the same adapters, data and SGD: the same losses step for step (float32 rounding)
    assert f32["losses"] == pytest.approx(peer["losses"], rel=1e-5)
    assert f32["losses"][-1] < f32["losses"][0]
    # the schedule at the smallest budget computes the same step as the plain int4 program
    small, int4 = by[("edgetrain", "int4", "smallest")], by[("edgetrain", "int4", None)]
    assert small["losses"] == pytest.approx(int4["losses"], rel=1e-6)
    assert small["lower_bound"] <= small["budget"] and small["schedule_peak"] <= small["budget"]
    assert small["budget"] < small["fixed_ram"] + small["activation_bytes"]
    assert "| edgetrain | int4 | smallest" in lora_lm.table(lm_rows, "tiny")


def test_lora_lm_tables_of_saved_rows(lm_rows, tmp_path, capsys):
    saved = tmp_path / "rows.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in lm_rows))
    assert lora_lm.main(["--tables", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "| edgetrain | int4 | smallest" in out and "| pytorch+peft | float32 | - | 1 |" in out
    # a configuration measured twice: the last row; one measured only over --max-load: its time marked
    quiet = [{**r, "loadavg_1m": 0.0} for r in lm_rows]
    again = {**quiet[0], "step_s": 123.456}
    loaded = {**quiet[1], "loadavg_1m": 50.0}
    saved.write_text("".join(json.dumps(r) + "\n" for r in [loaded] + quiet[:1] + quiet[2:] + [again]))
    out = lora_lm.saved_tables(saved, max_load=2.0)
    assert "123.456" in out and out.count("\n|") == len(lm_rows) + 2  # the header's two lines, then each one
    assert out.count("(load 50.0)") == 1  # measured only under load: kept, its time marked


def test_lora_accuracy_tiny(tmp_path):
    out = tmp_path / "acc.jsonl"
    assert lora_accuracy.main(["--tiny", "--pretrain-steps", "20", "--steps", "4", "--eval-windows", "16",
                               "--work", str(tmp_path), "--out", str(out)]) == 0
    rows = {r["config"]: r for r in _rows(out)}
    assert set(rows) == {"pytorch+peft", "edgetrain", "edgetrain-int4"}
    peer, f32, q4 = rows["pytorch+peft"], rows["edgetrain"], rows["edgetrain-int4"]
    assert f32["same_initial_adapters"] and q4["same_initial_adapters"]
    assert f32["ppl_before"] == pytest.approx(peer["ppl_before"], rel=1e-4)
    assert f32["ppl_after"] == pytest.approx(peer["ppl_after"], rel=1e-3)
    assert q4["ppl_before"] != f32["ppl_before"]  # the int4 base computes with other weights
    assert all(math.isfinite(r[k]) and r[k] > 1 for r in rows.values() for k in ("ppl_before", "ppl_after"))
    # the pretrained base is cached: a second run reuses it
    assert len(list(tmp_path.glob("pretrained-*.pt"))) == 1
