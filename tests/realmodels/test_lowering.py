"""The frontend's lowerings on small modules: split / chunk / unbind to slices, constants
folded at capture time, attention decomposed, tied weights captured once."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from edgetrain.interpreter import run_graph
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


#: (side, kernel, stride, padding, dilation) where ceil_mode adds a window, and some where it does not
CEIL_POOLS = [(h, k, s, p, d) for h in (5, 6, 7, 8, 9) for k, s, p, d in
              [(2, 2, 0, 1), (3, 2, 0, 1), (3, 2, 1, 1), (3, 3, 1, 1), (2, 3, 1, 1), (3, 2, 1, 2), (4, 3, 2, 1)]
              if (h + 2 * p - d * (k - 1) - 1) >= 0]


@pytest.mark.parametrize("h,k,s,p,d", CEIL_POOLS)
def test_max_pool_ceil_mode_is_a_minus_inf_pad_and_floor_mode(h, k, s, p, d):
    """The captured graph's values equal torch's for every size (odd and even, both sides)."""
    pool = nn.MaxPool2d(k, s, p, dilation=d, ceil_mode=True)
    x = torch.randn(2, 3, h, h + 1, dtype=torch.float64)
    cap = capture(pool, (x,))
    got, _ = run_graph(cap.graph, {"input:0": x.numpy()})
    np.testing.assert_array_equal(got["output"], pool(x).numpy())
    floor = nn.MaxPool2d(k, s, p, dilation=d)(x).shape
    assert ("pad" in [n.op for n in cap.graph.nodes]) == (pool(x).shape != floor)


@pytest.mark.parametrize("h,k,s,p,d", [(5, 2, 2, 0, 1), (8, 3, 2, 1, 1), (7, 3, 2, 1, 2), (6, 4, 3, 2, 1)])
def test_max_pool_ceil_mode_gradients(h, k, s, p, d):
    pool = nn.MaxPool2d(k, s, p, dilation=d, ceil_mode=True)
    out = pool(torch.zeros(1, 1, h, h + 1)).shape[2:]
    model = nn.Sequential(nn.Conv2d(2, 3, 1), pool, nn.Flatten(), nn.Linear(3 * out[0] * out[1], 4))
    assert_gradients(model, torch.randn(2, 2, h, h + 1))


AVG_CEIL_POOLS = [(h, k, s, p) for h in (5, 6, 7, 8) for k, s, p in [(2, 2, 0), (3, 2, 0), (3, 2, 1), (2, 3, 1)]
                  if h + 2 * p - k >= 0]


@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("h,k,s,p", AVG_CEIL_POOLS)
def test_average_pool_ceil_mode_matches_torch(h, k, s, p, cip):
    pool = nn.AvgPool2d(k, s, p, ceil_mode=True, count_include_pad=cip)
    x = torch.randn(2, 3, h, h + 1, dtype=torch.float64)
    cap = capture(pool, (x,))
    got, _ = run_graph(cap.graph, {**cap.buffers, "input:0": x.numpy()})
    np.testing.assert_allclose(got["output"], pool(x).numpy(), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("k,s,p,cip,div", [(3, 2, 1, True, None), (3, 2, 1, False, None), (2, 2, 0, True, 3)])
def test_average_pool_ceil_mode_gradients(k, s, p, cip, div):
    pool = nn.AvgPool2d(k, s, p, ceil_mode=True, count_include_pad=cip, divisor_override=div)
    out = pool(torch.zeros(1, 1, 7, 8)).shape[2:]
    model = nn.Sequential(nn.Conv2d(2, 3, 1), pool, nn.Flatten(), nn.Linear(3 * out[0] * out[1], 4))
    assert_gradients(model, torch.randn(2, 2, 7, 8))


def test_constant_pad_with_negative_widths_crops():
    model = Fn(lambda h: F.pad(h.reshape(2, 2, 3), (1, -1, -1, 2), value=0.5).flatten(1), width=6)
    model = nn.Sequential(model, nn.Linear(9, 3))
    assert_gradients(model, torch.randn(2, 6))


def test_gather_with_a_constant_index_is_a_gather_node():
    index = torch.tensor([[2, 0, 0, 5], [1, 1, 3, 4]])
    model = nn.Sequential(Fn(lambda h: torch.gather(h, 1, index)), nn.Linear(4, 3))
    assert "gather" in ops_of(model.double(), torch.randn(2, 6, dtype=torch.float64))
    assert_gradients(model, torch.randn(2, 6))


@pytest.mark.parametrize("pick", [
    lambda t: t[:, torch.tensor([[0, 3], [5, 5]])],  # one index tensor of rank 2 (LeViT's biases)
    lambda t: t[torch.tensor([1, 0]), torch.tensor([[2], [4]])],  # two, broadcast
    lambda t: t.index_select(1, torch.tensor([5, 0, 0])),
])
def test_index_with_constant_indices_is_an_index_select(pick):
    table = nn.Parameter(torch.randn(2, 6))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.table, self.lin = table, nn.Linear(6, 6)

        def forward(self, x):
            return self.lin(x) + pick(self.table).sum()

    model = M()
    ops = ops_of(model.double(), torch.randn(2, 6, dtype=torch.float64))
    assert "index_select" in ops
    assert_gradients(model, torch.randn(2, 6))


def test_as_strided_reads_torch_storage_order():
    """A transposed input (strides not row-major): as_strided reads its storage as torch does."""
    model = Fn(lambda h: torch.as_strided(h.t(), (3, 2), (1, 6), 1).reshape(2, 3))
    model = nn.Sequential(model, nn.Linear(3, 3))
    cap = capture(model.double(), (torch.randn(2, 6, dtype=torch.float64),))
    assert "index_select" in [n.op for n in cap.graph.nodes]
    assert_gradients(model, torch.randn(2, 6))


def test_vector_norm_is_sqrt_of_sum_of_squares():
    model = nn.Sequential(Fn(lambda h: F.normalize(h.reshape(2, 2, 3), dim=-1).flatten(1)), nn.Linear(6, 3))
    assert_gradients(model, torch.randn(2, 6))


def test_empty_allocations_fold_as_zeros():
    """torch leaves an empty tensor's contents undefined: folded, it is zeros, never old memory."""
    from edgetrain.frontend.capture import evaluate

    g = torch.fx.Graph()
    sizes = [g.call_function(torch.ops.aten.empty.memory_format, ([3, 4],), {"dtype": torch.float32}),
             g.call_function(torch.ops.aten.empty_strided.default, ([2, 5], [1, 2]), {"dtype": torch.float64})]
    like = g.placeholder("x")
    sizes += [g.call_function(torch.ops.aten.empty_like.default, (like,)),
              g.call_function(torch.ops.aten.new_empty.default, (like, [6]))]
    known = {"x": torch.ones(2, 2)}
    for node in sizes:
        t = evaluate(node, known)
        assert not t.any() and t.dtype in (torch.float32, torch.float64)


def _allocations(h):
    """allocations shaped like a tensor known only at run time (torch.zeros_like(h) in a where)"""
    zeros = torch.where(h > 0, h, torch.zeros_like(h)) + torch.empty_like(h).zero_() + h.new_zeros(h.shape[0], 6)
    return zeros + torch.full_like(h, 0.5) * h + torch.ones_like(h) + h.new_full((6,), 2.0) + h.new_ones(6) * h


def test_allocations_shaped_like_a_run_time_tensor_are_constants():
    x = torch.randn(3, 6)
    prog = assert_gradients(Fn(_allocations), x)  # (refused before: aten.full_like of a run-time tensor)
    with torch.no_grad():
        model = Fn(_allocations).double()
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in prog.state_dict().items()})
        np.testing.assert_array_equal(prog.predict(x.double().numpy()), model(x.double()).numpy())
