"""Language-model training (issue 32): Hugging Face causal LMs compiled as they are (their
ModelOutput's logits, use_cache off) with loss="causal_lm", the head and its loss fused into
linear[_qw]_cross_entropy (passes/lm_head.py: the vocabulary in chunks, the (T, V) logits never
whole), against the models' own `labels=` loss and torch.autograd; predict's full logits; the C
backend against the reference; the memory the fusion saves; attention masks with padding."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn

import tests.realmodels.conftest as _  # noqa: F401  (torchvision's schemas first: transformers imports it)
import edgetrain as et
from edgetrain import pipeline
from edgetrain.backends.c.graph_lib import build_graph_library
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import OPS, Emitter, verify
from edgetrain.ops.qweights import quantize_weight
from edgetrain.passes import lm_head
from edgetrain.passes.lm_head import chunk_lm_head, chunk_rows
from tests.helpers import assert_close_to_largest

transformers = pytest.importorskip("transformers")

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
VOCAB, T, N = 300, 8, 2
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)
DECODERS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=1, **SMALL)),
    "qwen2_tied": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=1,
                                                                                 tie_word_embeddings=True, **SMALL)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(num_key_value_heads=1, pad_token_id=0,
                                                                         **SMALL)),
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL)),
}
#: float64 agreement with torch relative to the largest value: transformers computes RMSNorm and the
#: rotary embeddings' cos / sin in float32 whatever the model's dtype (3e-7 of the largest gradient
#: on these models); test_fused_equals_unfused_in_float64 checks the fused head itself to 1e-12
TOL64 = 1e-6
#: vocabulary rows per chunk in these tests (passes/lm_head.CHUNK_BYTES made small): 300 = 4 x 64 + 44
CHUNK = 64


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of CHUNK vocabulary rows, so that every test runs several, the last one partial."""
    monkeypatch.setattr(lm_head, "CHUNK_BYTES", 1)
    assert chunk_rows(N * (T - 1), VOCAB, 8, lm_head.CHUNK_BYTES) == CHUNK


def _decoder(name: str, dtype=torch.float64):
    torch.manual_seed(0)
    return DECODERS[name]().to(dtype).eval()


