"""Real models on the C backend (float32): gradients equal the reference runtime's within
float32 rounding (the tolerance of the backend matrix, tests/backends/test_matrix.py), or, where a
ReLU decision lies within float32 rounding of its threshold, the float64 reference's, or the
float64 run's with that decision taken the other way (tests/backends/c/float_agreement.py,
kinks.py: torchvision's resnet50 has such an element).

The C is built at -O0 here: the kernels' results do not depend on the optimisation level
(no contraction, no fast-math), and -O0 compiles a model's C several times faster; the zoo
matrix (tests/backends/test_matrix.py) and bench/real_models.py run the default -O3 builds."""
from __future__ import annotations

import copy

import pytest

import edgetrain as et
from edgetrain.backends.c.host import DEFAULT_CFLAGS, to_c_program
from edgetrain.backends.capabilities import check_program
from tests.backends.c.float_agreement import gradient_mismatches
from tests.backends.c.kinks import flipped_gradients
from .conftest import BUILDERS, build

#: float32, relative to the largest gradient of the weight (or 1e-3 of the model's largest)
TOL = 1e-5
#: DEFAULT_CFLAGS at -O0
TEST_CFLAGS = tuple(f for f in DEFAULT_CFLAGS if not f.startswith("-O")) + ("-O0",)
QUICK = ["hf.gpt2lm"]
#: every other model of the list; hf.gpt2cls is tests/realmodels/test_gpt2cls.py's
SLOW = [n for n in BUILDERS if n not in QUICK and n != "hf.gpt2cls"]


def check_c_backend(name: str):
    model64, x64, y = build(name)
    model = copy.deepcopy(model64).float()
    x = x64.float() if x64.is_floating_point() else x64
    prog = et.compile(model, (x,), update=et.Full())
    ref = prog.gradients(x.numpy(), y.numpy())
    check_program(prog, "c")  # as et.compile(..., backend="c") does
    got = to_c_program(prog, TEST_CFLAGS).gradients(x.numpy(), y.numpy())

    def ref64():  # the float64 model's, then the float32 program's with kinks flipped
        yield et.compile(model64, (x64,), update=et.Full()).gradients(x64.numpy(), y.numpy())
        yield from flipped_gradients(prog, x.numpy(), y.numpy())

    bad = gradient_mismatches(got, ref, ref64, TOL)
    assert not bad, f"{name}: relative errors (vs float32, vs float64 reference) {bad}"


@pytest.mark.parametrize("name", QUICK)
def test_c_backend(name):
    """GPT-2: embedding, constants folded from shapes, causal attention, tied weights."""
    check_c_backend(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_c_backend_slow(name):
    check_c_backend(name)
