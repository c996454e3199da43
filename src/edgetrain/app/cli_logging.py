"""The command line's messages through `logging`: edgetrain logs to the logger named
"edgetrain" and its children (`logging.getLogger(__name__)` in each module), which has only a
NullHandler in the library (edgetrain/__init__.py: a program that imports edgetrain sees
nothing unless it configures logging, and can capture, silence or redirect every record).

A command run from the command line adds one handler for its duration (`command_logging`),
writing to standard error: INFO lines as they are ("compiled ...", "training on ...", a
round's progress), warnings as `edgetrain COMMAND: warning: ...` and debug lines as
`edgetrain COMMAND: debug: ...`. The level is INFO by default, DEBUG with -v/--verbose and
WARNING with -q/--quiet. Standard output keeps what a command is run for (inspect's graph,
schedule's plan, report's and federate's figures: what a user pipes); an error's one line and
its exit code do not depend on the level (cli_errors.py prints them)."""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator

#: the library's logger: every module logs to a child of it
LOGGER = "edgetrain"
#: -v / -q
VERBOSE_HELP = "print debug lines too (each compiler step and its time, the C compiler's command lines, ...)"
QUIET_HELP = "print warnings and errors only (no progress lines)"


class _StandardError(logging.StreamHandler):
    """A StreamHandler on sys.stderr as it is when a record is written (a test's capture, a
    stream the calling program replaced), not as it was when the handler was made."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


class CommandFormatter(logging.Formatter):
    """INFO as the message alone; WARNING and above as `edgetrain COMMAND: warning: ...` (the
    form of the command's other warnings and errors); DEBUG as `edgetrain COMMAND: debug: ...`."""

    def __init__(self, command: str):
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.levelno == logging.INFO:
            return text
        kind = "debug" if record.levelno < logging.INFO else record.levelname.lower()
        return f"edgetrain {self.command}: {kind}: {text}"


def level_of(args) -> int:
    """The logging level -v / -q ask for (INFO without either)."""
    if getattr(args, "verbose", False):
        return logging.DEBUG
    if getattr(args, "quiet", False):
        return logging.WARNING
    return logging.INFO


@contextmanager
def command_logging(command: str, level: int = logging.INFO) -> Iterator[logging.Handler]:
    """edgetrain's records of `level` and above written to standard error while the command runs;
    the logger as it was afterwards (main() may be called many times in one process)."""
    logger = logging.getLogger(LOGGER)
    handler = _StandardError()
    handler.setFormatter(CommandFormatter(command))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
