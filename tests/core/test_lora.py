"""et.LoRA: adapters added in the IR train exactly as peft's do.

Each tiny decoder (transformers' Llama, Qwen2, Phi-3, GPT-NeoX; random init) is compiled with
update=et.LoRA(...), and the same peft model (get_peft_model with the same rank, alpha and
targets) is loaded with the program's adapters through `prog.state_dict` (B set non-zero first,
so every adapter has a gradient): gradients, three SGD steps' losses and the logits after them
equal torch's; the base weights never change; the merged weights reproduce the logits in the
plain model. A conv net checks the conv adapters (2-d and 1-d) the same way.
"""
from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tests.realmodels.conftest as rm  # torchvision's schemas first: transformers and peft import it
import edgetrain as et
from edgetrain.ir import Role
from edgetrain.ops import verify
from edgetrain.trainable import LoRAError
from tests.helpers import assert_close_to_largest

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
VOCAB, T, N = 100, 8, 2
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)
DECODERS = {
    "llama": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=1, **SMALL)),
              ("q_proj", "v_proj")),
    "qwen2": (lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=1, **SMALL)),
              ("q_proj", "v_proj")),
    "phi3": (lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(num_key_value_heads=1, pad_token_id=0,
                                                                          **SMALL)), ("qkv_proj",)),
    "gpt_neox": (lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL)),
                 ("query_key_value",)),
}
RANK, ALPHA, LR = 4, 8, 0.5
#: agreement with torch, relative to the largest value compared (float64: transformers' RMSNorm computes
#: in float32 whatever the model's dtype, so float64 agrees to about 3e-7 on these models)
TOL = {torch.float32: 2e-5, torch.float64: 1e-6}


def _decoder(name: str, dtype=torch.float32):
    torch.manual_seed(0)
    build, targets = DECODERS[name]
    return build().to(dtype).eval(), targets


def _data(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (N, T), generator=g), torch.randint(0, VOCAB, (N, T), generator=g)


def _randomize_b(prog, seed=2):
    """B drawn at random (peft's init leaves it zero, and A's gradient with it)."""
    rng = np.random.default_rng(seed)
    prog.load_state({k: (0.1 * rng.standard_normal(v.shape)).astype(v.dtype)
                     for k, v in prog.state.items() if k.endswith(".lora_B.weight")})


def _peft_twin(hf_model, prog, targets, prefix="m."):
    """The peft model of `hf_model` (a copy) with the program's adapters loaded from its state_dict."""
    cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(targets), lora_dropout=0.0)
    twin = peft.get_peft_model(copy.deepcopy(hf_model), cfg)
    res = peft.set_peft_model_state_dict(twin, prog.state_dict(prefix=prefix))
    assert not [k for k in res.missing_keys if "lora_" in k] and not res.unexpected_keys
    return twin


def _torch_grads(twin, x, y, logits_of):
    twin.zero_grad()
    logits = logits_of(twin(x))
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    return loss.item(), {n.replace(".default", ""): p.grad.numpy().copy()
                         for n, p in twin.named_parameters() if p.requires_grad}


def _prog_name(peft_name: str, prefix="m.") -> str:
    return prefix + peft_name[len("base_model.model."):]


