"""edgetrain.reports.html: the memory timeline by kind adds up to the memory report, and the
HTML page embeds its charts."""
from __future__ import annotations

import torch
from torch import nn

import edgetrain as et
from edgetrain.reports.html import memory_by_kind, report_files, scheme_rows


def small_prog(update=et.Full()):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    return et.compile(m, (torch.randn(2, 3, 8, 8),), update=update)


def test_kinds_sum_to_the_arena_bytes_held():
    prog = small_prog()
    kinds, b0 = memory_by_kind(prog)
    m = prog.memory
    assert kinds.sum(axis=0).tolist() == list(m.held_timeline)
    # drawn with in-place reuse, the stack never rises above the planned arena (the old
    # drawing, live bytes without reuse, did: it looked like an overflow)
    assert max(m.held_timeline) <= m.arena_bytes < max(m.timeline)
    assert 0 < b0 < len(prog.train_graph.nodes)
    assert kinds[2, :b0].sum() == 0, "nothing of the backward is live before it starts"


def test_scheme_rows_follow_the_update_scheme():
    rows = scheme_rows(small_prog(et.LastK(1)))
    assert [r["weight_trained"] for r in rows] == [0.0, 0.0, 1.0]
    assert [r["bias_trained"] for r in rows] == [False, False, True]
    assert all(r["weight_trained"] == 1.0 for r in scheme_rows(small_prog()))


def test_report_page_embeds_its_charts(tmp_path):
    prog = small_prog()
    sched = et.schedule(prog, device="a72", solver="none")
    files = report_files(prog, tmp_path, sched)
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    for k in ("memory", "scheme", "schedule"):
        assert (tmp_path / f"{k}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", files[k]


def test_cli_report_and_schedule(tmp_path, capsys):
    from edgetrain.app.cli import main

    assert main(["report", "resnet18-cifar", "--batch", "8", "--fraction", "0.5", "--time-limit", "30",
                 "-o", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"report.html", "memory.png", "scheme.png", "schedule.png"}
    assert main(["schedule", "resnet18-cifar", "--batch", "8", "--fraction", "0.5", "--json"]) == 0
    import json

    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["peak_bytes"] <= row["ram"] and row["energy_j"] <= 1.01 * row["base_energy_j"]
    # a budget below what any schedule needs: exit 3 and the smallest that could fit
    assert main(["schedule", "resnet18-cifar", "--batch", "8", "--fraction", "0.1"]) == 3
    assert "no schedule fits below" in capsys.readouterr().err
