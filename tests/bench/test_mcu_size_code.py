"""bench/mcu_size.py --code: the model code by function beside its cycles in the first step (code_rows),
and the bytes in functions that ran under 1 % of the step or not at all (code_summary)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from mcu_size import code_rows, code_summary, show_code  # noqa: E402

ROW = {"model_code_functions": [{"function": "et_big", "bytes": 900}, {"function": "et_graph", "bytes": 500},
                                {"function": "et_unused", "bytes": 300}, {"function": "et_small.constprop.0", "bytes": 40}],
       "functions_first_step": [{"function": "et_big", "cycles": 9000}, {"function": "et_graph", "cycles": 50},
                                {"function": "et_small.constprop.0", "cycles": 950}, {"function": "memcpy", "cycles": 7}]}


def test_each_function_gets_its_cycles_and_one_that_did_not_run_gets_zero():
    rows = code_rows(ROW)
    assert [(r["function"], r["bytes"], r["cycles"]) for r in rows] == [
        ("et_big", 900, 9000), ("et_graph", 500, 50), ("et_unused", 300, 0), ("et_small.constprop.0", 40, 950)]
    # no cycle count (the firmware did not run): None, not 0
    assert {r["cycles"] for r in code_rows({"model_code_functions": ROW["model_code_functions"]})} == {None}


def test_summary_counts_cold_and_idle_bytes():
    s = code_summary(code_rows(ROW), step_cycles=10_007)  # 1 %: 100 cycles
    assert s == {"bytes": 1740, "functions": 4, "cold_bytes": 800, "cold_functions": 2, "idle_bytes": 300,
                 "idle_functions": 1}


def test_table_lists_the_largest_first_and_the_summary(capsys):
    show_code(code_rows(ROW), 2, 10_007)
    out = capsys.readouterr().out
    assert "1.7 KB in 4 functions" in out and "the 2 largest" in out
    assert out.index("et_big") < out.index("et_graph") and "et_unused" not in out
    assert "0.8 KB of the model code (2 functions)" in out and "not run in the step: 0.3 KB (1 function)" in out
    show_code(code_rows({"model_code_functions": ROW["model_code_functions"]}), 4, None)
    out = capsys.readouterr().out
    assert "et_unused" in out and "not run" not in out