def _check_against_peft(prog, hf_model, targets, x, y, dtype, logits_of=lambda out: out.logits):
    tol = TOL[dtype]
    twin = _peft_twin(hf_model, prog, targets)
    initial = {k: v.copy() for k, v in prog.state.items() if k not in prog.trainable}
    _, want = _torch_grads(twin, x, y, logits_of)
    got = prog.gradients(x.numpy(), y.numpy())
    assert sorted(_prog_name(k) for k in want) == sorted(got), "the program trains exactly peft's adapters"
    for k, g in want.items():
        assert_close_to_largest(got[_prog_name(k)], g, tol, k)
    opt = torch.optim.SGD([p for p in twin.parameters() if p.requires_grad], lr=LR)
    for _ in range(3):
        want_loss, _ = _torch_grads(twin, x, y, logits_of)
        opt.step()
        assert_close_to_largest(prog.step(x.numpy(), y.numpy()), want_loss, tol, "loss")
    with torch.no_grad():
        assert_close_to_largest(prog.predict(x.numpy()), logits_of(twin(x)).numpy(), tol, "logits after 3 steps")
    assert all(np.array_equal(prog.state[k], v) for k, v in initial.items()), "a base weight changed"
    return twin


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_lora_trains_as_peft(name):
    hf, targets = _decoder(name)
    x, y = _data()
    prog = et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy",
                      update=et.LoRA(rank=RANK, alpha=ALPHA, targets=targets), optimizer=et.SGD(lr=LR))
    adapted = [n[:-len(".lora_A.weight")] for n in prog.trainable if n.endswith(".lora_A.weight")]
    assert len(adapted) == 2 * len(targets) and all(any(a.endswith("." + t) for t in targets) for a in adapted)
    assert all(prog.stages["adapters_added"].role(prog.stages["adapters_added"].input(n)) == Role.PARAMETER
               for n in prog.trainable)
    _randomize_b(prog)
    _check_against_peft(prog, hf, targets, x, y, torch.float32)
    # the merged weights in the plain model give the program's logits
    plain = rm.Logits(copy.deepcopy(hf))
    plain.load_state_dict(prog.merged_state_dict())
    with torch.no_grad():
        assert_close_to_largest(plain(x).numpy(), prog.predict(x.numpy()), 1e-5, "merged model's logits")


def test_float64_llama_and_the_initial_adapters():
    hf, targets = _decoder("llama", torch.float64)
    x, y = _data()
    scheme = et.LoRA(rank=RANK, alpha=ALPHA, targets=targets)
    prog = et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy", update=scheme, optimizer=et.SGD(lr=LR))
    a = prog.state["m.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert a.dtype == np.float64 and a.shape == (RANK, 32)
    assert 0 < np.abs(a).max() <= 1 / np.sqrt(32), "A: uniform in +-1/sqrt(fan_in), as peft's kaiming init"
    assert not np.abs(prog.state["m.model.layers.0.self_attn.q_proj.lora_B.weight"]).any(), "B starts at zero"
    # deterministic from the seed: a second compile draws the same adapters, another seed others
    again = et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy", update=scheme, optimizer=et.SGD(lr=LR))
    other = et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy", update=scheme,
                       optimizer=et.SGD(lr=LR, seed=7))
    assert all(np.array_equal(prog.state[k], again.state[k]) for k in prog.trainable)
    assert not np.array_equal(a, other.state["m.model.layers.0.self_attn.q_proj.lora_A.weight"])
    # B = 0: the model computes exactly what the base computes
    base = et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy", update=et.Full())
    assert np.array_equal(prog.predict(x.numpy()), base.predict(x.numpy()))
    _randomize_b(prog)
    _check_against_peft(prog, hf, targets, x, y, torch.float64)


def test_peft_model_loads_the_saved_adapters(tmp_path):
    """An adapter directory (adapter_config.json + adapter_model.safetensors of prog.state_dict)
    is what PeftModel.from_pretrained reads."""
    from safetensors.torch import save_file

    hf, targets = _decoder("llama")
    x, y = _data()
    prog = et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy",
                      update=et.LoRA(rank=RANK, alpha=ALPHA, targets=targets), optimizer=et.SGD(lr=LR))
    _randomize_b(prog)
    prog.step(x.numpy(), y.numpy())
    peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(targets)).save_pretrained(tmp_path)
    sd = prog.state_dict(prefix="m.")
    assert all(k.startswith("base_model.model.model.layers.") for k in sd)
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "adapter_model.safetensors")
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(hf), tmp_path).eval()
    with torch.no_grad():
        assert_close_to_largest(loaded(x).logits.numpy(), prog.predict(x.numpy()), 1e-5, "PeftModel's logits")
    # without the prefix, the keys keep the wrapper's attribute
    assert all(k.startswith("base_model.model.m.model.") for k in prog.state_dict())
    with pytest.raises(LoRAError, match="does not start with"):
        prog.state_dict(prefix="model.")


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_decoder_lora_on_the_c_backend():
    from edgetrain.backends.c.host import to_c_program
    from edgetrain.backends.capabilities import check_program
    from tests.realmodels.test_c_backend import TEST_CFLAGS

    hf, targets = _decoder("llama")
    x, y = _data()
    prog = et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy",
                      update=et.LoRA(rank=RANK, alpha=ALPHA, targets=targets), optimizer=et.SGD(lr=LR))
    _randomize_b(prog)
    check_program(prog, "c")  # as et.compile(..., backend="c") does: every op has a C kernel
    c = to_c_program(prog, TEST_CFLAGS)
    ref = prog.gradients(x.numpy(), y.numpy())
    got = c.gradients(x.numpy(), y.numpy())
    for k in ref:
        assert_close_to_largest(got[k], ref[k], 1e-5, k)
    _check_against_peft(c, hf, targets, x, y, torch.float32)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1))


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(3, 6, 3, stride=2, padding=1)
        self.head = nn.Linear(6 * 8, 5)

    def forward(self, x):
        return self.head(torch.relu(self.c1(x)).flatten(1))


