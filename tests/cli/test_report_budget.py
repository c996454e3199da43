"""`edgetrain report` with a budget no schedule meets (issue 34, item 1): the figures that need no
schedule are written all the same, the exit is 3 (does not fit), and the message names the
--fraction to try; the documented command (README, docs/tutorial.md) runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "docs" / "examples" / "digits.py"
ARGS = (f"{DIGITS}:build", "--input", "8x1x28x28", "--device", "m4f")


def _documented_fraction() -> str:
    """The --fraction of the report command the README and the tutorial give (the same in both)."""
    found = {m for doc in ("README.md", "docs/tutorial.md")
             for m in re.findall(r"edgetrain report docs/examples/digits\.py:build --input 8x1x28x28 --fraction\s+"
                                 r"([\d.]+) --device m4f", (ROOT / doc).read_text())}
    assert len(found) == 1, found
    return found.pop()


def test_the_documented_report_command_runs(cli, tmp_path):
    code, out, err = cli("report", *ARGS, "--fraction", _documented_fraction(), "-o", tmp_path / "r")
    assert code == 0, err
    assert {p.name for p in (tmp_path / "r").iterdir()} >= {"report.html", "memory.png", "scheme.png",
                                                             "schedule.png"}


@pytest.mark.parametrize("fraction", ["0.8", "0.84"])
def test_a_budget_too_small_writes_the_figures_and_names_the_fraction_to_try(cli, tmp_path, fraction):
    """0.8 is below the problem's proven lower bound (no solve needed); 0.84 passes it, and the
    MILP then finds the smallest budget that fits."""
    code, out, err = cli("report", *ARGS, "--fraction", fraction, "-o", tmp_path / "r")
    assert code == 3
    assert {p.name for p in (tmp_path / "r").iterdir()} == {"report.html", "memory.png", "scheme.png"}
    hint = re.search(r"--fraction ([\d.]+) \(--ram ([\d,]+) bytes\)", err)
    assert hint and float(hint.group(1)) > float(fraction), err
    assert "the report above has no schedule" in err and len(err.strip().splitlines()) == 1
    if fraction == "0.84":  # the smallest budget that fits, found: the command with it runs
        assert "the smallest budget that fits" in err
        code, _, err2 = cli("report", *ARGS, "--fraction", hint.group(1), "-o", tmp_path / "r2")
        assert code == 0, err2
