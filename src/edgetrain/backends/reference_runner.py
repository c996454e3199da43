"""The reference runner: runs a compiled program's graphs in the numpy reference runtime
(backends/reference.py, the living spec)."""
from __future__ import annotations

import numpy as np

from ..ir import ram_inputs
from ..runtime.runner import RunnerBase
from ..interpreter import run_graph


class ReferenceRunner(RunnerBase):
    """Runs a compiled program in the numpy reference runtime (backends/reference)."""

    backend = "reference"

    def gradients(self, x, y) -> dict[str, np.ndarray]:
        """Gradients of the loss for the trained parameters, without updating. A parameter
        trained on some channels only gets zeros in the others. For an int8 program the
        gradients of int weights and biases are with respect to the integers themselves
        (d loss / d w_int = w_scale * d loss / d w_real), before QAS."""
        g = self.compiled.grad_graph
        out, _ = run_graph(g, self.feeds(g, x, y), ram_inputs(g))
        return self.full_gradients(out)

    def step(self, x, y) -> float:
        """One training step in place; returns the loss. A non-finite loss or weight raises
        NonFiniteLossError and leaves the weights as they were before this step."""
        g = self.compiled.train_graph
        feeds = self.feeds(g, x, y)
        saved = {k: self.state[k].copy() for k in self.written_state()}
        out, trace = run_graph(g, feeds, ram_inputs(g))
        loss = float(out["loss"])
        bad = [k for k in saved if not np.all(np.isfinite(self.state[k]))]
        if not np.isfinite(loss) or bad:
            for k, v in saved.items():
                self.state[k][...] = v
            raise self.non_finite(loss, bad[0] if bad else "")
        self.steps += 1
        self.last_trace = trace
        return loss

    def predict_batch(self, x) -> np.ndarray:
        g = self.compiled.forward_graph
        feeds = {v.name: self.state[v.name] for v in g.inputs if v.name in self.state}
        feeds.update(self.data_feeds(g, x))
        return run_graph(g, feeds)[0]["output"]
