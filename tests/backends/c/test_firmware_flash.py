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
    assert fc.requant == 0 and fc.constants >= 0 and fc.model_code > 0 and fc.other > 0
    parts = fc.as_dict()
    assert sum(v for k, v in parts.items() if k != "total") == fc.total == size.flash
    assert fc.without_samples == size.flash - fc.samples and fc.weights == fc.frozen_weights + fc.trained_weights


def test_requantization_arrays_are_counted_apart(tmp_path):
    """An int8 program's per-channel multipliers (int32) and shifts (int8, where not packed), as model.c declares them,
    are the flash's `requant`; the other tables stay `constants`; and the float program has none."""
    import re

    import torch
    import torch.nn as nn

    import edgetrain as et

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                          nn.ReLU(), nn.Conv2d(8, 12, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(12, 10))
    shape = (1, 3, 12, 12)
    prog = et.compile(model, (torch.zeros(shape),), quantize="int8", optimizer=et.SGD(lr=0.05))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(shape).astype(np.float32), np.array([i])) for i in range(2)]
    d = cortexm.emit_firmware(prog, tmp_path / "fw", "cortex-m7", data)
    size = cortexm.firmware_size(cortexm.build(d))
    fc = flash_contents(d, size.flash)
    src = (d / "model.c").read_text()
    declared = {name: (4 if ctype == "int32_t" else 1) * int(n) for ctype, name, n in
                re.findall(r"static const (int32_t|int8_t) (et_c\d+_\w+_[ms])\[(\d+)\]", src)}
    # a layer's multipliers, and its shifts unless they are packed into the multipliers' words (int8_params.py)
    assert any(k.endswith("_m") for k in declared)
    assert fc.requant == sum(declared.values())
    # code and tables: the flash less what the program says its weights and samples are
    mem, (xs, ys) = prog.memory, program_samples(prog, data)
    weights = mem.flash_bytes + mem.trainable_bytes - mem.optimizer_bytes
    assert fc.constants > 0 and fc.program == size.flash - weights - sum(x.size + y.size for x, y in zip(xs, ys))


def test_model_code_by_function_adds_up_to_the_model_code(tmp_path):
    """model_functions: model.o's functions in the linked firmware, largest first, whose bytes add up to
    flash_contents' model_code; none of startup's, board's, main's or the C library's among them."""
    import subprocess

    import torch
    import torch.nn as nn

    import edgetrain as et
    from edgetrain.backends.c.cortexm_target import BUILD_DIR, elf_toolchain
    from edgetrain.backends.c.firmware_flash import model_functions

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    shape = (1, 3, 8, 8)
    prog = et.compile(model, (torch.zeros(shape),), quantize="int8", optimizer=et.SGD(lr=0.05))
    data = [(np.random.default_rng(0).standard_normal(shape).astype(np.float32), np.array([1]))]
    d = cortexm.emit_firmware(prog, tmp_path / "fw", "cortex-m7", data)
    size = cortexm.firmware_size(cortexm.build(d))
    funcs = model_functions(d)
    assert sum(funcs.values()) == flash_contents(d, size.flash).model_code
    assert list(funcs.values()) == sorted(funcs.values(), reverse=True) and min(funcs.values()) > 0
    assert "et_train_step" in funcs and any(f.startswith("et_qconv") for f in funcs)  # the step, an int8 kernel
    assert not {"main", "Reset_Handler", "memcpy"} & set(funcs)
    # each a function that model.o defines (`T`/`t` in its symbol table)
    nm = elf_toolchain(d / "firmware.elf").tool("nm")
    defined = {line.split()[-1] for line in subprocess.run([nm, str(d / BUILD_DIR / "model.o")], capture_output=True,
                                                          text=True, check=True).stdout.splitlines()
               if len(line.split()) == 3 and line.split()[1] in "tT"}
    assert set(funcs) <= defined
