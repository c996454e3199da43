"""The frontend's lowerings on small modules: split / chunk / unbind to slices, constants
folded at capture time, attention decomposed, tied weights captured once."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from edgetrain.frontend import capture


class Fn(nn.Module):
    def __init__(self, fn, width=6):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.lin(x))


def ops_of(model, x) -> list[str]:
    return [n.op for n in capture(model, (x,)).graph.nodes]


def assert_gradients(model, x, tol=1e-10):
    model = model.double().eval()
    x = x.double()
    y = torch.zeros(x.shape[0], dtype=torch.long)
    prog = et.compile(model, (x,), update=et.Full())
    ours = prog.gradients(x.numpy(), y.numpy())
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        ref = p.grad.numpy()
        assert np.abs(ours[name] - ref).max() <= tol * max(np.abs(ref).max(), 1e-3), name
    return prog


@pytest.mark.parametrize("fn", [
    lambda h: torch.cat(h.chunk(3, dim=1)[::-1], 1),  # split_with_sizes
    lambda h: torch.cat(h.split(4, dim=1)[::-1], 1),  # split.Tensor, a short last piece
    lambda h: torch.stack(h.unbind(1)[::-1], 1),  # unbind
    lambda h: torch.cat(h.split([1, 2, 3], dim=-1)[::-1], -1),
])
def test_split_chunk_unbind_are_slices(fn):
    model, x = Fn(fn), torch.randn(2, 6)
    ops = ops_of(model, x)
    assert "slice" in ops
    assert_gradients(model, x)


def test_shape_computations_fold_to_constants():
    """arange / eq / full / where built from shapes are evaluated during capture: no node of them
    reaches the graph, and a constant of one repeated value is a scalar broadcast, not an array."""
    def fn(h):
        i = torch.arange(h.shape[1])
        mask = (i[None, :] % 2).eq(0)  # 1, 0, 1, ...: a real array
        ones = torch.ones(h.shape)  # one value: a broadcast scalar
        return h * mask + ones * torch.full((h.shape[1],), 2.0)

    model, x = Fn(fn), torch.randn(2, 6)
    cap = capture(model, (x,))
    assert not {"arange", "eq", "remainder"} & {n.op for n in cap.graph.nodes}
    consts = [k for k in cap.buffers if k.startswith("const:")]
    assert len(consts) == 1 and cap.buffers[consts[0]].tolist() == [[True, False] * 3]
    assert_gradients(model, x)


def test_buffers_fold_and_stay_listed():
    """An op on a buffer alone (BERT's gather of its token_type_ids buffer) is a constant."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("ids", torch.tensor([[3, 1, 0, 2]]))

        def forward(self, x):
            return self.lin(x) + torch.gather(self.ids, 1, torch.tensor([[1, 0, 3, 2]])).double()

    cap = capture(M().double(), (torch.randn(2, 4, dtype=torch.float64),))
    assert "ids" in cap.buffers and "gather" not in {n.op for n in cap.graph.nodes}
    assert_gradients(M(), torch.randn(2, 4))


class Attention(nn.Module):
    def __init__(self, causal=False, mask=None, width=8, heads=2):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(width, 3 * width), nn.Linear(width, 3), heads
        self.causal, self.mask = causal, mask

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        mask = None if self.mask is None else self.mask(n)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.out(o.transpose(1, 2).reshape(b, n, c).mean(1))


@pytest.mark.parametrize("kind", ["none", "causal", "bool mask", "float mask"])
def test_attention_decomposes_and_matches_torch(kind):
    mask = {"bool mask": lambda n: torch.ones(n, n, dtype=torch.bool).triu(),
            "float mask": lambda n: torch.arange(n * n).reshape(n, n).double() / 10}.get(kind)
    model, x = Attention(causal=kind == "causal", mask=mask), torch.randn(2, 5, 8)
    ops = ops_of(model.double(), x.double())
    assert "softmax" in ops and "matmul" in ops
    assert_gradients(model, x)


def test_attention_refuses_a_query_without_keys():
    model = Attention(mask=lambda n: torch.zeros(n, n, dtype=torch.bool))
    with pytest.raises(et.UnsupportedOpError, match="attends to no key"):
        capture(model, (torch.randn(2, 5, 8),))


def test_tied_weights_are_one_value_and_their_gradients_add():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 4)
            self.head = nn.Linear(4, 7, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, t):
            return self.head(self.emb(t).mean(1))

    model, t = Tied().double(), torch.randint(0, 7, (2, 3))
    cap = capture(model, (t,))
    assert list(cap.params) == ["emb.weight"]
    prog = et.compile(model, (t,), update=et.Full())
    y = torch.tensor([1, 2])
    ours = prog.gradients(t.numpy(), y.numpy())
    F.cross_entropy(model(t), y).backward()
    np.testing.assert_allclose(ours["emb.weight"], model.emb.weight.grad.numpy(), rtol=0, atol=1e-12)
