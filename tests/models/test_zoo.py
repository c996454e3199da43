"""The zoo: every model builds, runs, is deterministic and exports; the MCU networks have
exactly the architecture of the paper's int8 files."""
import collections
import io
import pickle
import re

import pytest
import torch
from torch import nn

import edgetrain as et
from tests.models import tiny_training_file as ttf

MCU = ["mbv2-w0.35", "mcunet-5fps", "proxyless-w0.3"]
ZOO = MCU + ["resnet18", "resnet18-cifar", "bert-tiny"]
MLPERF_TINY = ["ds-cnn", "ad-autoencoder"]
#: the only module types a zoo model may contain (its leaves, and containers)
ALLOWED_MODULES = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.Linear, nn.AdaptiveAvgPool2d, nn.MaxPool2d,
                   nn.Dropout, nn.Embedding, nn.LayerNorm, nn.GELU)
#: published parameter counts: torchvision's resnet18 (1000 classes), and BERT-Tiny
#: (google/bert_uncased_L-2_H-128_A-2) without a classification head
RESNET18_IMAGENET_PARAMS, BERT_TINY_ENCODER_POOLER_PARAMS = 11_689_512, 4_385_920


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    """Batch-1 passes through these small nets gain nothing from a second intra-op thread,
    and beside another busy process on 2 cores its spinning made this file 4x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _convs_as_called(model: nn.Module, x: torch.Tensor) -> list[tuple]:
    """(module, weight shape, stride, groups, input width, output width) per conv call."""
    calls = []

    def record(conv, inputs, out):
        calls.append((conv, tuple(conv.weight.shape), conv.stride[0], conv.groups, inputs[0].shape[-1], out.shape[-1]))

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return calls


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _kinds(seq: nn.Sequential) -> list[type]:
    return [type(m) for m in seq]


def test_names_and_unknown_model():
    assert et.models.names() == ZOO + MLPERF_TINY  # MLPerf Tiny's are tested in test_mlperf_tiny.py
    with pytest.raises(ValueError, match=re.escape("unknown model 'mbv3'; known: " + ", ".join(ZOO + MLPERF_TINY))):
        et.models.get("mbv3")
    with pytest.raises(ValueError, match="num_classes"):
        et.models.get("resnet18", num_classes=0)


@pytest.mark.parametrize("num_classes", [10, 1000])
@pytest.mark.parametrize("name", ZOO)
def test_forward_shape_and_scale(name, num_classes):
    model = et.models.get(name, num_classes=num_classes)
    assert not model.training
    with torch.no_grad():
        y = model(et.models.example_input(name, seed=1))  # not the input the init saw
    assert y.shape == (1, num_classes) and torch.isfinite(y).all()
    assert 0.01 < float(y.std()) < 100


@pytest.mark.parametrize("name", ZOO)
def test_deterministic_per_seed_and_leaves_rng_alone(name):
    state = torch.random.get_rng_state()
    a, b, c = et.models.get(name), et.models.get(name), et.models.get(name, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())


@pytest.mark.parametrize("name", ZOO)
def test_exports_and_decomposes(name):
    model = et.models.get(name)
    x = et.models.example_input(name)
    ep = torch.export.export(model, (x,)).run_decompositions()
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x))


@pytest.mark.parametrize("name", ZOO)
def test_supported_layers_and_nontrivial_init(name):
    model = et.models.get(name)
    for m in model.modules():
        container = type(m) is nn.Sequential or type(m).__module__.startswith("edgetrain.models.")
        assert container or isinstance(m, ALLOWED_MODULES), type(m)
        if isinstance(m, nn.Conv2d):
            assert m.bias is None  # every conv is followed by batch norm
        if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            assert not torch.equal(m.weight, torch.ones_like(m.weight))
        if isinstance(m, nn.BatchNorm2d):
            assert (m.running_var > 0).all() and m.running_mean.abs().sum() > 0


def test_published_parameter_counts():
    assert _n_params(et.models.get("resnet18", num_classes=1000)) == RESNET18_IMAGENET_PARAMS
    bert = et.models.get("bert-tiny")
    assert _n_params(bert) - _n_params(bert.classifier) == BERT_TINY_ENCODER_POOLER_PARAMS


def test_bert_takes_shorter_sequences_and_constructor_keywords():
    model = et.models.get("bert-tiny", num_classes=3, vocab_size=100)
    assert model.word_embeddings.num_embeddings == 100
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    assert model(ids).shape == (2, 3)
    assert "position_ids" not in model.state_dict()


@pytest.mark.parametrize("name", MCU)
def test_mcu_naming_and_forward_order(name):
    model = et.models.get(name)
    conv_bn, conv_bn_relu6 = [nn.Conv2d, nn.BatchNorm2d], [nn.Conv2d, nn.BatchNorm2d, nn.ReLU6]
    assert _kinds(model.first_conv) == conv_bn_relu6 and isinstance(model.classifier, nn.Linear)
    in_order = [model.first_conv[0]]
    for block in model.blocks:
        assert {n for n, _ in block.named_children()} <= {"pointwise1", "depthwise", "pointwise2"}
        if block.pointwise1 is not None:
            assert _kinds(block.pointwise1) == conv_bn_relu6
            in_order.append(block.pointwise1[0])
        assert _kinds(block.depthwise) == conv_bn_relu6 and _kinds(block.pointwise2) == conv_bn
        assert block.depthwise[0].groups == block.depthwise[0].in_channels
        in_order += [block.depthwise[0], block.pointwise2[0]]
    assert [c[0] for c in _convs_as_called(model, et.models.example_input(name))] == in_order


@pytest.mark.parametrize("name", MCU)
def test_mcu_architecture_matches_the_papers_int8_file(name):
    path = ttf.ASSETS / f"{name}.pkl"
    if not path.exists():
        pytest.skip(f"{path} is absent (the paper's int8 models live in ../shared/assets/tiny-training)")
    d = ttf.load(name)
    model = et.models.get(name, num_classes=1000)
    ours = [c[1:] for c in _convs_as_called(model, et.models.example_input(name))]
    theirs = [(c["params"]["weight"].shape, c["stride"], c["groups"], c["in_shape"], c["out_shape"])
              for c in ttf.convs_in_order(d)]
    assert ours == theirs
    assert [b.residual for b in model.blocks] == [blk["residual"] is not None for blk in d["blocks"]]
    assert model.classifier.weight.shape == d["classifier"]["params"]["weight"].shape[:2]


def test_int8_file_reader_refuses_anything_but_numpy_arrays():
    with pytest.raises(pickle.UnpicklingError, match="collections.OrderedDict is not allowed"):
        ttf._Restricted(io.BytesIO(pickle.dumps(collections.OrderedDict()))).load()
