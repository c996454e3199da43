"""`schedule --mapped-weights` (issue 32): the frozen weights of a program run by the standalone
host binary are mapped from weights.bin, so the schedule decides when each is resident: the
fixed RAM keeps only the trained state and the proven lower bound falls."""
from __future__ import annotations

import re


def _bound(cli, *extra) -> tuple[int, int]:
    code, _, err = cli("schedule", "docs/examples/digits.py:build", "--input", "8x1x28x28", "--update", "bias",
                       "--device", "a72", "--fraction", "0.01", *extra)
    assert code == 3, err
    fixed = int(re.search(r"fixed RAM ([0-9,]+) included", err).group(1).replace(",", ""))
    below = int(re.search(r"no schedule fits below ([0-9,]+) bytes", err).group(1).replace(",", ""))
    return fixed, below


def test_mapped_weights_lower_the_fixed_ram_and_the_bound(cli):
    fixed, bound = _bound(cli)
    mfixed, mbound = _bound(cli, "--mapped-weights")
    # bias-only training: the weights are frozen, so mapped they leave the fixed RAM
    assert mfixed < fixed / 10 and mbound < bound
