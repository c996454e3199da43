"""The model families of issue 31 (tests/realmodels/families.py) capture and train: our float64
gradients (reference runtime) equal torch.autograd's for every trained parameter, each model
with its own loss (cross entropy, or an autoencoder's MSE against its input)."""
from __future__ import annotations

import numpy as np
import pytest
import torch.nn.functional as F

import edgetrain as et
from .families import FAMILIES, build
from .test_capture import FLOOR, float64_truth, rel_err

#: float64 relative error of every gradient
TOL = 1e-9
#: et.compile's losses as torch computes them
TORCH_LOSS = {"cross_entropy": F.cross_entropy, "mse": F.mse_loss}

#: one or two per family, a few seconds each
QUICK = ["audio.raw_cnn1d", "sensors.gru", "seg.unet", "ae.conv", "video.c3d", "lm.gpt2_lora",
         "norm.group_instance_cnn", "act.elu_prelu_mish_mlp"]
#: the rest that compile today, 5 to 120 seconds each
SLOW = ["audio.ds_cnn", "audio.hf_hubert", "audio.hf_wav2vec2", "sensors.lstm", "seg.hf_segformer",
        "seg.tv_lraspp_mobilenet_v3_large", "seg.tv_deeplabv3_mobilenet_v3_large", "seg.tv_fcn_resnet50", "ae.fc",
        "video.tv_r3d_18", "video.tv_mc3_18", "lm.hf_bart_last_eos", "norm.timm_resnet50_gn"]

#: models of the table that do not compile yet, and what refuses them (bench/family_probe.py)
REFUSED = {
    # BartForSequenceClassification.forward as transformers writes it: shift_tokens_right writes
    # into a new tensor in place (aten.copy), and the head checks the eos count per row with
    # torch.unique_consecutive and selects by a boolean mask (data-dependent shapes);
    # lm.hf_bart_last_eos trains the same encoder-decoder and head without those two steps
    "lm.hf_bart": "aten.copy.default (modeling_bart.py shift_tokens_right)",
}


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
