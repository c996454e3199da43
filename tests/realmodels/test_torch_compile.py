"""torch.compile(model, backend="edgetrain") of the real models in train(): an unchanged,
seeded SGD loop (momentum 0.9) gives eager's losses, in float64. Batch norm uses batch
statistics and updates its running statistics, dropout and stochastic depth draw their masks
from torch's generator as eager does (tests/torch_backend/test_torch_compile_train.py)."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.torch_backend.loops import train_loop
from .conftest import BUILDERS, build

#: relative difference of each of the three losses. Batch norm over a batch of 2 small maps
#: amplifies rounding differences step by step (RegNet: 3e-8 at step 3 in float64)
TOL = 1e-6
STEPS, LR, SEED = 3, 0.01, 123
QUICK = ["tv.shufflenet_v2_x0_5", "tv.mobilenet_v3_small", "timm.edgenext_xx_small", "hf.bert", "hf.gpt2lm"]
#: one model per mechanism besides the quick ones (bench/real_models.py's train() column runs
#: every model): batch norm with dropout (MnasNet), dropout alone (SqueezeNet), stochastic
#: depth (EfficientNet-B0), shifted windows with roll, new_zeros and index buffers (Swin-T),
#: the transformers' dropouts and padding positions (DistilBERT, MobileBERT, the GPT-2
#: classifier, ViT with both attentions)
SLOW = ["tv.mnasnet0_5", "tv.squeezenet1_1", "tv.efficientnet_b0", "tv.swin_t", "hf.distilbert", "hf.mobilebert",
        "hf.gpt2cls", "hf.vit", "hf.vit_eager"]
assert set(QUICK + SLOW) <= set(BUILDERS)


def losses(model, fn, x, y) -> list:
    torch.manual_seed(SEED)
    return train_loop(model, fn, [(x, y)] * STEPS, lr=LR)[0]


def check_train_mode(name: str):
    model, x, y = build(name)
    model.train()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    want = losses(eager, eager, x, y)
    got = losses(model, torch.compile(model, backend="edgetrain"), x, y)
    diff = max(abs(a - b) / abs(a) for a, b in zip(want, got))
    assert diff <= TOL, f"{name}: eager {want}, compiled {got}"


@pytest.mark.parametrize("name", QUICK)
def test_train_mode_gives_eager_losses(name):
    check_train_mode(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_train_mode_gives_eager_losses_slow(name):
    check_train_mode(name)
