"""Catching a training run that blows up while its numbers are still finite.

Program.step stops a step whose loss or weights are not finite, but a diverging run is
finite for a while first: at `--lr 30` the loss went 2.4, 1.5e3, 2.7e29 and then NaN, and
the weights kept from the step before the NaN (up to 4e29) no longer predicted finitely;
an int8 run at `--lr 1000` stays finite for ever, its weights pinned at the ends of their
range, at chance accuracy. DivergenceGuard looks at each step's loss and at the trained
tensors after it, and names the first of three signs of blow-up:

- the loss is over LOSS_BLOWUP times the run's starting loss (at least the loss of a
  uniform guess, for cross-entropy);
- the float weights trained have grown, in RMS, over WEIGHT_GROWTH times their start;
- over SATURATED_SHARE of the int8 weight values trained that were inside their range at
  the start are pinned at its ends, or an int32 bias trained has reached the end of its
  range (2^24: more than a layer's int8 products can sum to, so its output is pinned).

The thresholds are far outside what training does: on the demo-scale runs (digits on
MNIST, float at lr 0.05 and 1, int8 at lr 0.05) the largest loss was 5 times the first,
the weights' RMS grew at most 2 times, at most 8 % of the int8 values trained became
saturated, and every int32 bias stayed over 25 times below its range's end.

The guard also keeps a copy of the state a step writes (`before_step`), so that the
training loop can put back the weights of the step before the one that tripped it: that
step's loss was finite, so those weights predict finitely.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np

from ..passes.loss import CLASS_LOSSES, class_dim
from ..passes.updates import INT_RANGES

#: a step's loss over this many times the starting loss is a blow-up: a normal run's worst
#: batch stays within 5 times (a cross-entropy of 230 for 10 classes is a logit margin of 230)
LOSS_BLOWUP = 100.0
#: trained float weights whose RMS grows over this factor have diverged (normal: 2 times)
WEIGHT_GROWTH = 100.0
#: the smallest RMS a weight reference is taken to be: zero-initialised tensors (biases)
#: are measured against it instead of against zero
WEIGHT_RMS_FLOOR = 0.01
#: the loss reference of a regression loss is at least this (a unit-scale target's loss)
MSE_LOSS_FLOOR = 1.0
#: the share of the int8 weight values trained, unsaturated at the start, that may become
#: saturated (normal: 8 %; int8 at lr 1000: 97 %)
SATURATED_SHARE = 0.5
#: the integer type of int8 programs' weights (biases are int32)
WEIGHT_INT = "int8"


def _trained_part(value: np.ndarray, sel) -> np.ndarray:
    """The channels of a parameter that are trained (all of it without a selection)."""
    return value if sel is None else np.take(value, np.asarray(sel.index, dtype=np.intp), axis=sel.dim)


def _float_rms(parts: Mapping[str, np.ndarray]) -> float:
    n = sum(v.size for v in parts.values())
    total = sum(float(np.sum(np.square(v, dtype=np.float64))) for v in parts.values())
    return math.sqrt(total / n) if n else 0.0


class DivergenceGuard:
    """Watches one run of `prog.step`: `check(loss)` after each successful step returns
    what diverged (None while the run is sound)."""

    def __init__(self, prog):
        self.prog = prog
        self.start_loss: Optional[float] = None
        out = prog.forward_graph.output("output").type
        if prog.loss in CLASS_LOSSES:  # a uniform guess's loss: log(classes)
            self.loss_floor = math.log(max(2, out.shape[class_dim(prog.loss, out.rank)]))
        elif prog.loss == "bce_with_logits":  # a guess of 0 logits: log 2
            self.loss_floor = math.log(2.0)
        else:
            self.loss_floor = MSE_LOSS_FLOOR
        floats, ints = self._trained()
        self.start_rms = max(_float_rms(floats), WEIGHT_RMS_FLOOR) if floats else None
        self.free_at_start = {k: ~self._saturated(v) for k, v in ints.items()}
        self.free_weights = sum(int(m.sum()) for k, m in self.free_at_start.items() if ints[k].dtype == WEIGHT_INT)

    # --- what is trained -----------------------------------------------------------------
    def _trained(self) -> tuple[dict, dict]:
        """({name: trained float part}, {name: trained integer part}) of the trained weights."""
        floats, ints = {}, {}
        for name, sel in self.prog.trainable.items():
            part = _trained_part(np.asarray(self.prog.state[name]), sel)
            if part.dtype.kind == "f":
                floats[name] = part
            elif str(part.dtype) in INT_RANGES:
                ints[name] = part
        return floats, ints

    @staticmethod
    def _saturated(part: np.ndarray) -> np.ndarray:
        lo, hi = INT_RANGES[str(part.dtype)]
        return (part <= lo) | (part >= hi)

    # --- checking ------------------------------------------------------------------------
    def check(self, loss: float) -> Optional[str]:
        """After a step whose loss was `loss` (finite): what diverged, or None."""
        if self.start_loss is None:
            self.start_loss = loss
        ref = max(self.start_loss, self.loss_floor)
        if loss > LOSS_BLOWUP * ref:
            return (f"the loss {loss:.4g} is over {LOSS_BLOWUP:g} times the run's starting loss {ref:.4g} "
                    f"(a blow-up)")
        floats, ints = self._trained()
        if self.start_rms is not None:
            rms = _float_rms(floats)
            if rms > WEIGHT_GROWTH * self.start_rms:
                return (f"the trained weights grew to RMS {rms:.4g}, over {WEIGHT_GROWTH:g} times their start "
                        f"({self.start_rms:.4g})")
        newly = {k: int((self._saturated(v) & self.free_at_start[k]).sum()) for k, v in ints.items()}
        weights = sum(n for k, n in newly.items() if ints[k].dtype == WEIGHT_INT)
        if self.free_weights and weights > SATURATED_SHARE * self.free_weights:
            return (f"{100 * weights / self.free_weights:.0f}% of the int8 weights trained are pinned at the ends of "
                    f"their range (saturated; over {100 * SATURATED_SHARE:.0f}% means a blow-up)")
        pinned = [k for k, n in newly.items() if n and ints[k].dtype != WEIGHT_INT]
        if pinned:
            lo, hi = INT_RANGES[str(ints[pinned[0]].dtype)]
            return (f"{pinned[0]} reached the end of its range ({hi:,}; saturated), past anything its layer's "
                    f"int8 products can sum to")
        return None

    # --- undoing a step --------------------------------------------------------------------
    def before_step(self) -> dict[str, np.ndarray]:
        """A copy of the state the next step writes, for `undo`."""
        return {k: np.array(self.prog.state[k], copy=True) for k in self.prog.runner.written_state()}

    def undo(self, saved: Mapping[str, np.ndarray]) -> None:
        """Put back the state of `before_step` and count the step as not taken."""
        for k, v in saved.items():
            self.prog.state[k][...] = v
        self.prog.steps -= 1
