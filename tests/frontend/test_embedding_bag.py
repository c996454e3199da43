"""nn.EmbeddingBag (frontend/aten_layers.py's _embedding_bag): sum, mean and max bags of a 2-D input,
and sum and mean bags of 1-D ids split by constant offsets (bags of different sizes, an empty bag,
include_last_offset), with a padding id (left out of the bag and of the mean's count: an all-padding
bag gives zeros) and per-sample weights. Forward and float64 gradients equal torch's on the reference
runtime, the C backend's float32 gradients the reference's, torch.compile's loop eager's losses;
offsets computed at run time are refused by name."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from tests.torch_backend.loops import train_loop

CLASSES = 5
#: bags of 2, 0, 5, 2 and 3 ids (12 ids; with include_last_offset the last offset is the end)
OFFSETS = [0, 2, 2, 7, 9]


class Bags(nn.Module):
    """EmbeddingBag over the rows of a 2-D input, or over 1-D ids with OFFSETS, then a classifier"""

    def __init__(self, mode: str, pad=None, flat=False, last=False, weighted=False):
        super().__init__()
        self.bag = nn.EmbeddingBag(30, 8, mode=mode, padding_idx=pad, include_last_offset=last)
        self.fc, self.flat, self.weighted = nn.Linear(8, CLASSES), flat, weighted
        self.register_buffer("offsets", torch.tensor(OFFSETS + ([12] if last else [])))
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 12)) if weighted else None

    def forward(self, ids):
        if not self.flat:
            return self.fc(self.bag(ids))
        return self.fc(self.bag(ids, self.offsets, per_sample_weights=self.w))


def _ids(flat: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if flat:
        ids = torch.randint(1, 30, (12,), generator=g)
        ids[2:4] = 0  # (the third bag, ids 2..6, starts with two padding ids)
        return ids
    ids = torch.randint(1, 30, (4, 5), generator=g)
    ids[1, :3] = 0
    ids[2] = 0  # a bag of padding only
    ids[3, 1] = ids[3, 3]  # an id twice in a bag
    return ids


CASES = {f"rows-{mode}-pad{pad}": dict(mode=mode, pad=pad) for mode in ("sum", "mean", "max")
         for pad in ((None, 0) if mode != "max" else (None,))}
CASES.update({f"offsets-{mode}-pad{pad}-last{last}": dict(mode=mode, pad=pad, flat=True, last=last)
              for mode in ("sum", "mean") for pad in (None, 0) for last in (False, True)})
CASES["offsets-weighted"] = dict(mode="sum", pad=0, flat=True, weighted=True)


def _model(name):
    torch.manual_seed(0)
    kw = CASES[name]
    return Bags(**kw).eval(), _ids(kw.get("flat", False))


def _rel(ours, ref, floor=1e-6):
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), floor))


@pytest.mark.parametrize("name", sorted(CASES))
def test_float64_forward_and_gradients_equal_torch(name):
    model, ids = _model(name)
    model = model.double()
    y = torch.arange(model(ids).shape[0]) % CLASSES
    prog = et.compile(model, (ids,), update=et.Full())
    with torch.no_grad():
        np.testing.assert_allclose(prog.predict(ids.numpy()), model(ids).numpy(), rtol=1e-13, atol=1e-14)
    ours = prog.gradients(ids.numpy(), y.numpy())
    model.zero_grad()
    F.cross_entropy(model(ids), y).backward()
    for n, p in model.named_parameters():
        assert _rel(ours[n], p.grad.numpy()) <= 1e-10, n


@pytest.mark.parametrize("name", ["rows-mean-pad0", "rows-max-padNone", "offsets-mean-pad0-lastTrue",
                                  "offsets-weighted"])
def test_c_backend_gradients_equal_the_reference(name):
    model, ids = _model(name)
    y = (torch.arange(model(ids).shape[0]) % CLASSES).numpy()
    ref = et.compile(model, (ids,), update=et.Full()).gradients(ids.numpy(), y)
    got = et.compile(model, (ids,), update=et.Full(), backend="c").gradients(ids.numpy(), y)
    for n in ref:
        assert _rel(got[n], ref[n], 1e-3) <= 1e-5, n


def test_torch_compile_training_loop_gives_eager_losses():
    model, ids = _model("offsets-mean-pad0-lastFalse")
    model = model.double().train()
    eager = copy.deepcopy(model)
    batches = [(ids, torch.arange(5) % CLASSES)] * 3
    torch._dynamo.reset()
    le, _ = train_loop(eager, eager, batches, lr=0.5)
    lc, _ = train_loop(model, torch.compile(model, backend="edgetrain"), batches, lr=0.5)
    assert max(abs(a - b) / abs(a) for a, b in zip(le, lc)) < 1e-12, (le, lc)


def test_offsets_given_at_run_time_are_refused_by_name():
    class RunTimeBags(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(30, 8)

        def forward(self, ids, offsets):
            return self.bag(ids, offsets)

    with pytest.raises(et.frontend.UnsupportedOpError, match="offsets computed at run time"):
        et.compile(RunTimeBags(), (torch.tensor([1, 2, 3]), torch.tensor([0, 1])), update=et.Full())
