"""Models with group / instance / channel layer normalisation, where (masked_fill), cumsum and
index_put, captured and trained exactly: float64 gradients equal torch.autograd's on the
reference runtime, the C backend's float32 gradients equal the reference's, and a small model
with group_norm, where and cumsum prints the same losses on a Cortex-M4 (QEMU) as on the host."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from edgetrain.frontend import UnsupportedOpError
import tests.realmodels.conftest  # noqa: F401  (lets timm and transformers import beside CPU torch)
from tests.backends.c.firmware_agreement import firmware_prints_host_steps
from tests.frontend.model_checks import float64_gradients_equal_autograd

#: max |ours - torch| / max(|torch|, 1e-3) of a float64 gradient
FLOAT64_TOL = 1e-10
#: max |C - reference| of a float32 gradient, over the model's largest reference gradient
C_TOL = 1e-5
#: the padding token id of the token models (RoBERTa's padding_idx)
PAD = 1


# --- models ---------------------------------------------------------------------------------------
class ConvNorm(nn.Module):
    """conv -> a normalisation of its channels -> relu -> global mean -> linear"""

    def __init__(self, norm: nn.Module, dims: int = 2):
        super().__init__()
        self.conv = (nn.Conv2d if dims == 2 else nn.Conv1d)(3, 8, 3, padding=1)
        self.norm, self.fc = norm, nn.Linear(8, 5)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        return self.fc(h.mean(tuple(range(2, h.dim()))))


class ChannelLayerNorm(nn.Module):
    """F.layer_norm over (C, H, W): every value of a sample normalised together"""

    def forward(self, x):
        return F.layer_norm(x, x.shape[1:])


def _instance_norm_with_stats():
    norm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
    with torch.no_grad():
        norm.running_mean.uniform_(-1.0, 1.0)
        norm.running_var.uniform_(0.5, 2.0)
    return norm


def _timm_layer_norm_2d():
    from timm.layers import LayerNorm2d  # permute -> layer_norm over C -> permute back

    return LayerNorm2d(8)


NORM_MODELS = {
    "group_norm": lambda: ConvNorm(nn.GroupNorm(4, 8)),
    "group_norm_no_affine": lambda: ConvNorm(nn.GroupNorm(2, 8, affine=False)),
    "instance_norm_2d": lambda: ConvNorm(nn.InstanceNorm2d(8, affine=True)),
    "instance_norm_2d_no_affine": lambda: ConvNorm(nn.InstanceNorm2d(8)),
    "instance_norm_2d_running_stats": lambda: ConvNorm(_instance_norm_with_stats()),
    "instance_norm_1d": lambda: ConvNorm(nn.InstanceNorm1d(8, affine=True), dims=1),
    "instance_norm_1d_no_affine": lambda: ConvNorm(nn.InstanceNorm1d(8), dims=1),
    "timm_layer_norm_2d": lambda: ConvNorm(_timm_layer_norm_2d()),
    "layer_norm_over_chw": lambda: ConvNorm(ChannelLayerNorm()),
}


class MaskedFill(nn.Module):
    """masked_fill, torch.where and a masked assignment with masks computed from the data"""

    def __init__(self):
        super().__init__()
        self.lin, self.fc = nn.Linear(6, 8), nn.Linear(8, 5)

    def forward(self, x):
        h = self.lin(x)
        h = h.masked_fill(h < 0.1, -0.5)
        h = torch.where(x.sum(-1, keepdim=True) > 0, h, 0.5 * h + 1.0)
        h[h > 1.0] = 1.0  # index_put of one value under a computed mask: a where
        return self.fc(h)


class MaskedRows(nn.Module):
    """Rows replaced by a trained embedding under a mask computed from the data (Hubert's and
    Wav2Vec2's SpecAugment: hidden_states[mask] = masked_spec_embed): a where over the rows"""

    def __init__(self):
        super().__init__()
        self.lin, self.fc = nn.Linear(6, 8), nn.Linear(8, 5)
        self.embed = nn.Parameter(torch.randn(8))

    def forward(self, x):  # x: (B, 4, 6)
        h = self.lin(x)
        h[x.sum(-1) > 0] = self.embed
        return self.fc(h.mean(1))


class RunningSum(nn.Module):
    """cumsum of float activations along the sequence"""

    def __init__(self):
        super().__init__()
        self.lin, self.fc = nn.Linear(6, 4), nn.Linear(20, 5)

    def forward(self, x):  # x: (B, 5, 6)
        return self.fc(torch.tanh(self.lin(x).cumsum(1)).flatten(1))


class PositionIds(nn.Module):
    """Token and position embeddings, the positions counted over the non-padding tokens by
    cumsum of the padding mask (RoBERTa's create_position_ids_from_input_ids)"""

    def __init__(self, vocab: int = 20, width: int = 6, length: int = 8):
        super().__init__()
        self.tok = nn.Embedding(vocab, width, padding_idx=PAD)
        self.pos = nn.Embedding(length + PAD + 1, width, padding_idx=PAD)
        self.fc = nn.Linear(width, 5)

    def forward(self, ids):
        mask = ids.ne(PAD).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + PAD
        return self.fc((self.tok(ids) + self.pos(positions)).mean(1))


class ScatterAdd(nn.Module):
    """index_put: accumulated into zeros at constant (repeated) positions and at positions
    computed from the data, and written over activations (their gradient zeroed there)"""

    def __init__(self):
        super().__init__()
        self.lin, self.fc = nn.Linear(6, 6), nn.Linear(36, 5)
        self.register_buffer("slots", torch.tensor([0, 2, 0, 5]))

    def forward(self, x):  # x: (B, 4, 6)
        h = self.lin(x)
        bins = torch.zeros(6, x.shape[0], 6, dtype=h.dtype)
        bins = bins.index_put((self.slots,), h.transpose(0, 1), accumulate=True)
        where = h.argmax(-1).flatten()  # computed positions in [0, 6)
        hist = torch.zeros(6, dtype=h.dtype).index_put((where,), h.sum(-1).flatten(), accumulate=True)
        bins = bins.transpose(0, 1).clone()
        bins[:, torch.tensor([1, 3])] = torch.tanh(h[:, :2])  # index_put (None, [1, 3]): overwritten
        return self.fc(torch.tanh(bins + hist).flatten(1))


def _tokens(batch: int = 2, length: int = 8, vocab: int = 20) -> torch.Tensor:
    """Token ids, the rows padded at the end by different lengths."""
    ids = torch.randint(PAD + 1, vocab, (batch, length), generator=torch.Generator().manual_seed(3))
    for b in range(batch):
        ids[b, length - 2 * b - 1:] = PAD
    return ids


SELECT_MODELS = {
    "masked_fill": (MaskedFill, lambda: torch.randn(3, 6)),
    "masked_rows": (MaskedRows, lambda: torch.randn(3, 4, 6)),
    "cumsum_activations": (RunningSum, lambda: torch.randn(2, 5, 6)),
    "cumsum_position_ids": (PositionIds, _tokens),
    "index_put": (ScatterAdd, lambda: torch.randn(2, 4, 6)),
}


def _model_and_input(name: str):
    torch.manual_seed(0)
    if name in NORM_MODELS:
        model, x = NORM_MODELS[name](), torch.randn((2, 3, 7) if name.startswith("instance_norm_1d") else (2, 3, 6, 6))
    else:
        make, data = SELECT_MODELS[name]
        model, x = make(), data()
    with torch.no_grad():  # affine weights away from their initial ones and zeros
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval(), x


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-3))


