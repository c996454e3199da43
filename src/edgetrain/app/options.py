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

# The largest value of every count, size, seed and factor the command line takes. Beyond these
# nothing here can run: --samples 1e20 grew memory without bound, --workers 100000 became 100000
# Ray processes, --fraction 1e308 overflowed, --momentum 1e308 compiled an infinite momentum, and a
# huge --batch / --size / --classes failed inside torch with a 20-line C++ backtrace. Each option's
# help states its bound (`at_most`), and a larger value is a usage error (exit 2, one line).
#: examples in one training step (a zoo model's --batch, federate's --batch)
MAX_BATCH = 4096
#: pixels on an image side (--size): 3 x 4096 x 4096 float32 is 200 MB per example
MAX_IMAGE_SIDE = 4096
#: output classes (--classes): 2^18 holds a 256k-token vocabulary
MAX_CLASSES = 1 << 18
#: firmware samples (compile --samples): each is one step, all embedded in the program's data
MAX_SAMPLES = 1024
#: images taken from a data set (--limit, --train-images, --calibrate-images, ...): 10^8 is more
#: than any set this reads (ImageNet-21k has 1.4 x 10^7)
MAX_IMAGES = 10 ** 8
#: passes over the data (--epochs), federated rounds (--rounds)
MAX_EPOCHS = 100_000
#: steps per client and round (federate --local-steps)
MAX_STEPS = 10 ** 7
#: simulated devices (federate --clients): each holds a compiled program in memory
MAX_CLIENTS = 1000
#: Ray CPUs (federate --workers): one process each; federated/flower.py also holds it to this
#: machine's CPUs
MAX_WORKERS = 256
#: host threads (train/demo --threads): the C library's OpenMP team and BLAS
MAX_THREADS = 1024
#: seeds: every generator used (numpy's, torch's, the C runtime's) takes 32 bits
MAX_SEED = 2 ** 32 - 1
#: --fraction: the budget as a multiple of plain back-propagation's activations; past 1 the
#: budget constrains nothing, past this it is a typo
MAX_FRACTION = 10.0
#: seconds (--deadline, --time-limit): a week
MAX_SECONDS = 7 * 24 * 3600.0
#: --deadline-factor: a multiple of the plain step's time
MAX_FACTOR = 1e6
#: SGD momentum: past 1 the velocity grows without bound (1e308 compiled an infinite momentum)
MAX_MOMENTUM = 1.0
#: SGD weight decay: past 1 a step can flip every weight's sign
MAX_WEIGHT_DECAY = 1.0
#: --int8-headroom: past 127 (quantize/headroom.py's MAX_HEADROOM, spelled out: no numpy here) a
#: channel's largest pretrained weight rounds to no int8 step
MAX_HEADROOM = 127.0


def at_most(maximum) -> str:
    """The words an option's help ends with: 'at most 4,096'."""
    return f"at most {maximum:,}" if isinstance(maximum, int) else f"at most {maximum:g}"


def _number(text: str, kind, what: str):
    try:
        return kind(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


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


def _shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def count(maximum: int):
    """The argparse type of a count or size from 1 to `maximum` (a MAX_* above)."""
    def read(text: str) -> int:
        v = _number(text, int, "a positive integer")
        if not 1 <= v <= maximum:
            raise argparse.ArgumentTypeError(f"expected an integer from 1 to {maximum:,}, got {_shown(text)!r}")
        return v

    read.__name__ = f"count_at_most_{maximum}"
    return read


def label_value(text: str) -> int:
    """A class label as the data holds it (--ignore-index): any int64."""
    v = _number(text, int, "an integer label")
    if not -2 ** 63 <= v < 2 ** 63:
        raise argparse.ArgumentTypeError(f"expected an int64 label, got {_shown(text)!r}")
    return v


def seed(text: str) -> int:
    """A seed: 0 .. MAX_SEED."""
    v = _number(text, int, "an integer >= 0")
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {MAX_SEED:,}, got {_shown(text)!r}")
    return v


def bounded_float(maximum: float, zero: bool = False):
    """The argparse type of a finite number > 0 (>= 0 with `zero`) and at most `maximum`."""
    low = ">= 0" if zero else "> 0"

    def read(text: str) -> float:
        v = _number(text, float, f"a number {low}")
        if not (math.isfinite(v) and (v >= 0 if zero else v > 0) and v <= maximum):
            raise argparse.ArgumentTypeError(f"expected a number {low} and {at_most(maximum)}, got {_shown(text)!r}")
        return v

    read.__name__ = f"number_at_most_{maximum:g}"
    return read


def headroom(text: str) -> float:
    """--int8-headroom: a number from 1 (the calibrated program) to MAX_HEADROOM."""
    v = _number(text, float, "a number from 1")
    if not (math.isfinite(v) and 1 <= v <= MAX_HEADROOM):
        raise argparse.ArgumentTypeError(f"expected a number from 1 to {MAX_HEADROOM:g}, got {_shown(text)!r}")
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

    shown = _shown(text)
    try:
        n = parse_bytes(text, "size")
    except ValueError as err:
        message = str(err).removeprefix("size: ").removeprefix("size ")  # argparse names the option
        raise argparse.ArgumentTypeError(message.replace(repr(text), repr(shown))) from err
    if n > MAX_BUDGET_BYTES:
        raise argparse.ArgumentTypeError(f"{shown!r} is {n:.3g} B, more than any device here "
                                         f"(at most {MAX_BUDGET_BYTES >> 30} GB)")
    return text


def floats(text: str) -> tuple[float, ...]:
    """'0.5,0.5,0.5' -> (0.5, 0.5, 0.5), finite numbers (per-channel means)."""
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 0.5,0.5,0.5; got {text!r}") \
            from None
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
