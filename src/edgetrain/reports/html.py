"""Reports people can read: the memory timeline split by kind (as the tiny-training
paper's memory breakdown), the update scheme drawn over the layers, and a schedule's
time x layer map (as POET's figure 2); `write_report` puts them in one HTML page.
"""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import numpy as np

from ..ir import Role, ram_inputs
from ..memory.arena import storage_spans
from ..memory.liveness import inplace_merges, lifetimes
from ..config import format_bytes
from .figures import byte_unit, integer_ticks, legend_outside, pyplot, save

KINDS = ("input data", "forward activations", "backward: gradients and temporaries")
_COLOURS = ("#8172b2", "#4c72b0", "#dd8452")


def memory_by_kind(prog) -> tuple[np.ndarray, int]:
    """(3, nodes) arena bytes held per kind at each node of the training graph (input data,
    values made in the forward phase, values made in the backward), with in-place reuse as
    the arena planner counts it (memory.arena.storage_spans: a storage counts once, for the
    value holding it then), and the position where the backward starts (the first node
    reading the label). The kinds add up to `prog.memory.held_timeline`, never above the arena."""
    g = prog.train_graph
    ram = set(ram_inputs(g))
    n = len(g.nodes)
    label = set(g.inputs_with(Role.LABEL))
    b0 = next((i for i, nd in enumerate(g.nodes) if any(v in label for v in nd.inputs)), n)
    out = np.zeros((3, n + 1), dtype=np.int64)
    produced = {o: i for i, nd in enumerate(g.nodes) for o in nd.outputs}
    lts = lifetimes(g, ram)
    for lt, first, last, nbytes in storage_spans(lts, inplace_merges(g, lts)):
        p = produced.get(lt.root)
        kind = 0 if p is None else (1 if p < b0 else 2)
        out[kind, first] += nbytes
        out[kind, last + 1] -= nbytes
    return np.cumsum(out, axis=1)[:, :n], b0


def plot_memory(prog, path, title: str = "") -> str:
    """Stacked RAM per kind over the training step: the trained weights and optimizer state,
    then the arena bytes held per kind (with in-place reuse), under the planned peak (arena +
    trained weights); PNG at `path`."""
    plt = pyplot()
    kinds, b0 = memory_by_kind(prog)
    m = prog.memory
    x = np.arange(kinds.shape[1])
    fig, ax = plt.subplots(figsize=(11, 4))
    unit, div = byte_unit(m.peak_bytes)
    base = m.trainable_bytes / div
    ax.fill_between(x, 0, np.full(len(x), base), step="mid", color="#55a868", alpha=0.7,
                    label=f"trained weights + optimizer state ({format_bytes(m.trainable_bytes)})")
    acc = np.full(len(x), base)
    for k, name in enumerate(KINDS):
        top = acc + kinds[k] / div
        ax.fill_between(x, acc, top, step="mid", color=_COLOURS[k], alpha=0.75, label=name)
        acc = top
    ax.axhline((m.arena_bytes + m.trainable_bytes) / div, color="k", lw=0.8, ls="--",
               label=f"planned peak {format_bytes(m.peak_bytes)} (arena + weights)")
    if b0 < len(x):
        ax.axvline(b0 - 0.5, color="0.4", lw=0.8, ls=":")
        ax.text(b0, 0.02, " backward →", transform=ax.get_xaxis_transform(), fontsize=8, color="0.2")
    ax.set_xlabel("node (schedule order)")
    ax.set_ylabel(f"RAM, {unit}")
    ax.set_title(title or f"training memory; flash (read-only weights) {format_bytes(m.frozen_bytes)}", fontsize=9)
    integer_ticks(ax.xaxis)
    legend_outside(ax)
    return save(fig, path)


def scheme_rows(prog) -> list[dict]:
    """Per layer (forward order): its kind, weight, the fraction of the weight trained
    (channels) and whether its bias is trained."""
    rows = []
    for i, layer in enumerate(prog.layers):
        sel = prog.trainable.get(layer.weight)
        if layer.weight not in prog.trainable:
            frac = 0.0
        elif sel is None:
            frac = 1.0
        else:
            frac = len(sel.index) / prog.state[layer.weight].shape[sel.dim]
        rows.append(dict(index=i, kind=layer.kind + (" dw" if layer.depthwise else ""), weight=layer.weight,
                         weight_trained=frac, bias_trained=any(b in prog.trainable for b in layer.bias)))
    return rows


def plot_scheme(prog, path, title: str = "") -> str:
    """The update scheme over the layers: bar height = trained fraction of the weight's
    channels, a dot where the bias is trained; PNG at `path`."""
    plt = pyplot()
    rows = scheme_rows(prog)
    fig, ax = plt.subplots(figsize=(11, 3))
    x = np.arange(len(rows))
    ax.bar(x, [r["weight_trained"] for r in rows], color="#4c72b0", label="weight channels trained")
    bx = [r["index"] for r in rows if r["bias_trained"]]
    ax.scatter(bx, [1.05] * len(bx), marker="o", s=12, color="#dd8452", label="bias trained", zorder=3)
    ax.set_ylim(0, 1.15)
    ax.set_xlabel("layer (forward order)")
    ax.set_ylabel("fraction trained")
    ax.set_title(title or f"update scheme: {prog.scheme!r}", fontsize=9)
    integer_ticks(ax.xaxis)
    legend_outside(ax)
    return save(fig, path)


def _embed(draw, *args) -> str:
    buf = io.BytesIO()
    draw(*args, buf)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def write_report(prog, path, sched=None, title: str = "edgetrain report") -> str:
    """One self-contained HTML page: memory summary and timeline by kind, the update scheme
    over the layers, and (given a schedule from et.schedule) its time x layer map."""
    from .schedule_chart import plot_schedule

    m = prog.memory
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>{html.escape(repr(prog))}</p>",
             "<h2>Memory</h2>",
             "<table>" + "".join(f"<tr><td>{k}</td><td style='text-align:right'>{format_bytes(v)}</td></tr>" for k, v in
                                 (("peak RAM (arena + trained weights)", m.peak_bytes), ("arena (in-place reuse)", m.arena_bytes),
                                  ("live peak without in-place reuse", m.activation_bytes),
                                  ("trained weights + optimizer state", m.trainable_bytes),
                                  ("flash (read-only weights)", m.frozen_bytes))) + "</table>",
             f"<img src='{_embed(plot_memory, prog)}' alt='memory timeline'>",
             "<h2>Update scheme</h2>",
             f"<img src='{_embed(plot_scheme, prog)}' alt='update scheme'>",
             "<details><summary>per layer</summary><pre>"
             + html.escape("\n".join(json.dumps(r) for r in scheme_rows(prog))) + "</pre></details>"]
    if sched is not None:
        parts += ["<h2>Rematerialization / paging schedule</h2>", f"<p>{html.escape(sched.summary())}</p>",
                  f"<img src='{_embed(plot_schedule, sched)}' alt='schedule map'>"]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto} img{max-width:100%} "
            "td{padding:2px 12px}</style></head><body>" + "\n".join(parts) + "</body></html>")
    Path(path).write_text(page)
    return str(path)


def report_files(prog, out_dir, sched=None) -> dict[str, str]:
    """report.html plus the PNGs beside it in `out_dir`."""
    from .schedule_chart import plot_schedule

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"html": write_report(prog, out / "report.html", sched),
             "memory": plot_memory(prog, out / "memory.png"), "scheme": plot_scheme(prog, out / "scheme.png")}
    if sched is not None:
        files["schedule"] = plot_schedule(sched, out / "schedule.png")
    return files
