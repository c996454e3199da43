"""loss="causal_lm": Hugging Face's causal language-model loss from `labels=` (each position
predicts the next token, -100 ignored), its gradients against torch.autograd, and predict's
logits of every position."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import edgetrain as et
from tests.realmodels import conftest as _  # noqa: F401  (the torchvision workaround, before transformers)

VOCAB, T = 100, 8


class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.m = lm

    def forward(self, ids):
        return self.m(ids).logits


def _llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(cfg).to(dtype)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, T), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # left padding of the first sequence
    return ids, labels


def test_loss_and_gradients_equal_hugging_face_labels_loss():
    """float64 (transformers' RMSNorm computes in float32 still, hence 1e-6 of the largest)."""
    lm = _llama(torch.float64)
    ids, labels = _batch()
    prog = et.compile(Logits(lm), (ids,), loss="causal_lm")
    out = lm(ids, labels=labels)
    out.loss.backward()
    grads = prog.gradients(ids.numpy(), labels.numpy())
    by_name = dict(lm.named_parameters())
    assert len(grads) == len(by_name)
    for name, g in grads.items():
        expected = by_name[name.removeprefix("m.")].grad.numpy()
        np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max(), err_msg=name)
    assert prog.step(ids.numpy(), labels.numpy()) == pytest.approx(float(out.loss), rel=1e-7)


def test_every_label_shifted_not_the_logits_of_the_last_position():
    """The last position's logits take no part: changing the last label changes nothing of
    position T-1 and the loss is the mean over T-1 positions of each sequence."""
    lm = _llama()
    ids, labels = _batch()
    prog = et.compile(Logits(lm), (ids,), loss="causal_lm")
    logits = prog.predict(ids.numpy())
    assert logits.shape == (2, T, VOCAB)
    np.testing.assert_allclose(logits, lm(ids).logits.detach().numpy(), rtol=1e-4, atol=1e-5)
    flat = torch.nn.functional.cross_entropy(torch.from_numpy(logits[:, :-1]).reshape(-1, VOCAB),
                                             labels[:, 1:].reshape(-1))
    assert prog.step(ids.numpy(), labels.numpy()) == pytest.approx(float(flat), rel=1e-5)


def test_lora_on_a_decoder_trains_with_the_causal_loss_on_the_c_backend():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no host C compiler")
    ids, labels = _batch()
    ref = et.compile(Logits(_llama()), (ids,), loss="causal_lm", update=et.LoRA(rank=4),
                     optimizer=et.SGD(lr=0.5))
    c = et.compile(Logits(_llama()), (ids,), loss="causal_lm", update=et.LoRA(rank=4),
                   optimizer=et.SGD(lr=0.5), backend="c")
    losses = [(ref.step(ids.numpy(), labels.numpy()), c.step(ids.numpy(), labels.numpy())) for _ in range(3)]
    np.testing.assert_allclose(*zip(*losses), rtol=1e-5)
    assert losses[-1][0] < losses[0][0]


def test_causal_lm_needs_a_sequence():
    with pytest.raises(ValueError, match="causal_lm needs"):
        et.compile(torch.nn.Linear(4, 3), (torch.randn(2, 4),), loss="causal_lm")
