"""A compile past its time limit is killed with every process it started (gcc's cc1 used to
outlive the timeout as an orphan), and the error says so."""
from __future__ import annotations

import os
import time

import pytest

from edgetrain.backends.c import host
from edgetrain.backends.c.toolchain import ToolTimeout, run_tool, run_tools


def _stuck_compiler(tmp_path):
    """A fake `cc` that starts a child (like cc1), writes both pids, and sleeps."""
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\nsleep 300 &\necho $$ $! > \"$PIDS\"\nwait\n")
    cc.chmod(0o755)
    return cc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its parent) is gone for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pids(path) -> list[int]:
    for _ in range(200):  # the script writes the file right after starting its child
        if path.exists() and path.read_text().strip():
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.01)
    raise AssertionError("the fake compiler did not start")


def _assert_gone(pids):
    for _ in range(200):  # SIGKILL is asynchronous: the child's exit may trail the call a moment
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.01)
    raise AssertionError(f"still running: {[p for p in pids if _alive(p)]}")


def test_run_tool_kills_the_process_group(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(pids))
    with pytest.raises(ToolTimeout, match="killed its process group"):
        run_tool([str(_stuck_compiler(tmp_path))], tmp_path, timeout=0.5)
    _assert_gone(_pids(pids))


def test_compile_c_timeout_kills_the_compiler_and_its_children(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(pids))
    monkeypatch.setattr(host, "COMPILE_TIMEOUT", 0.5)
    with pytest.raises(host.CBackendError, match="timed out after 0.5 s .*killed its process group"):
        host.compile_c(str(_stuck_compiler(tmp_path)), ["-c", "model.c"], tmp_path)
    _assert_gone(_pids(pids))


def test_run_tool_returns_output_and_status(tmp_path):
    r = run_tool(["sh", "-c", "echo out; echo err >&2; exit 3"], tmp_path, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")


def test_run_tools_runs_side_by_side_and_returns_in_order(tmp_path):
    """The kernel object's parts (kernel_lib.KERNEL_PARTS) compile at once: each result in its
    argv's place, however they finish; output larger than a pipe's buffer is no deadlock. Side by
    side, not one after another: each tool marks its start and exits 0 only once it has seen the
    other two's marks (one at a time, the first would give up after 20 s with exit 9)."""
    def argv(k):
        return ["sh", "-c", f"touch started{k}; i=0; until [ -e started0 ] && [ -e started1 ] && [ -e started2 ]; do "
                f"i=$((i+1)); [ $i -gt 2000 ] && exit 9; sleep 0.01; done; sleep 0.{3 - k}; echo part {k}; "
                f"head -c 200000 /dev/zero >&2; exit {k}"]
    results = run_tools([argv(k) for k in range(3)], tmp_path, timeout=60, jobs=3)
    assert [(r.returncode, r.stdout) for r in results] == [(k, f"part {k}\n") for k in range(3)]
    assert all(len(r.stderr) == 200000 for r in results)


def test_run_tools_past_its_limit_kills_every_group(tmp_path, monkeypatch):
    files = [tmp_path / f"pids{k}" for k in range(2)]
    argvs = []
    for k, f in enumerate(files):
        cc = tmp_path / f"cc{k}"
        cc.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > \"{f}\"\nwait\n")
        cc.chmod(0o755)
        argvs.append([str(cc)])
    with pytest.raises(ToolTimeout, match="killed the process groups of its 2 running compiles"):
        run_tools(argvs, tmp_path, timeout=0.5, jobs=2)
    for f in files:
        _assert_gone(_pids(f))
