"""The command line's exit codes: what each means and which each command can end with (the
--help epilogues), and the exit code of an error a command raised (cli_errors.py reports it)."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Optional, Sequence

#: demo: fine-tuning did not raise test accuracy (a result, not an error: 1 is a bug)
NOT_IMPROVED = 6
#: each exit code and what it means (EXIT_CODES: all of them; exit_codes(command): a command's own)
EXIT_CODE_LINES = {
    0: "  0  done",
    1: "  1  internal error: a bug (the message names the file its traceback was saved to: please report it)",
    2: "  2  bad usage or input: options, model file, input shape, unsupported op, data, checkpoint, or a path\n"
       "     you named (missing, unreadable, not writable, a full disk)",
    3: "  3  does not fit: the memory budget (the message says the smallest that fits) or the firmware's regions\n"
       "     (or a remat/paging schedule: no schedule fits the RAM budget and deadline)",
    4: "  4  training stopped on a non-finite loss or a blow-up (exploding loss or weights, saturated int8\n"
       "     weights; the weights from before that step are saved)",
    5: "  5  toolchain or firmware failure: C compiler, arm-none-eabi-gcc, QEMU, a firmware run that failed",
    NOT_IMPROVED: f"  {NOT_IMPROVED}  demo only: fine-tuning did not raise the test accuracy",
    130: "130  interrupted (Ctrl-C or SIGTERM, at any moment; train saves its last good state first)",
}
#: the exit codes each command can end with
COMMAND_EXIT_CODES = {
    "compile": (0, 1, 2, 3, 4, 5, 130), "train": (0, 1, 2, 3, 4, 5, 130), "export": (0, 1, 2, 5, 130),
    "inspect": (0, 1, 2, 130), "demo": (0, 1, 2, 4, NOT_IMPROVED, 130), "profile": (0, 1, 2, 130),
    "schedule": (0, 1, 2, 3, 130), "report": (0, 1, 2, 3, 130), "federate": (0, 1, 2, 4, 5, 130),
}


def exit_codes(command: Optional[str] = None) -> str:
    """The 'exit codes:' table of `command`'s --help (all codes without one)."""
    codes = COMMAND_EXIT_CODES[command] if command else sorted(EXIT_CODE_LINES)
    return "\n".join(["exit codes:"] + [EXIT_CODE_LINES[c] for c in codes])


EXIT_CODES = exit_codes()


def exit_code_for(err: BaseException, paths: Sequence[str] = ()) -> Optional[int]:
    """The exit code of an error raised by a command; None: a bug (exit 1). 2 is the user's
    input: ValueError (the project's input errors derive from it), the project's own data and
    file errors, and an OSError about a path the user named (`paths`: the command's argument
    texts) or a full disk; a TypeError, a plain RuntimeError or an OSError elsewhere is a bug.
    Imports nothing for an interrupt: a signal may have cut an import short (torch half loaded)."""
    if isinstance(err, KeyboardInterrupt):
        return 130
    try:
        from ..api import BudgetError
        from ..backends.c import CBackendError
        from ..program import NonFiniteLossError
        from ..remat.plan import Infeasible
        from .train import TrainingStopped
    except Exception:  # an import that fails now: the error is reported as internal, with its traceback
        return None
    if isinstance(err, (BudgetError, Infeasible)):
        return 3
    if isinstance(err, TrainingStopped):
        return 4 if err.reason in ("non-finite", "diverged") else 130
    if isinstance(err, NonFiniteLossError):
        return 4
    if isinstance(err, CBackendError):
        return 3 if "overflowed" in str(err) else 5
    if isinstance(err, ValueError) or out_of_memory(err):
        return 2
    ours = type(err).__module__.startswith("edgetrain.")
    if isinstance(err, OSError):
        return 2 if ours or about_user_path(err, paths) else None
    if isinstance(err, (RuntimeError, pickle.UnpicklingError)):
        return 2 if ours else None  # DataError, a refused pickle; torch's and plain RuntimeErrors are bugs
    return None


def out_of_memory(err: BaseException) -> bool:
    """A MemoryError, or torch's allocator refusing a size (what the input asked for does not fit
    this machine: the user's input, not a bug)."""
    return isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


#: errno values that are about the disk the user chose rather than about a file: a full disk or quota
_DISK_ERRNOS = ("ENOSPC", "EDQUOT")


def user_paths(args) -> list[str]:
    """The texts of a command's arguments that may name a path (NAME:PATH and FILE:FACTORY split)."""
    found = []
    for v in vars(args).values():
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, (str, Path)) and str(t):
                t = str(t)
                found.append(t)
                if ":" in t:
                    head, _, tail = t.rpartition(":")
                    found += [x for x in (head, tail) if x]
    return found


def about_user_path(err: OSError, paths: Sequence[str]) -> bool:
    """Whether `err` is about a path the user named (the path, a file under it or a folder above
    it), or a full disk."""
    import errno
    import os

    if any(err.errno == getattr(errno, name, None) for name in _DISK_ERRNOS):
        return True
    named = []
    for t in paths:
        try:
            named.append(Path(t).expanduser().resolve())
        except (OSError, RuntimeError, ValueError):
            continue
    files = [f for f in (err.filename, err.filename2) if isinstance(f, (str, bytes, os.PathLike))]
    for f in files:
        try:
            f = Path(os.fsdecode(f)).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            continue
        if any(f == n or n in f.parents or f in n.parents for n in named):
            return True
    if not files:  # a message that names the path instead (an OSError edgetrain raised with a text)
        text = str(err)
        return any(t in text for t in paths if "/" in t or "." in t or _exists(t))
    return False


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):  # a name too long, a NUL in it
        return False
