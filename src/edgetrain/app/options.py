"""The argparse `type=` functions of the command line: every number a user types is checked
where it is read, so that a zero, a negative, an infinity or a NaN ends in a usage error
(exit 2, the option named) instead of a ZeroDivisionError deep inside, or a silent default.

Light on purpose (no numpy, no torch): the parser is built for `--help` and usage errors,
which must not wait for heavy imports."""
from __future__ import annotations

import argparse
import math
import re

#: the largest memory budget an option takes (1 TiB): more is a typo (or an overflow), not a device
MAX_BUDGET_BYTES = 1 << 40


def _number(text: str, kind, what: str):
    try:
        return kind(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")


def positive_int(text: str) -> int:
    """1, 2, ...: counts (images, epochs, samples, batch, classes, image side)."""
    v = _number(text, int, "a positive integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def nonnegative_int(text: str) -> int:
    """0, 1, ...: seeds."""
    v = _number(text, int, "an integer >= 0")
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def finite_float(text: str) -> float:
    v = _number(text, float, "a number")
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0: learning rates, seconds, fractions, factors."""
    v = _number(text, float, "a positive number")
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def nonnegative_float(text: str) -> float:
    """A finite number >= 0: momentum, weight decay."""
    v = _number(text, float, "a number >= 0")
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return v


def byte_size(text: str) -> str:
    """A memory budget such as 256KB, 1MB or 4096 (bytes), at most MAX_BUDGET_BYTES; kept as
    the text the user wrote (the commands and checkpoints store it), checked here."""
    from ..config import parse_bytes

    shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
    try:
        n = parse_bytes(text, "size")
    except ValueError as err:
        message = str(err).removeprefix("size: ").removeprefix("size ")  # argparse names the option
        raise argparse.ArgumentTypeError(message.replace(repr(text), repr(shown)))
    if n > MAX_BUDGET_BYTES:
        raise argparse.ArgumentTypeError(f"{shown!r} is {n:.3g} B, more than any device here "
                                         f"(at most {MAX_BUDGET_BYTES >> 30} GB)")
    return text


def floats(text: str) -> tuple[float, ...]:
    """'0.5,0.5,0.5' -> (0.5, 0.5, 0.5), finite numbers (per-channel means)."""
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 0.5,0.5,0.5; got {text!r}")
    if not vals or not all(math.isfinite(v) for v in vals):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return vals


def positive_floats(text: str) -> tuple[float, ...]:
    """As floats, each > 0 (per-channel standard deviations: a divisor of 0 or below flips or
    destroys the image)."""
    vals = floats(text)
    if not all(v > 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
    return vals


def update_scheme_text(text: str) -> str:
    """--update: full | bias | last:K | auto, normalised ('last' is last:1); the text, not the
    scheme object, so that the parser imports nothing of the compiler."""
    t = text.strip().lower()
    if t == "auto":
        return t
    if t in ("full",):
        return "full"
    if t in ("bias", "bias-only", "biasonly"):
        return "bias"
    m = re.fullmatch(r"last(?::([0-9]{1,6}))?", t)
    if m and int(m.group(1) or 1) >= 1:
        return f"last:{int(m.group(1) or 1)}"
    raise argparse.ArgumentTypeError(f"unknown update scheme {text!r}: use full, bias, last:K or auto")
