"""The HTML report as a user sees it: rendered by headless Chromium (Debian's
chromium-headless-shell, which .ci/run installs), every chart is there, decoded and drawn at
a readable size within the page; and the charts themselves keep their data clear of the
legend and put integer ticks on layer and node axes."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

import edgetrain as et
from edgetrain.reports.html import plot_memory, plot_scheme, report_files
from tests.report.test_report import small_prog

CHROMIUM = next((p for p in map(shutil.which, ("chromium-headless-shell", "chromium", "chromium-browser")) if p), None)

#: appended to a copy of the page: after load, the size of every image as the page lays it out
#: (naturalWidth 0 = not decoded), written into the DOM that --dump-dom prints
_PROBE = """<script>window.addEventListener('load', () => {
  const rows = [...document.images].map(i => ({alt: i.alt, complete: i.complete, natural: [i.naturalWidth,
    i.naturalHeight], shown: [i.clientWidth, i.clientHeight]}));
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify({images: rows, page: document.documentElement.clientWidth});
  document.body.appendChild(pre);
});</script>"""


def rendered_images(page_path, tmp_path) -> dict:
    probe = tmp_path / "probe.html"
    probe.write_text(page_path.read_text().replace("</body>", _PROBE + "</body>"))
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
                          "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert m, f"no probe in Chromium's DOM (rc {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_report_renders_every_chart_readably(tmp_path):
    prog = small_prog()
    sched = et.schedule(prog, device="a72", solver="none")
    files = report_files(prog, tmp_path / "r", sched)
    seen = rendered_images(tmp_path / "r" / "report.html", tmp_path)
    assert [i["alt"] for i in seen["images"]] == ["memory timeline", "update scheme", "schedule map"], files
    for img in seen["images"]:
        w, h = img["natural"]
        sw, sh = img["shown"]
        assert img["complete"] and w > 0 and h > 0, f"{img['alt']} is not decoded"
        # drawn within the page's width, at least 600 px wide, with its aspect ratio kept
        assert 600 <= sw <= seen["page"], img
        assert abs(sh / sw - h / w) < 0.02, img


def _legend_clear_of(ax, fig) -> bool:
    """Whether the axes' legend lies outside the data area (it covers no bar or line)."""
    fig.canvas.draw()
    leg = ax.get_legend().get_window_extent()
    box = ax.get_window_extent()
    return leg.x0 >= box.x1 or leg.x1 <= box.x0 or leg.y0 >= box.y1 or leg.y1 <= box.y0


@pytest.mark.parametrize("draw", ["memory", "scheme", "timeline"])
def test_charts_keep_the_legend_off_the_data_and_integer_ticks(draw, tmp_path, monkeypatch):
    from edgetrain.reports import figures

    kept = {}
    real_save = figures.save

    def keep(fig, path):
        kept["fig"] = fig
        fig.canvas.draw()
        kept["ticks"] = [t for t in fig.axes[0].get_xticks() if fig.axes[0].get_xlim()[0] <= t <= fig.axes[0].get_xlim()[1]]
        kept["clear"] = _legend_clear_of(fig.axes[0], fig)
        return real_save(fig, path)

    import edgetrain.reports.html as html
    import edgetrain.reports.memory_timeline as tl

    monkeypatch.setattr(html, "save", keep)
    monkeypatch.setattr(tl, "save", keep)
    prog = small_prog()
    {"memory": lambda: plot_memory(prog, tmp_path / "m.png"), "scheme": lambda: plot_scheme(prog, tmp_path / "s.png"),
     "timeline": lambda: prog.memory.plot(tmp_path / "t.png")}[draw]()
    assert kept["clear"], "the legend covers the plot"
    assert kept["ticks"] and all(float(t).is_integer() for t in kept["ticks"]), kept["ticks"]


def test_memory_table_and_axes_use_the_summary_units(tmp_path):
    """The page's memory table writes each figure as the CLI's summary does (config.format_bytes:
    KB below 1 MB, MB above), and a chart's axis switches to MB for a model whose step needs MBs."""
    from edgetrain.config import format_bytes
    from edgetrain.reports.figures import byte_unit

    prog = small_prog()
    report_files(prog, tmp_path)
    page = (tmp_path / "report.html").read_text()
    for v in (prog.memory.peak_bytes, prog.memory.arena_bytes, prog.memory.trainable_bytes):
        assert f">{format_bytes(v)}<" in page
    assert byte_unit(300 * 1024) == ("KB", 1024) and byte_unit(3 * 1024 ** 2) == ("MB", 1024 ** 2)
