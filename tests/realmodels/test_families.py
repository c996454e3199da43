"""The model families of issue 31 (tests/realmodels/families.py) capture and train: our float64
gradients (reference runtime) equal torch.autograd's for every trained parameter, each model
with its own loss (cross entropy, or an autoencoder's MSE against its input)."""
from __future__ import annotations

import numpy as np
import pytest
import torch.nn.functional as F

import edgetrain as et
from .families import BART_EOS, FAMILIES, build
from .test_capture import FLOOR, float64_truth, rel_err

#: float64 relative error of every gradient
TOL = 1e-9
#: et.compile's losses as torch computes them
TORCH_LOSS = {"cross_entropy": F.cross_entropy, "mse": F.mse_loss}

#: one or two per family, a few seconds each
QUICK = ["audio.raw_cnn1d", "sensors.gru", "seg.unet", "ae.conv", "video.c3d", "lm.gpt2_lora",
         "norm.group_instance_cnn", "act.elu_prelu_mish_mlp"]
#: the rest that compile today, 5 to 120 seconds each. lm.hf_bart is BartForSequenceClassification as
#: transformers writes it: shift_tokens_right writes into a new tensor (aten.copy, slice_scatter),
#: the head checks with torch.unique_consecutive that every row has as many eos tokens (a check
#: at run time) and reads the last one through a boolean mask (a data-dependent shape:
#: frontend/aten_dynamic.py); lm.hf_bart_last_eos is the same model without those steps
SLOW = ["audio.ds_cnn", "audio.hf_hubert", "audio.hf_wav2vec2", "sensors.lstm", "seg.hf_segformer",
        "seg.tv_lraspp_mobilenet_v3_large", "seg.tv_deeplabv3_mobilenet_v3_large", "seg.tv_fcn_resnet50", "ae.fc",
        "video.tv_r3d_18", "video.tv_mc3_18", "lm.hf_bart", "lm.hf_bart_last_eos", "norm.timm_resnet50_gn"]

#: models of the table that do not compile yet, and what refuses them (bench/family_probe.py)
REFUSED: dict[str, str] = {}


def torch_gradients(model, x, y, loss: str) -> dict[str, np.ndarray]:
    model.zero_grad(set_to_none=True)
    with float64_truth():
        TORCH_LOSS[loss](model(x), y).backward()
    # a trained parameter the forward does not use (wav2vec2's masked_spec_embed, applied only
    # in train mode) gets no .grad from torch: its gradient is zero, and ours must be exactly that
    return {n: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape))
            for n, p in model.named_parameters() if p.requires_grad}


def check_family(name: str):
    loss = FAMILIES[name].loss
    model, x, y = build(name)
    prog = et.compile(model, (x,), loss=loss, update=et.Full())
    ours = prog.gradients(x.numpy(), y.numpy())
    ref = torch_gradients(model, x, y, loss)
    assert set(ours) == set(ref), f"{name}: gradients for {sorted(set(ours) ^ set(ref))}"
    floor = FLOOR * max(np.abs(g).max() for g in ref.values())
    errs = {k: rel_err(ours[k], ref[k], floor) for k in ref}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= TOL, f"{name}: {worst} relative error {errs[worst]:.2e}"


def test_every_family_model_is_tested_or_its_refusal_named():
    listed = QUICK + SLOW + list(REFUSED)
    assert sorted(listed) == sorted(FAMILIES), sorted(set(listed) ^ set(FAMILIES))


@pytest.mark.parametrize("name", QUICK)
def test_family_gradients_match_torch(name):
    check_family(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_family_gradients_match_torch_slow(name):
    check_family(name)


#: what the compiled BART says where torch raises "All examples must have the same number of <eos>
#: tokens.": that message (read from the model's torch_compilable_check call), the condition
#: torch.export asserts and the model line (ops/check.py's RunTimeCheckError, a ValueError as torch's)
BART_EOS_MESSAGE = (r"^All examples must have the same number of <eos> tokens\. \(run-time check Eq\(u0, 1\) at "
                    r".*modeling_bart\.py:\d+: \[m: BartForSequenceClassification\] torch\.unique_consecutive")


@pytest.mark.slow
def test_bart_rows_with_different_eos_counts_stop_as_torch():
    """BART's head requires every row to have as many eos tokens: torch raises, and the compiled
    program raises the same ValueError with torch's message, on the reference runtime and on the
    C backend (whose failed step keeps the weights: frontend/aten_dynamic.py, ops/check.py); rows
    with two eos tokens each are read at their last, as torch reads them."""
    import copy

    import torch

    from edgetrain.ops.check import RunTimeCheckError

    model, x, y = build("lm.hf_bart")
    prog = et.compile(model, (x,), loss="cross_entropy", update=et.Full())
    progs = {"reference": prog, "c": et.compile(copy.deepcopy(model).float(), (x,), loss="cross_entropy",
                                                update=et.Full(), backend="c")}
    two = x.clone()
    two[:, 5] = BART_EOS
    with torch.no_grad():
        np.testing.assert_allclose(prog.predict(two.numpy()), model(two).numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(progs["c"].predict(two.numpy()), model(two).numpy(), rtol=1e-4, atol=1e-5)
    for row in (0, 1):
        bad = x.clone()
        bad[row, 5] = BART_EOS
        with pytest.raises(ValueError, match="same number of <eos> tokens"):
            model(bad)
        for name, p in progs.items():
            before = {k: np.array(v) for k, v in p.state.items()}
            with pytest.raises(RunTimeCheckError, match=BART_EOS_MESSAGE):
                p.step(bad.numpy(), y.numpy())
            with pytest.raises(RunTimeCheckError, match=BART_EOS_MESSAGE):
                p.predict(bad.numpy())
            assert all(np.array_equal(p.state[k], v) for k, v in before.items()), name  # the step changed nothing


@pytest.mark.slow
def test_bart_trains_under_torch_compile():
    """torch.compile(model, backend="edgetrain") of lm.hf_bart in train(): dynamo breaks the graph
    at torch.unique_consecutive (its output shape depends on the data), so edgetrain compiles the
    graphs around it and PyTorch runs the check and the eos selection; an unchanged seeded SGD
    loop gives eager's losses (as tests/realmodels/test_torch_compile.py checks the others)."""
    import copy

    import torch

    from tests.torch_backend.loops import train_loop

    model, x, y = build("lm.hf_bart")
    model.train()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()

    def losses(m, fn):
        torch.manual_seed(123)
        return train_loop(m, fn, [(x, y)] * 3, lr=0.01)[0]

    want = losses(eager, eager)
    got = losses(model, torch.compile(model, backend="edgetrain"))
    assert max(abs(a - b) / abs(a) for a, b in zip(want, got)) <= 1e-10, (want, got)
    assert want[0] != want[-1]  # the loop trained
