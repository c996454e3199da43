"""The model families of issue 31 (tests/realmodels/families.py) on the C backend (float32):
gradients equal the float32 reference runtime's within float32 rounding, or, where a ReLU /
max-pool decision lies within float32 rounding of its threshold, the float64 reference's
(tests/backends/c/float_agreement.py). Built at -O0 as tests/realmodels/test_c_backend.py
explains (the kernels' results do not depend on the optimisation level)."""
from __future__ import annotations

import copy

import pytest

import edgetrain as et
from edgetrain.backends.c.host import to_c_program
from edgetrain.backends.capabilities import check_program
from tests.backends.c.float_agreement import gradient_mismatches
from tests.backends.c.kinks import flipped_gradients
from .families import FAMILIES, build
from .test_c_backend import TEST_CFLAGS

#: float32, relative to the largest gradient of the weight (or 1e-3 of the model's largest)
TOL = 2e-5
#: two models whose C compiles in seconds: 1-D convolution (strided, dilated), max and adaptive
#: pooling; transposed convolution and an MSE loss
QUICK = ["audio.raw_cnn1d", "ae.conv"]
#: the rest that compile today, 5 to 60 seconds each
SLOW = ["audio.ds_cnn", "audio.hf_hubert", "audio.hf_wav2vec2", "sensors.gru", "sensors.lstm", "seg.unet",
        "seg.hf_segformer", "ae.fc", "video.c3d", "lm.gpt2_lora", "lm.hf_bart", "lm.hf_bart_last_eos",
        "norm.group_instance_cnn", "act.elu_prelu_mish_mlp"]


def check_family_c(name: str):
    loss = FAMILIES[name].loss
    model64, x64, y64 = build(name)
    model = copy.deepcopy(model64).float()
    x = x64.float() if x64.is_floating_point() else x64
    y = y64.float() if y64.is_floating_point() else y64
    prog = et.compile(model, (x,), loss=loss, update=et.Full())
    ref = prog.gradients(x.numpy(), y.numpy())
    check_program(prog, "c")  # as et.compile(..., backend="c") does
    got = to_c_program(prog, TEST_CFLAGS).gradients(x.numpy(), y.numpy())

    def ref64():  # the float64 model's, then the float32 program's with kinks flipped
        yield et.compile(model64, (x64,), loss=loss, update=et.Full()).gradients(x64.numpy(), y64.numpy())
        yield from flipped_gradients(prog, x.numpy(), y.numpy())

    bad = gradient_mismatches(got, ref, ref64, TOL)
    assert not bad, f"{name}: relative errors (vs float32, vs float64 reference) {bad}"


def test_lists_name_families():
    assert set(QUICK + SLOW) <= set(FAMILIES) and not set(QUICK) & set(SLOW)


@pytest.mark.parametrize("name", QUICK)
def test_family_c_backend(name):
    check_family_c(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_family_c_backend_slow(name):
    check_family_c(name)
