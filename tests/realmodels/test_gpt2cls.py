"""GPT2ForSequenceClassification trains end to end: its pooling reads each row's logits at the
last non-padding token, a position computed from the token ids at run time
(`(ids != pad)`, `.argmax(-1)`, `logits[torch.arange(B), last]`: the ops compare and argmax,
and aten.index.Tensor lowered to an embedding read). Its gradients equal torch.autograd's on
the reference runtime and the C backend; so do those of a small model with the same pooling
whose padding differs per row and between calls of one compiled program (the positions are
not fixed at capture), and which trains alike on the C backend and on a Cortex-M4 (QEMU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from .test_c_backend import check_c_backend
from .test_capture import check_model

#: relative error of every gradient against torch.autograd: float64 (reference), float32 (C)
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
PAD = 0
#: two batches of token ids, padded (PAD) at different places per row and between the two:
#: the last real tokens are at 5, 2, 0, 3 and then at 1, 5, 3, 0 (a pad in the middle of row 0)
IDS = [torch.tensor([[3, 7, 1, 9, 4, 2], [5, 8, 6, 0, 0, 0], [11, 0, 0, 0, 0, 0], [2, 0, 7, 10, 0, 0]]),
       torch.tensor([[6, 4, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6], [9, 9, 1, 8, 0, 0], [4, 0, 0, 0, 0, 0]])]
LABELS = torch.tensor([0, 2, 1, 0])


def test_gpt2cls_gradients_match_torch():
    check_model("hf.gpt2cls")


@pytest.mark.slow  # about 25 s: two float32 programs compiled, one of them to C
def test_gpt2cls_on_the_c_backend():
    check_c_backend("hf.gpt2cls")


class LastTokenClassifier(nn.Module):
    """Per-token logits pooled at each row's last non-padding token, as GPT-2's classifier does."""

    def __init__(self, vocab: int = 12, width: int = 8, classes: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(6, width))
        self.fc = nn.Linear(width, classes)

    def forward(self, ids):
        logits = self.fc(torch.tanh(self.emb(ids) + self.pos))
        mask = (ids != PAD).to(torch.int32)
        last = (torch.arange(ids.shape[1], dtype=torch.int32) * mask).argmax(-1)
        return logits[torch.arange(ids.shape[0]), last]


def _torch_gradients(model, ids) -> dict:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(ids), LABELS).backward()
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def _worst(ours: dict, ref: dict) -> float:
    assert set(ours) == set(ref)
    return max(float(np.abs(ours[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-30)) for k in ref)


def test_the_last_tokens_differ_per_row_and_between_calls():
    """(what the tests below rely on: a position fixed at capture would fail them)"""
    last = [(torch.arange(6) * (ids != PAD)).argmax(-1).tolist() for ids in IDS]
    assert last == [[5, 2, 0, 3], [1, 5, 3, 0]]


@pytest.mark.parametrize("backend,dtype", [("reference", torch.float64), ("c", torch.float32)])
def test_last_token_pooling_gradients_match_torch_on_every_call(backend, dtype):
    torch.manual_seed(0)
    model = LastTokenClassifier().to(dtype)
    prog = et.compile(model, (IDS[0],), update=et.Full(), backend=backend)
    refs = [_torch_gradients(model, ids) for ids in IDS]
    assert _worst(refs[0], refs[1]) > 0.1  # the two batches' gradients differ: a baked-in result fails
    for ids, ref in zip(IDS, refs):
        assert _worst(prog.gradients(ids.numpy(), LABELS.numpy()), ref) <= TOL[dtype]


def test_last_token_pooling_trains_alike_on_c_and_reference():
    """Three SGD steps on alternating batches: the C backend's losses are the reference's."""
    torch.manual_seed(0)
    model = LastTokenClassifier()
    progs = [et.compile(model, (IDS[0],), update=et.Full(), optimizer=et.SGD(lr=0.5), backend=b)
             for b in ("reference", "c")]
    losses = [[p.step(IDS[k % 2].numpy(), LABELS.numpy()) for k in range(3)] for p in progs]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    want = []
    for k in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(IDS[k % 2]), LABELS)
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(losses[0], want, rtol=1e-5)


def test_last_token_pooling_runs_clean_under_sanitizers(tmp_path):
    """The emitted project built with -fsanitize=address,undefined: no runtime error in the
    compare / argmax / int64 arithmetic kernels, and the reference's losses."""
    import os
    import shutil
    import subprocess

    from edgetrain.backends.c import host

    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    torch.manual_seed(0)
    prog = et.compile(LastTokenClassifier(), (IDS[0],), update=et.Full(), optimizer=et.SGD(lr=0.5))
    samples = [(IDS[k % 2].numpy(), LABELS.numpy()) for k in range(3)]
    exe = host.build_executable(prog.emit_c(tmp_path / "proj", samples=samples), host.SANITIZE_CFLAGS)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "runtime error" not in r.stderr, r.stdout + r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("step")]
    np.testing.assert_allclose(losses, [prog.step(x, y) for x, y in samples], rtol=1e-5)


def test_last_token_pooling_on_cortex_m_prints_the_reference_losses(tmp_path):
    """compare, argmax and the int64 index arithmetic as Cortex-M4 firmware (QEMU)."""
    from edgetrain.backends.c import cortexm

    if cortexm.missing_tools():
        pytest.skip(f"missing {', '.join(cortexm.missing_tools())}")
    torch.manual_seed(0)
    prog = et.compile(LastTokenClassifier(), (IDS[0],), update=et.Full(), optimizer=et.SGD(lr=0.5))
    data = [(IDS[k % 2].numpy(), LABELS.numpy()) for k in range(3)]
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)
