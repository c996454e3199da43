"""firmware_flash.flash_contents: a linked firmware's flash by kind, checked against what the
compiled program says it holds (its frozen and trained weights, the samples' bytes)."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.backends.c import cortexm
from edgetrain.backends.c.firmware_flash import flash_contents
from edgetrain.backends.c.project import program_samples

pytestmark = pytest.mark.skipif(bool(cortexm.missing_tools()),
                                reason=f"missing {', '.join(cortexm.missing_tools())}")


def test_flash_by_kind_matches_the_programs_weights_and_samples(tmp_path):
    import torch
    import torch.nn as nn

    import edgetrain as et

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
    prog = et.compile(model, (torch.zeros(1, 1, 8, 8),), update=et.BiasOnly(), optimizer=et.SGD(lr=0.05))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((1, 1, 8, 8)).astype(np.float32), np.array([i])) for i in range(3)]
    d = cortexm.emit_firmware(prog, tmp_path / "fw", "cortex-m4", data)
    size = cortexm.firmware_size(cortexm.build(d))
    fc = flash_contents(d, size.flash)
    mem = prog.memory
    assert fc.frozen_weights == mem.flash_bytes == (4 * 9 + 10 * 256) * 4  # the weights: const, in flash
    assert fc.trained_weights == mem.trainable_bytes - mem.optimizer_bytes == (4 + 10) * 4  # biases' initial values
    xs, ys = program_samples(prog, data)
    assert fc.samples == sum(x.size + y.size for x, y in zip(xs, ys))
    assert fc.constants >= 0 and fc.model_code > 0 and fc.other > 0
    parts = fc.as_dict()
    assert sum(v for k, v in parts.items() if k != "total") == fc.total == size.flash
    assert fc.without_samples == size.flash - fc.samples and fc.weights == fc.frozen_weights + fc.trained_weights
