"""Test-only launcher: `python pause_launcher.py SPEC ARGV...` runs `edgetrain ARGV` with a
pause installed in the training loop, so that a test can kill the process at a known point.

SPEC is "save:N:SECONDS" (pause the Nth checkpoint save of this process between its temporary
file's fsync and its rename) or "step:N:SECONDS" (pause before step N of the run); either
prints "edgetrain-test: paused in save|step N: VALUE" to stderr first. The product has no such
hook: this replaces `edgetrain.app.cli_program.train_hook` before calling the CLI's main."""
from __future__ import annotations

import re
import sys
import time


def pause_hook(spec: str):
    """The training-loop hook (TrainOptions.hook) that SPEC describes."""
    m = re.fullmatch(r"(save|step):([0-9]+):([0-9.]+)", spec)
    if not m:
        raise ValueError(f"pause {spec!r}: use save:N:SECONDS or step:N:SECONDS")
    kind, at, seconds = m.group(1), int(m.group(2)), float(m.group(3))
    saves = [0]

    def hook(what, value):
        if what != kind:
            return
        if what == "save":
            saves[0] += 1
        if (saves[0] if what == "save" else value) == at:
            print(f"edgetrain-test: paused in {what} {at}: {value}", file=sys.stderr, flush=True)
            time.sleep(seconds)

    return hook


def main(argv: list[str]) -> int:
    from edgetrain.app import cli, cli_program

    hook = pause_hook(argv[0])
    cli_program.train_hook = lambda: hook
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
