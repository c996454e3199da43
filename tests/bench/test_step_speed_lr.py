"""bench/step_speed.py's --lr: a learning rate that is not a positive number is refused, and a run whose
steps blow up stops with one line that says where and what to change, not a traceback or a timing of
non-finite steps."""
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import step_speed  # noqa: E402


@pytest.mark.parametrize("lr", ["0", "-0.01", "nan", "inf"])
def test_a_learning_rate_that_is_not_positive_is_refused(lr, capsys):
    with pytest.raises(SystemExit) as e:
        step_speed.main([f"--lr={lr}", "--no-ort", "--no-int8"])
    assert e.value.code == 2 and "--lr must be a positive number" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no host C compiler")
def test_a_run_that_blows_up_stops_with_one_line():
    with pytest.raises(SystemExit) as e:
        step_speed.main(["--model", "mbv2-w0.35", "--size", "32", "--batch", "1", "--schemes", "full", "--lr", "1e30",
                         "--repeats", "5", "--warmup", "1", "--no-int8", "--no-ort", "--json-only"])
    msg = str(e.value.code)
    assert msg.startswith("step_speed: mbv2-w0.35 b1 full blew up at lr 1e+30 after 1 warm-up and ")
    assert "loss is nan" in msg and msg.endswith("give a smaller --lr or fewer --repeats")
