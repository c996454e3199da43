"""Running a compiler (or make) with a time limit that really ends it; finding the host's C
compiler (and so the backend every command defaults to); a long build that says so.

`subprocess.run(..., timeout=)` kills only the process it started: gcc's cc1 (and make's
compilers) are grandchildren and kept running as orphans after a timeout. Here the tool
starts in a session of its own, and a timeout kills that whole process group.

Every command runs a program on "c" when a host C compiler is found and on "reference"
otherwise (default_backend); a build that runs past a second says what it builds and why, and
shows its elapsed time on stderr (announced_build)."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

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
    raise ToolTimeout (an interrupt of the caller kills the group too): run_tools of one."""
    return run_tools([argv], cwd, timeout, 1)[0]


def run_tools(argvs: Sequence[Sequence[str]], cwd: Optional[Path], timeout: Optional[float],
              jobs: int) -> list[ToolResult]:
    """Run every argv of `argvs` in `cwd`, at most `jobs` at once, each in a session of its own (their
    output through files: no pipe fills); their results in order. Past `timeout` seconds from the
    start (None: no limit), or on an interrupt, every running tool's process group is killed (gcc's
    cc1 and make's compilers with it) and ToolTimeout (or the interrupt) raised."""
    log = logging.getLogger(__name__)
    results: list[Optional[ToolResult]] = [None] * len(argvs)
    pending = list(enumerate(argvs))
    running: dict = {}
    t0 = time.monotonic()
    deadline = t0 + timeout if timeout is not None else float("inf")
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                i, argv = pending.pop(0)
                log.debug("running %s (in %s)", " ".join(map(str, argv)), cwd or ".")
                out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
                running[i] = (subprocess.Popen(list(argv), cwd=cwd, stdout=out, stderr=err, text=True,
                                               start_new_session=True), out, err)
            if len(running) == 1 and not pending:  # one left: wait for it, not in polls
                proc = next(iter(running.values()))[0]
                try:
                    proc.wait(timeout=None if deadline == float("inf") else max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            done = [i for i, (proc, _, _) in running.items() if proc.poll() is not None]
            for i in done:
                proc, out, err = running.pop(i)
                out.seek(0)
                err.seek(0)
                results[i] = ToolResult(proc.returncode, out.read(), err.read())
                out.close()
                err.close()
                log.debug("%s exited with %d after %.2f s", Path(argvs[i][0]).name, proc.returncode,
                          time.monotonic() - t0)
            if not done:
                if time.monotonic() > deadline:
                    what = (f"killed its process group (pid {next(iter(running.values()))[0].pid}) and every compiler "
                            f"process in it" if len(argvs) == 1 else
                            f"killed the process groups of its {len(running)} running compiles")
                    raise ToolTimeout(f"{Path(argvs[0][0]).name} timed out after {timeout} s in {cwd}: {what}")
                time.sleep(0.02)
    except BaseException:
        for proc, out, err in running.values():
            _kill_group(proc)
            proc.wait()
            out.close()
            err.close()
        raise
    return [r for r in results if r is not None]


# --- the host compiler, and the backend every command defaults to ---------------------------------
#: the host C compilers looked for on PATH after $CC, in this order
HOST_CC_NAMES = ("cc", "gcc", "clang")


def host_compiler() -> Optional[str]:
    """The host C compiler's path: $CC, else the first of HOST_CC_NAMES on PATH; None when none
    is found (host.find_cc raises instead)."""
    for cand in (os.environ.get("CC"), *HOST_CC_NAMES):
        path = shutil.which(cand) if cand else None
        if path:
            return path
    return None


def default_backend() -> str:
    """The backend a program runs on unless the caller names one, one rule for every command (in
    words in app/cli_config.BACKEND_HELP, their --backend's help):
    "c" (the generated C built for this host) when a host C compiler is found, else "reference"
    (the numpy reference runtime)."""
    return "c" if host_compiler() is not None else "reference"


# --- a build that takes a while says so -----------------------------------------------------------
#: seconds after which a build (or a demo's phase) says what it does and why, and shows its progress
ANNOUNCE_AFTER_S = 1.0
#: seconds between refreshes of an elapsed-time line written to a log rather than a terminal
REFRESH_NOT_TTY_S = 30.0


#: the elapsed-time lines on screen: a phase inside another (a C build inside the demo's compile)
#: shows no line of its own, the outer one keeps ticking
_SHOWING: list = []


def say_between_bars(say: Callable[[], None]) -> None:
    """Call `say` (which writes a line to stderr) with the progress lines on stderr cleared
    first and drawn again after it (tqdm.external_write_mode)."""
    from tqdm import tqdm

    with tqdm.external_write_mode(file=sys.stderr):
        say()


@contextmanager
def elapsed_progress(desc: str, after: Optional[float] = None, on_start: Optional[Callable[[], None]] = None):
    """Run the body; when it is still running after `after` seconds (default ANNOUNCE_AFTER_S),
    call `on_start` and show `desc` with the elapsed time on stderr (tqdm: refreshed each second
    on a terminal, each REFRESH_NOT_TTY_S seconds in a log) until it ends, unless an outer
    phase's line is showing. Yields a list that is not empty once the phase was announced.
    Nothing is shown with INFO off for the "edgetrain" logger (-q, or a library whose program
    configures no logging)."""
    log = logging.getLogger(__name__)
    done = threading.Event()
    shown: list = []
    after = ANNOUNCE_AFTER_S if after is None else after

    def watch() -> None:
        if done.wait(after) or not log.isEnabledFor(logging.INFO):
            return
        if on_start is not None:
            say_between_bars(on_start)
        if _SHOWING:
            shown.append(None)
            return
        from tqdm import tqdm

        bar = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed} elapsed", file=sys.stderr, mininterval=1.0)
        shown.append(bar)
        _SHOWING.append(bar)
        every = 1.0 if getattr(sys.stderr, "isatty", lambda: False)() else REFRESH_NOT_TTY_S
        while not done.wait(every):
            bar.refresh()

    watcher = threading.Thread(target=watch, name="edgetrain-progress", daemon=True)
    watcher.start()
    try:
        yield shown
    finally:
        done.set()
        watcher.join()
        if shown and shown[0] is not None:
            _SHOWING.remove(shown[0])
            shown[0].close()


@contextmanager
def announced_build(what: str, why: str, after: Optional[float] = None):
    """Run the body (a build); when it is still running after `after` seconds, log (INFO, the
    "edgetrain" logger: the command line writes it to stderr) one line saying what is built and
    why, show its elapsed time on stderr until it ends (elapsed_progress), then log how long it
    took. A build that ends sooner says nothing."""
    log = logging.getLogger(__name__)
    t0 = time.perf_counter()
    ok = False
    with elapsed_progress("  building", after, lambda: log.info("building %s (%s)", what, why)) as shown:
        yield
        ok = True
    if shown:
        say_between_bars(lambda: log.info("%s %s in %.1f s", "built" if ok else "stopped building", what,
                                          time.perf_counter() - t0))