def _labels(x) -> torch.Tensor:
    return torch.arange(x.shape[0]) % 5


# --- float64 gradients equal torch.autograd's ------------------------------------------------------
@pytest.mark.parametrize("name", sorted(NORM_MODELS) + sorted(SELECT_MODELS))
def test_float64_gradients_equal_autograd(name):
    model, x = _model_and_input(name)
    float64_gradients_equal_autograd(model, x, _labels(x), tol=FLOAT64_TOL)


def test_each_family_lowers_to_its_op():
    """GroupNorm and InstanceNorm without running statistics are group_norm; with them, eval-mode
    batch_norm; masked_fill is where; position ids are an int64 cumsum; index_put stays whole."""
    def ops(name):
        model, x = _model_and_input(name)
        return {n.op for n in et.frontend.capture(model, (x,)).graph.nodes}

    assert "group_norm" in ops("group_norm") and "group_norm" in ops("instance_norm_1d")
    stats = ops("instance_norm_2d_running_stats")
    assert "batch_norm" in stats and "group_norm" not in stats
    assert "where" in ops("masked_fill") and "index_put" in ops("index_put")
    model, ids = _model_and_input("cumsum_position_ids")
    graph = et.frontend.capture(model, (ids,)).graph
    assert [n.out.dtype for n in graph.nodes if n.op == "cumsum"] == ["int64"]


def test_instance_norm_affine_is_a_norm_layer_of_update_schemes():
    """InstanceNorm's group_norm takes the module's own weight and bias (not their repeats per
    sample), so a bias-only update trains its bias as batch norm's."""
    model, x = _model_and_input("instance_norm_2d")
    graph = et.frontend.capture(model, (x,)).graph
    (norm,) = [n for n in graph.nodes if n.op == "group_norm"]
    assert [v.name for v in norm.inputs[1:]] == ["norm.weight", "norm.bias"]
    assert "norm.bias" in et.compile(model, (x,), update=et.BiasOnly()).trainable