@pytest.mark.parametrize("net, shape, targets", [
    (ConvNet, (2, 3, 8, 8), ("conv1", "conv2")),
    (Conv1dNet, (2, 3, 16), ("c1",)),
], ids=["conv2d", "conv1d"])
def test_conv_lora_trains_as_peft(net, shape, targets):
    torch.manual_seed(0)
    model = net().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([1, 3])
    prog = et.compile(model, (x,), loss="cross_entropy", update=et.LoRA(rank=RANK, alpha=ALPHA, targets=targets),
                      optimizer=et.SGD(lr=LR))
    _randomize_b(prog)
    twin = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=RANK, lora_alpha=ALPHA,
                                                                     target_modules=list(targets)))
    peft.set_peft_model_state_dict(twin, prog.state_dict())
    got = prog.gradients(x.numpy(), y.numpy())
    twin.zero_grad()
    F.cross_entropy(twin(x), y).backward()
    want = {_prog_name(n.replace(".default", ""), ""): p.grad.numpy() for n, p in twin.named_parameters()
            if p.requires_grad}
    assert sorted(want) == sorted(got)
    for k in want:
        assert_close_to_largest(got[k], want[k], 2e-5, k)
    prog.step(x.numpy(), y.numpy())
    twin_step = torch.optim.SGD([p for p in twin.parameters() if p.requires_grad], lr=LR)
    twin_step.step()
    with torch.no_grad():
        assert_close_to_largest(prog.predict(x.numpy()), twin(x).numpy(), 2e-5, "outputs after a step")
        merged = copy.deepcopy(twin).merge_and_unload()
        plain = net()
        plain.load_state_dict(prog.merged_state_dict())
        assert_close_to_largest(plain(x).numpy(), prog.predict(x.numpy()), 2e-5, "merged")
        for k, v in merged.state_dict().items():
            assert_close_to_largest(prog.merged_state_dict()[k].numpy(), v.numpy(), 1e-6, f"merged {k}")


# --- refusals and the other schemes --------------------------------------------------------------
def test_no_target_matched_names_the_layers():
    hf, _ = _decoder("llama")
    x, _ = _data()
    with pytest.raises(LoRAError, match=r"matched no linear or conv layer.*'q_proj'.*'down_proj'"):
        et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy", update=et.LoRA(targets=("query",)))


def test_bad_schemes_are_refused():
    with pytest.raises(LoRAError, match="rank >= 1"):
        et.LoRA(rank=0)
    with pytest.raises(LoRAError, match="dropout"):
        et.LoRA(dropout=1.0)
    with pytest.raises(LoRAError, match="dropout=0.1.*not supported"):
        et.compile(ConvNet().eval(), (torch.randn(2, 3, 8, 8),), update=et.LoRA(targets=("fc",), dropout=0.1))


