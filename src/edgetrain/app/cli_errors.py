"""How the command line reports the outcome of a command that raised: one line per error with
its exit code (exit_codes.exit_code_for decides it), an internal error's traceback saved to a
file the line names, and edgetrain's own warnings as one line each (cli.py's main calls these)."""
from __future__ import annotations

import sys

#: the exit code of an interrupted command (128 + SIGINT, as a shell reports Ctrl-C); SIGTERM too
INTERRUPTED = 130


def warning_line(command: str, show):
    """warnings.showwarning that prints edgetrain's own warnings as one line, `edgetrain
    COMMAND: warning: ...` (others as `show` does)."""
    def one_line(message, category, filename, lineno, file=None, line=None):
        if not category.__module__.startswith("edgetrain."):
            return show(message, category, filename, lineno, file, line)
        print(f"edgetrain {command}: warning: {message}", file=sys.stderr if file is None else file)

    return one_line


def report_error(args, err: BaseException, argv: list) -> int:
    """Print `err` as one line and return its exit code: 1 (a bug: the traceback saved to a file
    the line names), 2 (the user's input), 3, 4, 5 or 130 (exit_codes.exit_code_for)."""
    if isinstance(err, KeyboardInterrupt):  # first, importing nothing: the signal may have cut an import short
        code = INTERRUPTED
    else:
        from .exit_codes import exit_code_for, user_paths

        try:
            code = exit_code_for(err, user_paths(args))
        except Exception:  # classifying failed: report the error itself as internal, with its traceback
            code = None
    if getattr(args, "traceback", False):
        import traceback

        traceback.print_exception(err)
    if code is None:
        saved = save_traceback(err, argv)
        where = f"its traceback is in {saved}" if saved else "rerun with --traceback for its traceback"
        first = (str(err).splitlines() or [""])[0]
        print(f"edgetrain {args.command}: internal error: {type(err).__name__}: {first} (a bug: {where}; please "
              f"report it)", file=sys.stderr)
        return 1
    if code == INTERRUPTED:  # train says what it saved; a bare Ctrl-C (a second one: stop now) says nothing more
        print(f"edgetrain {args.command}: interrupted" + (f": {err}" if str(err) else ""), file=sys.stderr)
    else:  # our messages as written (some list files); another library's first line (torch's C++ backtrace follows)
        text = str(err) if written_by_edgetrain(err) else (str(err).splitlines() or [""])[0]
        print(f"edgetrain {args.command}: error: {text or type(err).__name__}", file=sys.stderr)
    return code


def written_by_edgetrain(err: BaseException) -> bool:
    """Whether edgetrain wrote `err`'s message: its class is edgetrain's, or edgetrain raised it."""
    import os

    tb, last = err.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    return type(err).__module__.startswith("edgetrain.") or \
        (last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(package))


def save_traceback(err: BaseException, argv: list):
    """Write the command line, versions and `err`'s traceback to a new file in the temporary
    folder; its path, or None when it cannot be written."""
    import os
    import platform
    import tempfile
    import traceback

    from .. import __version__

    try:
        fd, path = tempfile.mkstemp(prefix="edgetrain-traceback-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"command: edgetrain {' '.join(map(str, argv))}\nedgetrain {__version__}, Python "
                    f"{platform.python_version()}, {platform.platform()}\n\n")
            f.write("".join(traceback.format_exception(err)))
        return path
    except OSError:
        return None
