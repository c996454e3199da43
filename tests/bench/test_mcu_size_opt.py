"""bench/mcu_size.py --opt: the firmware's model.c at another optimisation level (opt_flag), written to a
project of its own (project_dir), and named as such in the printed rows."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et

from edgetrain.backends.c import cortexm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from mcu_size import OPT_LEVELS, flash_table, main, opt_flag, project_dir, show  # noqa: E402


def test_levels_are_gcc_flags_and_the_default_is_the_backends():
    assert [opt_flag(x) for x in OPT_LEVELS] == ["-O2", "-O3", "-Os", "-O1"]
    assert opt_flag("O2") == cortexm.DEFAULT_OPT
    for bad in ("O9", "-Os", "Os -fno-inline", ""):
        with pytest.raises(ValueError, match="--opt"):
            opt_flag(bad)


def test_a_level_other_than_the_default_gets_its_own_project(tmp_path):
    assert project_dir(tmp_path, "mbv2-w0.35", "cortex-m7", "O2") == tmp_path / "mbv2-w0.35-cortex-m7"
    assert project_dir(tmp_path, "mbv2-w0.35", "cortex-m7", "Os") == tmp_path / "mbv2-w0.35-cortex-m7-Os"


def test_the_level_reaches_the_projects_make_config(tmp_path):
    """Through the call measure() makes (cortexm.emit_firmware, which passes opt down to config.mk)."""
    torch.manual_seed(0)
    prog = et.compile(nn.Sequential(nn.Flatten(), nn.Linear(8, 3)), (torch.zeros(1, 2, 2, 2),), update=et.Full(),
                      optimizer=et.SGD(lr=0.1))
    one = [(np.zeros((1, 2, 2, 2), np.float32), np.array([1]))]
    for level in ("O2", "Os"):
        d = project_dir(tmp_path, "tiny", "cortex-m7", level)
        cortexm.emit_firmware(prog, d, "cortex-m7", one, opt=opt_flag(level))
        cfg = (d / "config.mk").read_text()
        assert [l.split()[:3] for l in cfg.splitlines() if l.startswith("OPT")] == [["OPT", "=", opt_flag(level)]]


def test_an_unknown_level_is_refused_before_anything_is_built(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--opt", "O9", "--no-run"])
    assert e.value.code == 2 and "O9" in capsys.readouterr().err


def test_the_flash_table_names_a_row_built_at_another_level(capsys):
    row = {"model": "mbv2-w0.35", "flash_kb": 385.1, "flash_no_samples_kb": 337.1, "planned_flash_kb": 221.5,
           "weights_kb": 256.7, "flash_per_frozen": 1.74, "flash_no_samples_per_frozen": 1.52,
           "flash_per_weights": 1.5, "flash_no_samples_per_weights": 1.31, "flash_requant_kb": 23.1,
           "flash_constants_kb": 11.0, "flash_model_code_kb": 41.3, "flash_other_kb": 5.0, "flash_program_kb": 80.4}
    flash_table([{**row, "opt": "-O2"}, {**row, "opt": "-Os"}, row])
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| mbv2")]
    assert [l.split(" | ")[0] for l in lines] == ["| mbv2-w0.35", "| mbv2-w0.35 (-Os)", "| mbv2-w0.35"]


def test_the_header_names_a_level_other_than_the_default(capsys):
    row = {"model": "mbv2-w0.35", "scheme": "49kb", "target": "cortex-m7", "backward": "float", "planned_peak_kb": 106.6,
           "planned_flash_kb": 221.5, "paper_peak_kb": 141, "paper_ms_per_image": 373, "link_error": ["overflowed"]}
    for level, head in (("-Os", "(49kb scheme, cortex-m7, -Os, float backward)"),
                        ("-O2", "(49kb scheme, cortex-m7, float backward)"), (None, "(49kb scheme, cortex-m7, float backward)")):
        show(row if level is None else {**row, "opt": level})
        assert head in capsys.readouterr().out