class Shared(nn.Module):
    """One linear applied twice: an adapter on it would be on both uses."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.dil = nn.Conv2d(2, 2, 3, dilation=2, padding=2)

    def forward(self, x):
        return self.proj(self.proj(self.dil(x).flatten(2)))


def test_shared_and_dilated_layers_are_refused():
    x = torch.randn(2, 2, 2, 2)
    with pytest.raises(LoRAError, match="shared by 2 nodes"):
        et.compile(Shared().eval(), (x,), loss="mse", update=et.LoRA(targets=("proj",)))
    with pytest.raises(LoRAError, match="dilat"):
        et.compile(Shared().eval(), (x,), loss="mse", update=et.LoRA(targets=("dil",)))


def test_a_peft_model_trains_its_own_adapters_and_refuses_lora():
    hf, targets = _decoder("llama")
    x, _ = _data()
    model = rm.Logits(peft.get_peft_model(hf, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["q_proj"])))
    prog = et.compile(model, (x,), loss="sequence_cross_entropy", update=et.Full())
    assert sorted(prog.trainable) == sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert all(".lora_" in n for n in prog.trainable) and len(prog.trainable) == 4
    assert prog.merged_state_dict().keys() == prog.state_dict().keys()
    with pytest.raises(ValueError, match="trains no adapters"):
        prog.state_dict(prefix="m.")
    with pytest.raises(LoRAError, match=r"adapters already.*update=et.Full\(\)"):
        et.compile(model, (x,), loss="sequence_cross_entropy", update=et.LoRA(targets=("v_proj",)))


def test_the_pass_is_pure_and_verifies():
    """add_adapters leaves its input graph as it was and gives a graph the verifier accepts, the
    adapters as parameter inputs and every later use of an adapted output reading the sum."""
    from edgetrain.frontend import capture
    from edgetrain.trainable import add_adapters

    torch.manual_seed(0)
    cap = capture(ConvNet().eval(), (torch.randn(2, 3, 8, 8),))
    g, state = cap.graph, {**cap.params, **cap.buffers}
    before = str(g)
    g2, state2, names = add_adapters(g, state, et.LoRA(rank=2, targets=("conv2", "fc")), seed=3)
    assert str(g) == before and set(state) < set(state2)
    verify(g2)
    assert names == ("conv2.lora_A.weight", "conv2.lora_B.weight", "fc.lora_A.weight", "fc.lora_B.weight")
    assert [g2.role(g2.input(n)) for n in names] == [Role.PARAMETER] * 4
    assert state2["fc.lora_A.weight"].shape == (2, 64) and state2["conv2.lora_B.weight"].shape == (4, 2, 1, 1)
    assert g2.outputs[0] is not g.outputs[0]  # the fc's adapted output is the model's


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_conv_lora_on_the_c_backend():
    from edgetrain.backends.c.host import to_c_program
    from edgetrain.backends.capabilities import check_program
    from tests.realmodels.test_c_backend import TEST_CFLAGS

    torch.manual_seed(0)
    x, y = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)), np.array([1, 3])
    prog = et.compile(ConvNet().eval(), (x,), update=et.LoRA(rank=RANK, alpha=ALPHA, targets=("conv1", "fc")),
                      optimizer=et.SGD(lr=LR))
    _randomize_b(prog)
    check_program(prog, "c")  # as et.compile(..., backend="c") does: every op has a C kernel
    c = to_c_program(prog, TEST_CFLAGS)
    ref, got = prog.gradients(x.numpy(), y), c.gradients(x.numpy(), y)
    assert sorted(got) == sorted(ref) == sorted(prog.trainable)
    for k in ref:
        assert_close_to_largest(got[k], ref[k], 1e-5, k)
    assert_close_to_largest(c.step(x.numpy(), y), prog.step(x.numpy(), y), 1e-6, "loss")
    assert_close_to_largest(c.predict(x.numpy()), prog.predict(x.numpy()), 1e-5, "outputs after a step")


def test_a_tied_lm_head_takes_no_adapter():
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=1, tie_word_embeddings=True,
                                                                **SMALL)).eval()
    x, _ = _data()
    with pytest.raises(LoRAError, match=r"matched no linear.*1 linear / conv node\(s\) read a weight .* tied"):
        et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy", update=et.LoRA(targets=("lm_head",)))
    with pytest.raises(LoRAError, match="shared by 2 nodes"):
        et.compile(rm.Logits(hf), (x,), loss="sequence_cross_entropy", update=et.LoRA(targets=("embed_tokens",)))
