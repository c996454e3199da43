"""Running a compiler (or make) with a time limit that really ends it.

`subprocess.run(..., timeout=)` kills only the process it started: gcc's cc1 (and make's
compilers) are grandchildren and kept running as orphans after a timeout. Here the tool
starts in a session of its own, and a timeout kills that whole process group."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .layout import CBackendError


class ToolTimeout(CBackendError):
    """A compile ran past its time limit; its whole process group was killed."""


@dataclass(frozen=True)
class ToolResult:
    returncode: int
    stdout: str
    stderr: str


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session's group: the tool and every child it started
    except ProcessLookupError:
        pass


def run_tool(argv: Sequence[str], cwd: Optional[Path] = None, timeout: Optional[float] = None) -> ToolResult:
    """Run `argv` in `cwd` in a new session; past `timeout` seconds kill its process group and
    raise ToolTimeout (an interrupt of the caller kills the group too)."""
    proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        raise ToolTimeout(f"{Path(argv[0]).name} timed out after {timeout} s in {cwd}: killed its process group "
                          f"(pid {proc.pid}) and every compiler process in it") from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    return ToolResult(proc.returncode, out, err)