def _batch(padded: bool = True):
    """ids, labels (= ids, the first sequence's first 3 positions ignored: left padding) and the
    attention mask of that padding."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (N, T), generator=g)
    labels, mask = ids.clone(), torch.ones(N, T, dtype=torch.int64)
    if padded:
        labels[0, :3] = -100
        mask[0, :3] = 0
    return ids, labels, mask


def _fused(prog) -> list:
    """The fused head nodes of `prog`'s training step before autodiff (none when lm_head_chunked
    did not run)."""
    return [n for n in prog.stages.get("lm_head_chunked", prog.stages["with_loss"]).nodes
            if n.op in ("linear_cross_entropy", "linear_qw_cross_entropy")]


def _unfused(monkeypatch):
    """Compile without the lm_head_chunked step (the plain linear + cross entropy)."""
    monkeypatch.setattr(pipeline, "STEPS", tuple(
        pipeline.Step(s.name, s.phases, s.run, lambda o: False) if s.name == "lm_head_chunked" else s
        for s in pipeline.STEPS))


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_loss_and_gradients_equal_hugging_face(name):
    """The Hugging Face model itself (its output a CausalLMOutputWithPast), every parameter trained:
    the loss is the model's own labels= loss, every gradient torch.autograd's, the tied embedding +
    head (qwen2_tied) one tensor whose gradient adds both uses."""
    lm = _decoder(name)
    ids, labels, _ = _batch()
    prog = et.compile(lm, (ids,), loss="causal_lm", update=et.Full())
    (node,) = _fused(prog)
    assert node.attrs["chunk"] == CHUNK and math.ceil(VOCAB / CHUNK) > 1
    out = lm(ids, labels=labels)
    out.loss.backward()
    grads = prog.gradients(ids.numpy(), labels.numpy())
    by_name = dict(lm.named_parameters())
    assert grads.keys() == by_name.keys()
    tol = TOL64
    for k, g in grads.items():
        assert_close_to_largest(g, by_name[k].grad, tol, k)
    assert prog.step(ids.numpy(), labels.numpy()) == pytest.approx(float(out.loss), rel=tol)


@pytest.mark.parametrize("name", ["llama", "gpt_neox"])
def test_float32_loss_and_gradients(name):
    lm = _decoder(name, torch.float32)
    ids, labels, _ = _batch()
    prog = et.compile(lm, (ids,), loss="causal_lm", update=et.Full())
    out = lm(ids, labels=labels)
    out.loss.backward()
    by_name = dict(lm.named_parameters())
    for k, g in prog.gradients(ids.numpy(), labels.numpy()).items():
        assert_close_to_largest(g, by_name[k].grad, 1e-4, k)
    assert prog.step(ids.numpy(), labels.numpy()) == pytest.approx(float(out.loss), rel=1e-5)


def test_fused_equals_unfused_in_float64(monkeypatch):
    """The chunked head computes what linear + cross entropy compute, to float64 rounding."""
    lm = _decoder("llama")
    ids, labels, _ = _batch()
    fused = et.compile(lm, (ids,), loss="causal_lm", update=et.Full())
    _unfused(monkeypatch)
    plain = et.compile(lm, (ids,), loss="causal_lm", update=et.Full())
    assert not _fused(plain)
    got, want = fused.gradients(ids.numpy(), labels.numpy()), plain.gradients(ids.numpy(), labels.numpy())
    for k in want:
        assert_close_to_largest(got[k], want[k], 1e-12, k)
    assert fused.step(ids.numpy(), labels.numpy()) == pytest.approx(plain.step(ids.numpy(), labels.numpy()), rel=1e-14)


def test_predict_returns_the_logits_of_every_position():
    lm = _decoder("qwen2_tied", torch.float32)
    ids, _, _ = _batch()
    prog = et.compile(lm, (ids,), loss="causal_lm")
    logits = prog.predict(ids.numpy())
    assert logits.shape == (N, T, VOCAB)
    assert_close_to_largest(logits, lm(ids).logits.detach(), 1e-5)


@pytest.mark.parametrize("name", ["llama", "gpt_neox"])
def test_attention_mask_with_padding_equals_hugging_face(name):
    """(input_ids, attention_mask) as the model's two inputs, the padding labelled -100: loss,
    gradients and the logits of every position equal the model's own with the same mask. The
    left-padded queries attend to no key: torch's SDPA gives them zeros, and so does edgetrain."""
    lm = _decoder(name)
    ids, labels, mask = _batch()
    prog = et.compile(lm, (ids, mask), loss="causal_lm", update=et.Full())
    out = lm(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    by_name = dict(lm.named_parameters())
    tol = TOL64
    for k, g in prog.gradients((ids.numpy(), mask.numpy()), labels.numpy()).items():
        assert_close_to_largest(g, by_name[k].grad, tol, k)
    assert_close_to_largest(prog.predict((ids.numpy(), mask.numpy())), out.logits.detach(), tol, "logits")
    assert prog.step((ids.numpy(), mask.numpy()), labels.numpy()) == pytest.approx(float(out.loss), rel=tol)


@pytest.mark.skipif(not HAS_CC, reason="no host C compiler")
def test_attention_mask_on_the_c_backend():
    """float32, LoRA, a left-padded batch: the C program's losses and logits are the reference's."""
    ids, labels, mask = _batch()
    progs = [et.compile(_decoder("llama", torch.float32), (ids, mask), loss="causal_lm", update=et.LoRA(rank=4),
                        optimizer=et.SGD(lr=0.5), backend=b) for b in ("reference", "c")]
    x = (ids.numpy(), mask.numpy())
    np.testing.assert_allclose(progs[1].predict(x), progs[0].predict(x), rtol=1e-5, atol=1e-5)
    losses = [[p.step(x, labels.numpy()) for p in progs] for _ in range(3)]
    np.testing.assert_allclose(*zip(*losses), rtol=1e-5)
    assert losses[-1][0] < losses[0][0]


def test_a_mask_that_changes_nothing_changes_nothing():
    """An all-ones attention mask gives the unmasked model's loss (the mask path is exact)."""
    ids, labels, _ = _batch(padded=False)
    lm = _decoder("llama")
    masked = et.compile(lm, (ids, torch.ones_like(ids)), loss="causal_lm")
    plain = et.compile(lm, (ids,), loss="causal_lm")
    assert masked.step((ids.numpy(), np.ones_like(ids.numpy())), labels.numpy()) == pytest.approx(
        plain.step(ids.numpy(), labels.numpy()), rel=1e-12)


class BiasHead(nn.Module):
    """Embedding, a tanh layer and a vocabulary head with a bias; (N, T, V) logits."""

    def __init__(self, vocab=VOCAB, hidden=16):
        super().__init__()
        self.emb, self.mid, self.head = nn.Embedding(vocab, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def test_sequence_cross_entropy_with_a_biased_head_against_autograd():
    torch.manual_seed(0)
    model = BiasHead().double()
    ids, labels, _ = _batch()
    prog = et.compile(model, (ids,), loss="sequence_cross_entropy", update=et.Full())
    (node,) = _fused(prog)
    assert len(node.inputs) == 4  # h, label, w, bias
    loss = nn.functional.cross_entropy(model(ids).reshape(-1, VOCAB), labels.reshape(-1))
    loss.backward()
    by_name = dict(model.named_parameters())
    for k, g in prog.gradients(ids.numpy(), labels.numpy()).items():
        assert_close_to_largest(g, by_name[k].grad, 1e-10, k)


@pytest.mark.parametrize("frozen", [None, "int4"])
def test_the_loss_comes_from_the_gradient_node(frozen, monkeypatch):
    """After autodiff the forward loss node is folded into its gradient node (with_loss): the
    training step holds no forward head op, sweeps the logits twice, and its losses are those of
    the step without the fold (float64: the fold rounds nothing)."""
    ids, labels, _ = _batch()
    lm = _decoder("llama")
    update = et.LoRA(rank=4) if frozen else et.Full()
    prog = et.compile(lm, (ids,), loss="causal_lm", update=update, frozen=frozen, optimizer=et.SGD(lr=0.5))
    ops = [n.op for n in prog.train_graph.nodes]
    assert not {"linear_cross_entropy", "linear_qw_cross_entropy"} & set(ops)
    (grad,) = [n for n in prog.train_graph.nodes if n.op.endswith("cross_entropy_grad")]
    assert grad.attrs["with_loss"] and grad.outputs[-1].type.shape == ()
    assert prog.train_graph.outputs[0] is grad.outputs[-1]
    monkeypatch.setattr(pipeline, "STEPS", tuple(s for s in pipeline.STEPS if s.name != "lm_loss_in_backward"))
    plain = et.compile(lm, (ids,), loss="causal_lm", update=update, frozen=frozen, optimizer=et.SGD(lr=0.5))
    assert any(n.op.startswith("linear") and n.op.endswith("cross_entropy") for n in plain.train_graph.nodes)
    for _ in range(3):
        assert prog.step(ids.numpy(), labels.numpy()) == pytest.approx(plain.step(ids.numpy(), labels.numpy()),
                                                                        rel=1e-12)


def test_the_fold_needs_the_loss_unread_before_the_gradient():
    """A graph where a node before the gradient node reads the loss keeps its forward node."""
    ids, _, _ = _batch()
    prog = et.compile(_decoder("llama"), (ids,), loss="causal_lm", update=et.Full())
    g = prog.stages["fused_bn_activations"]
    (fwd,) = [n for n in g.nodes if n.op == "linear_cross_entropy"]
    assert lm_head.loss_in_backward(g) is not g
    e = Emitter()
    early = e.emit("mul", fwd.out, e.const(2.0, fwd.out.dtype))
    at = g.nodes.index(fwd) + 1
    g2 = g.replace(nodes=g.nodes[:at] + tuple(e.nodes) + g.nodes[at:], outputs=g.outputs + (early,),
                   output_names=g.output_names + ("early",))
    assert lm_head.loss_in_backward(g2) is g2


def test_no_pattern_leaves_the_graph_as_it_is():
    """A head whose logits feed something else before the loss is not fused."""
    class Scaled(BiasHead):
        def forward(self, ids):
            return super().forward(ids) * 2.0

    prog = et.compile(Scaled(), (_batch()[0],), loss="sequence_cross_entropy")
    assert not _fused(prog)
    g = prog.stages["with_loss"]
    assert chunk_lm_head(g) is g


def test_a_quantized_head_is_fused_and_trains_lora_on_it():
    """frozen="int4" with LoRA: the head is read from its 4-bit form by linear_qw_cross_entropy."""
    lm = _decoder("llama", torch.float32)
    ids, labels, _ = _batch()
    prog = et.compile(lm, (ids,), loss="causal_lm", update=et.LoRA(rank=4), frozen="int4", optimizer=et.SGD(lr=0.5))
    (node,) = _fused(prog)
    assert node.op == "linear_qw_cross_entropy" and node.attrs["bits"] == 4
    losses = [prog.step(ids.numpy(), labels.numpy()) for _ in range(3)]
    assert losses[-1] < losses[0]


@pytest.mark.skipif(not HAS_CC, reason="no host C compiler")
@pytest.mark.parametrize("frozen", [None, "int8"])
def test_c_backend_equals_the_reference(frozen):
    """float32, three SGD steps of the whole model (frozen=None) or of LoRA on an int8 base: the
    C program's losses are the reference's."""
    ids, labels, _ = _batch()
    update = et.Full() if frozen is None else et.LoRA(rank=4)
    progs = [et.compile(_decoder("llama", torch.float32), (ids,), loss="causal_lm", update=update, frozen=frozen,
                        optimizer=et.SGD(lr=0.5), backend=b) for b in ("reference", "c")]
    assert all(_fused(p) for p in progs)
    losses = [[p.step(ids.numpy(), labels.numpy()) for p in progs] for _ in range(3)]
    np.testing.assert_allclose(*zip(*losses), rtol=1e-5)
    assert losses[-1][0] < losses[0][0]


def test_the_memory_plan_holds_no_whole_logits(monkeypatch):
    """Vocabulary 4096, hidden 64, T 64, LoRA: the (T, V) float32 logits and their gradient (1 MiB
    each) are gone from the step's peak; the chunk's logits (the grad op's scratch) are counted."""
    monkeypatch.setattr(lm_head, "CHUNK_BYTES", 256 * 1024)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 4096, (1, 64))
    fused = et.compile(lm, (ids,), loss="causal_lm", update=et.LoRA(rank=4))
    (node,) = _fused(fused)
    assert node.attrs["chunk"] == 1024
    grad = next(n for n in fused.train_graph.nodes if n.op == "linear_cross_entropy_grad")
    assert grad.outputs[-3].type.nbytes == 63 * 1024 * 4  # the chunk's logits, in the plan (then stats, loss)
    logits_and_grad = 2 * 64 * 4096 * 4
    _unfused(monkeypatch)
    plain = et.compile(lm, (ids,), loss="causal_lm", update=et.LoRA(rank=4))
    assert fused.memory.peak_bytes < logits_and_grad
    assert plain.memory.peak_bytes - fused.memory.peak_bytes > 0.75 * logits_and_grad
    assert fused.step(ids.numpy(), ids.numpy()) == pytest.approx(plain.step(ids.numpy(), ids.numpy()), rel=1e-5)


@pytest.mark.skipif(not HAS_CC, reason="no host C compiler")
def test_float64_kernels_match_the_reference():
    """The _d instances of runtime/et_float_lmloss.h (C programs are float32; a graph library runs
    float64 nodes): loss and gradients of both ops, with a bias, ignored labels, 3 chunks, in two
    sweeps and in one (dh alone), and the loss the gradient node gives with with_loss."""
    rng = np.random.default_rng(0)
    rows, hid, vocab = 6, 40, 21
    h, w, b = rng.normal(size=(rows, hid)), rng.normal(size=(vocab, hid)), rng.normal(size=vocab)
    label = rng.integers(0, vocab, size=rows)
    label[2] = -100
    wq, scale = quantize_weight(w, 4)
    cases = [("linear_cross_entropy", [h, label, w, b], {}, ("h", "w", "bias")),
             ("linear_qw_cross_entropy", [h, label, wq, scale, b], {"bits": 4, "in_features": hid}, ("h", "bias")),
             ("linear_cross_entropy", [h, label, w], {}, ("h",)),  # one sweep (a frozen head)
             ("linear_qw_cross_entropy", [h, label, wq, scale, b], {"bits": 4, "in_features": hid}, ("h",))]
    for op, arrays, extra, wants in cases:
        attrs = {"chunk": 8, "ignore_index": -100, **extra}
        ins = tuple(new_value(TensorType(a.shape, str(a.dtype)), f"a{i}") for i, a in enumerate(arrays))
        g0 = new_value(TensorType((), "float64"), "g")
        e = Emitter()
        loss = e.emit(op, *ins, **attrs)
        grads = e.emit_multi(op + "_grad", g0, *ins, wants=wants, **attrs)
        folded = e.emit_multi(op + "_grad", g0, *ins, wants=wants, with_loss=True, **attrs)
        outs = (loss,) + grads[:len(wants)] + (folded[-1],)
        graph = verify(Graph(ins + (g0,), tuple(e.nodes), outs, tuple(f"y{i}" for i in range(len(outs)))))
        feeds = list(arrays) + [np.asarray(0.7)]
        got = build_graph_library(graph)(feeds)
        want = OPS[op].ref(arrays, attrs) + OPS[op + "_grad"].ref([np.asarray(0.7)] + arrays,
                                                                    {**attrs, "wants": wants})[:len(wants)]
        want += OPS[op].ref(arrays, attrs)  # the folded loss: the forward op's
        for gv, wv in zip(got, want):
            assert_close_to_largest(gv, wv, 1e-12, op)


def test_one_sweep_equals_two_sweeps_in_float64():
    """dh alone (one sweep, online rescaling) equals dh computed beside dw (two sweeps), and both
    give the forward op's loss with with_loss."""
    rng = np.random.default_rng(3)
    rows, hid, vocab = 7, 12, 29
    h, w = rng.normal(size=(rows, hid)) * 3, rng.normal(size=(vocab, hid))
    label = rng.integers(0, vocab, size=rows)
    label[4] = -100
    attrs = {"chunk": 5, "ignore_index": -100}
    g = np.asarray(1.3)
    one = OPS["linear_cross_entropy_grad"].ref([g, h, label, w], {**attrs, "wants": ("h",), "with_loss": True})
    two = OPS["linear_cross_entropy_grad"].ref([g, h, label, w], {**attrs, "wants": ("h", "w"), "with_loss": True})
    assert_close_to_largest(one[0], two[0], 1e-12, "dh")
    assert not one[0][4].any()  # the ignored row
    (loss,) = OPS["linear_cross_entropy"].ref([h, label, w], attrs)
    assert float(one[-1]) == pytest.approx(float(loss), rel=1e-13) and float(two[-1]) == pytest.approx(float(loss),
                                                                                                      rel=1e-13)