class _ApartIndices(nn.Module):
    def forward(self, x):
        h = x.clone()
        h[torch.tensor([0]), :, torch.tensor([1])] = 0.0  # index tensors on dims 0 and 2
        return h


class _MaskedRows(nn.Module):
    def forward(self, x):
        h = x.clone()
        h[x.sum(1) > -1e9] = torch.zeros(6, 3)  # a row per selected position: as many as the data selects
        return h


@pytest.mark.parametrize("model, message", [(_ApartIndices(), "non-adjacent dims"),
                                            (_MaskedRows(), "boolean mask computed from the inputs")])
def test_index_put_it_cannot_express_is_refused_by_name(model, message):
    with pytest.raises(UnsupportedOpError, match="aten.index_put") as err:
        et.frontend.capture(model, (torch.randn(2, 3, 3),))
    assert message in str(err.value) and "test_norm_select.py" in str(err.value)


# --- the C backend (float32) equals the reference runtime --------------------------------------------
#: one C library build each (seconds): the kernels' families by default, the other models in the slow run
C_MODELS = ["group_norm", "cumsum_position_ids", "index_put"] + [
    pytest.param(name, marks=pytest.mark.slow)
    for name in ("instance_norm_2d", "timm_layer_norm_2d", "masked_fill", "cumsum_activations")]


@pytest.mark.parametrize("name", C_MODELS)
def test_c_backend_gradients_equal_the_reference(name):
    model, x = _model_and_input(name)
    xs, ys = x.numpy(), _labels(x).numpy()
    ref = et.compile(model, (x,), update=et.Full()).gradients(xs, ys)
    got = et.compile(model, (x,), update=et.Full(), backend="c").gradients(xs, ys)
    assert set(got) == set(ref)
    # relative to the model's largest gradient: a gradient that is zero in exact arithmetic (a
    # convolution's bias before a normalisation of its channels) is rounding noise in both
    scale = max(float(np.abs(g).max()) for g in ref.values())
    for n in ref:
        assert float(np.abs(got[n] - ref[n]).max()) <= C_TOL * scale, n


# --- a Hugging Face model whose position ids come from cumsum ------------------------------------
@pytest.mark.slow
def test_roberta_position_ids_from_cumsum_train_exactly():
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, pad_token_id=PAD, num_labels=5)

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = RobertaForSequenceClassification(cfg)

        def forward(self, ids):
            return self.m(ids).logits

    model, ids = Logits().double().eval(), _tokens()
    y = _labels(ids)
    prog = et.compile(model, (ids,), update=et.Full())
    assert "cumsum" in {n.op for n in prog.train_graph.nodes}
    ours = prog.gradients(ids.numpy(), y.numpy())
    model.zero_grad()
    F.cross_entropy(model(ids), y).backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert _rel(ours[n], p.grad.numpy()) <= FLOAT64_TOL, n


# --- group_norm, where and cumsum on a Cortex-M4: the host build's losses -------------------------
class _SelectNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm, self.fc = nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.Linear(16, 10)

    def forward(self, x):
        h = self.norm(self.conv(x))
        h = torch.where(h > 0, h, 0.1 * h)
        h = F.avg_pool2d(h, 2).flatten(1)  # (1, 16)
        return self.fc(h.cumsum(1) * 0.25)


def test_group_norm_where_cumsum_on_cortex_m_print_the_host_builds_losses(tmp_path):
    import shutil

    from edgetrain.backends.c import cortexm

    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    torch.manual_seed(0)
    shape = (1, 1, 4, 4)
    prog = et.compile(_SelectNormNet(), (torch.zeros(shape),), optimizer=et.SGD(lr=0.05))
    assert {"group_norm", "group_norm_grad_input", "where", "cumsum"} <= {n.op for n in prog.train_graph.nodes}
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(shape).astype(np.float32), np.array([i % 10])) for i in range(3)]
    fw = firmware_prints_host_steps(prog, data, tmp_path)
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)


# --- an index out of its dim's range: the reference raises (as torch), the C kernel skips it -------
def test_index_put_out_of_range_is_skipped_in_c_and_raises_in_the_reference():
    from edgetrain.backends.c.graph_lib import build_graph_library
    from edgetrain.interpreter import run_graph
    from tests.ops.test_ops import feeds, forward_graph

    x, v = np.zeros(3, np.float32), np.array([1.0, 2.0, 3.0], np.float32)
    idx = np.array([0, 5, -1], np.int64)  # 5 is out of range; -1 is the last position
    g = forward_graph("index_put", [x, v, idx], {"first": 0, "accumulate": True})
    (got,) = build_graph_library(g)([x, v, idx])
    np.testing.assert_array_equal(got, [1.0, 0.0, 3.0])
    with pytest.raises(IndexError):
        run_graph(g, feeds([x, v, idx]))
