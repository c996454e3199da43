"""The command's signals: Ctrl-C (SIGINT) and SIGTERM stop it with exit 130 at any moment, one
line and no traceback (app/cli.py main)."""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager


def terminate(signum, frame):
    """SIGTERM does what Ctrl-C does at this moment: `train` finishes its step, saves
    stopped.ckpt and exits 130; elsewhere the command stops with exit 130."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job) or default: SIGTERM still stops the command
        raise KeyboardInterrupt


class Interrupts:
    """SIGINT's handler while a command runs: Python's own (raise KeyboardInterrupt), and a record
    that it came, because code the command runs may catch the exception (CI once saw `inspect`
    exit 0 with no word after a SIGINT 0.1 s into its start-up)."""

    def __init__(self):
        self.seen = False

    def __call__(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt


def quiet_signals() -> dict:
    """Ignore SIGINT and SIGTERM while the outcome is reported: the exit code is decided, and a
    signal now would only turn its one line into a traceback. The old handlers, to restore."""
    return {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}


def command_handlers() -> tuple[Interrupts | None, dict]:
    """Install the command's handlers: SIGTERM as Ctrl-C, and SIGINT recorded when it has Python's
    default handler (an ignored SIGINT, a background job's, stays ignored). The record (None when
    SIGINT is not ours) and the old handlers, to restore."""
    old = {signal.SIGTERM: signal.signal(signal.SIGTERM, terminate)}
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None, old
    interrupts = Interrupts()
    old[signal.SIGINT] = signal.signal(signal.SIGINT, interrupts)
    return interrupts, old


def restore(handlers: dict) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def forget_unhandled_interrupt() -> None:
    """Exit with 130, not by SIGINT: CPython ends a process by sending itself SIGINT at exit when
    it recorded a KeyboardInterrupt as unhandled, and `python -m edgetrain.app.cli` interrupted
    during `import torch` recorded one although main() handled it (12 of 30 tries). Every
    PyRun_* call clears that record, so run an empty one."""
    if sys.implementation.name != "cpython":
        return
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")
    except Exception:  # no such API here: the process then ends by SIGINT, which a shell shows as 130 too
        pass


@contextmanager
def deferred_interrupts():
    """Hold SIGINT and SIGTERM back for the block, then stop as they would have: a KeyboardInterrupt
    raised inside `import torch`'s C++ initialisation aborts the process (exit -6 and a C++ stack,
    seen once in some 30 runs of tests/cli's start-up signal test). No-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        restore(old)
    if held:
        handler = old[held[0]]
        if callable(handler):
            handler(held[0], None)
        elif handler != signal.SIG_IGN:  # the default action: stop
            raise KeyboardInterrupt
