"""frozen="int8" / "int4": frozen linear and embedding weights stored quantized, dequantized inside
the kernels (ops/qweights.py, quantize/frozen.py, runtime/et_float_qweights.h).

The layout (packing order, rounding half to even, the -8 nibble, groups of 32); the C kernels on
every byte value, float32 (with and without the BLAS) and float64, against the reference; then
programs: an MLP and a tiny Llama (untied and tied head) with frozen weights, and a peft LoRA
model, whose gradients, losses and outputs equal torch.autograd's on `dequantized(...)`, on the
reference and the C backend; state_dict gives float weights under the original keys; the frozen
bytes shrink by the layout's ratio; and the errors.
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
from edgetrain.ir import Graph, Role, TensorType, new_value
from edgetrain.ops import Emitter, OPS, verify
from edgetrain.ops.qweights import GROUP, dequantize, pack_int4, quantize_weight, scale_shape, unpack_int4
from edgetrain.quantize import dequantized, quantize_frozen

try:
    import transformers
except ImportError:  # the language-model tests skip
    transformers = None
try:
    import peft
except ImportError:
    peft = None

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler")
needs_hf = pytest.mark.skipif(transformers is None, reason="transformers is not installed")
needs_peft = pytest.mark.skipif(transformers is None or peft is None, reason="peft is not installed")
BACKENDS = ["reference", pytest.param("c", marks=needs_cc)]
#: float32 agreement with torch.autograd on the dequantized model, relative to the largest value compared
TOL = 1e-5


def _close(got, want, what="", tol=TOL):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, what
    err = np.abs(got - want).max(initial=0)
    top = np.abs(want).max(initial=0)
    assert err <= tol * max(top, 1e-6), f"{what}: max error {err:.3g} of {top:.3g}"


# --- the layout ---------------------------------------------------------------------------------
def test_int8_rows_round_half_to_even_on_their_own_scale():
    w = np.array([[127.0, 2.5, 3.5, -2.5, -0.5], [0, 0, 0, 0, 0], [-1.0, 0.25, 0, 0, 0]], dtype=np.float32)
    q, s = quantize_weight(w, 8)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (3,)
    np.testing.assert_array_equal(s, [1.0, 1.0, np.float32(1 / 127)])  # an all-zero row: scale 1
    np.testing.assert_array_equal(q[0], [127, 2, 4, -2, 0])  # 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -0.5 -> 0
    np.testing.assert_array_equal(q[1], 0)
    assert q[2, 0] == -127 and q[2, 1] == round(0.25 * 127)
    np.testing.assert_array_equal(dequantize(q, s, 8, 5), q.astype(np.float32) * s[:, None])


def test_int4_packs_two_nibbles_low_first_in_groups_of_32():
    q = np.array([[1, -2, 3], [-8, 7, -1]], dtype=np.int8)
    packed = pack_int4(q)
    assert packed.shape == (2, 2) and packed.dtype == np.int8
    assert list(packed.view(np.uint8)[0]) == [0xE1, 0x03]  # element 0 low nibble, 1 high, 2 low (high: padding)
    assert list(packed.view(np.uint8)[1]) == [0x78, 0x0F]  # -8 is nibble 0x8, -1 is 0xF
    np.testing.assert_array_equal(unpack_int4(packed, 3), q)
    # groups: 37 inputs = one group of 32 and one of 5, each with its own scale max|w| / 7
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 37)).astype(np.float32)
    w[1, 32:] = 0  # an all-zero group: scale 1
    qw, s = quantize_weight(w, 4)
    assert qw.shape == (4, 19) and s.shape == scale_shape(4, 37, 4) == (4, 2)
    np.testing.assert_allclose(s[:, 0], np.abs(w[:, :GROUP]).max(axis=1) / 7, rtol=1e-7)
    assert s[1, 1] == 1.0
    vals = unpack_int4(qw, 37)
    assert vals.min() >= -8 and vals.max() <= 7
    back = dequantize(qw, s, 4, 37)
    assert back.dtype == np.float32 and np.all(np.abs(back - w) <= np.repeat(s, GROUP, axis=1)[:, :37] / 2 + 1e-7)
    # rounding half to even on the group's scale: 7 * [1, 0.5, 1.5, 2.5] / 7 -> [7, 0, 2, 2]
    q2, s2 = quantize_weight(np.array([[7.0, 0.5, 1.5, 2.5, -2.5]], dtype=np.float32), 4)
    np.testing.assert_array_equal(unpack_int4(q2, 5), [[7, 0, 2, 2, -2]])
    assert s2[0, 0] == 1.0


def test_int4_decodes_minus_eight_and_every_byte():
    """quantize_weight never stores -8 (|w| <= 7 scale), but every nibble decodes: -8 .. 7."""
    every = np.arange(256, dtype=np.uint8).view(np.int8).reshape(1, 256)
    vals = unpack_int4(every, 512)
    lo, hi = vals[0, 0::2], vals[0, 1::2]
    np.testing.assert_array_equal(lo, [(b & 0xF) - 16 * ((b & 0xF) > 7) for b in range(256)])
    np.testing.assert_array_equal(hi, [(b >> 4) - 16 * ((b >> 4) > 7) for b in range(256)])
    s = np.full((1, 16), 0.5, dtype=np.float32)
    assert dequantize(every, s, 4, 512).min() == -4.0


def test_round_trip_error_is_half_a_step():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(6, 70))
    for bits, top in ((8, 127), (4, 7)):
        q, s = quantize_weight(w, bits)
        step = s[:, None] if bits == 8 else np.repeat(s, GROUP, axis=1)[:, :70]
        assert np.all(np.abs(dequantize(q, s, bits, 70, dtype=np.float64) - w) <= step / 2 * (1 + 1e-6))
        assert np.abs(unpack_int4(q, 70) if bits == 4 else q).max() == top


# --- the C kernels on every byte value ------------------------------------------------------------
def _kernel_graph(dtype: str, bits: int, n_in: int, out: int, rng):
    """linear_qw (with bias), matmul_qw and embedding_qw on one random stored weight (every byte value
    possible: int4 bytes in [-128, 127], int8 values in [-127, 127])."""
    packed = n_in if bits == 8 else (n_in + 1) // 2
    wq = (rng.integers(-127, 128, size=(out, packed)) if bits == 8 else
          rng.integers(-128, 128, size=(out, packed))).astype(np.int8)
    scale = (rng.uniform(0.01, 0.2, size=scale_shape(out, n_in, bits))).astype(np.float32)
    x, b = rng.normal(size=(3, 2, n_in)).astype(dtype), rng.normal(size=out).astype(dtype)
    g, ids = rng.normal(size=(5, out)).astype(dtype), rng.integers(0, out, size=(2, 4))
    arrays = [x, wq, scale, b, g, ids]
    ins = [new_value(TensorType(a.shape, str(a.dtype)), f"a{i}") for i, a in enumerate(arrays)]
    e, attrs = Emitter(), {"bits": bits, "in_features": n_in}
    outs = (e.emit("linear_qw", ins[0], ins[1], ins[2], ins[3], **attrs),
            e.emit("matmul_qw", ins[4], ins[1], ins[2], **attrs),
            e.emit("embedding_qw", ins[5], ins[1], ins[2], dtype=dtype, **attrs))
    graph = verify(Graph(tuple(ins), tuple(e.nodes), outs, ("y", "gx", "rows")))
    w = dequantize(wq, scale, bits, n_in, dtype=np.dtype(dtype))
    return graph, arrays, [x @ w.T + b, g @ w, w[ids]]


@needs_cc
@pytest.mark.parametrize("blas", [True, False], ids=["blas", "portable"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_c_kernels_match_the_reference_on_every_byte(dtype, blas):
    from edgetrain.backends.c.graph_lib import FAST_CFLAGS, build_graph_library

    if blas and dtype == "float64":
        pytest.skip("the float64 kernels are the portable ones in every build")
    flags = FAST_CFLAGS if blas else tuple(f for f in FAST_CFLAGS if not f.startswith("-DET_BLAS"))
    rng = np.random.default_rng(3)
    for bits in (8, 4):
        # (131, 4000): the BLAS kernels' blocks split W: linear_qw 2001 rows a block, matmul_qw 65
        # columns (odd starts, across int4 groups)
        for n_in, out in ((37, 5), (64, 3), (1, 2), (131, 9), (131, 4000)):
            graph, arrays, want = _kernel_graph(dtype, bits, n_in, out, rng)
            got = build_graph_library(graph, flags)(arrays)
            for name, gv, wv in zip(("linear_qw", "matmul_qw", "embedding_qw"), got, want):
                assert gv.dtype == np.dtype(dtype)
                _close(gv, wv, f"{name} {dtype} {bits} bits {n_in} inputs", 1e-12 if dtype == "float64" else 1e-5)
            np.testing.assert_array_equal(got[2], want[2])  # the rows: exact


# --- programs -------------------------------------------------------------------------------------
def _mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(37, 24), nn.ReLU(), nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 5))
    for p in (m[0].weight, m[2].weight):
        p.requires_grad_(False)  # layers 0 and 2: their weights frozen, their biases trained
    return m


def _mlp_data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 37, generator=g), torch.randint(0, 5, (4,), generator=g)


def _torch_step(model, x, y, loss_of):
    model.zero_grad()
    loss = loss_of(model(x), y)
    loss.backward()
    return float(loss), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.requires_grad}


def _check_program(prog, twin, x, y, loss_of, steps=2, lr=0.1, prefix="", tol=TOL):
    """prog's gradients, `steps` SGD losses and then its outputs against torch on `twin`
    (the dequantized model); the frozen weights never change."""
    frozen = {k: v.copy() for k, v in prog.state.items() if k not in prog.trainable}
    _, want = _torch_step(twin, x, y, loss_of)
    got = prog.gradients(x.numpy(), y.numpy())
    assert sorted(got) == sorted(prefix + k for k in want)
    for k, g in want.items():
        _close(got[prefix + k], g, k, tol)
    opt = torch.optim.SGD([p for p in twin.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        want_loss, _ = _torch_step(twin, x, y, loss_of)
        opt.step()
        _close(prog.step(x.numpy(), y.numpy()), want_loss, "loss", tol)
    with torch.no_grad():
        _close(prog.predict(x.numpy()), twin(x).numpy(), "predict", tol)
    assert all(np.array_equal(prog.state[k], v) for k, v in frozen.items()), "a frozen weight changed"


def _quantized_names(prog) -> set:
    return {k[:-2] for k in prog.state if k.endswith(".q")}


def _changed_names(model, twin) -> set:
    before = dict(model.named_parameters())
    return {k for k, p in twin.named_parameters() if not torch.equal(p, before[k])}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("frozen", ["int8", "int4"])
def test_mlp_trains_as_torch_on_the_dequantized_model(frozen, backend):
    m = _mlp()
    x, y = _mlp_data()
    prog = et.compile(m, (x,), frozen=frozen, optimizer=et.SGD(lr=0.1), backend=backend)
    twin = dequantized(m, frozen, (x,))
    assert _quantized_names(prog) == _changed_names(m, twin) == {"0.weight", "2.weight"}
    ops = {n.op for n in prog.train_graph.nodes}
    assert {"linear_qw", "matmul_qw"} <= ops and "linear" in ops  # the trained head stays float
    _check_program(prog, twin, x, y, F.cross_entropy, lr=0.1)
    sd = prog.state_dict()
    assert sorted(sd) == sorted(m.state_dict())
    for k, v in twin.state_dict().items():  # the frozen weights dequantized, the trained ones trained
        if k in ("0.weight", "2.weight"):
            assert torch.equal(sd[k], v), k
        assert sd[k].dtype == v.dtype
    fresh = copy.deepcopy(m)
    fresh.load_state_dict(sd)
    with torch.no_grad():
        _close(fresh(x).numpy(), prog.predict(x.numpy()), "the state_dict loaded back")


@pytest.mark.parametrize("frozen", ["int8", "int4"])
def test_bias_only_trains_biases_beside_quantized_weights(frozen):
    """BiasOnly: every weight frozen and quantized, its bias trained (linear_qw's bias gradient)."""
    m = _mlp()
    for p in m.parameters():
        p.requires_grad_(True)
    x, y = _mlp_data()
    prog = et.compile(m, (x,), frozen=frozen, update=et.BiasOnly(), optimizer=et.SGD(lr=0.1))
    assert _quantized_names(prog) == {"0.weight", "2.weight", "4.weight"}
    twin = dequantized(m, frozen, (x,), update=et.BiasOnly())
    assert _changed_names(m, twin) == _quantized_names(prog)
    for n, p in twin.named_parameters():
        p.requires_grad_(n.endswith("bias"))
    _check_program(prog, twin, x, y, F.cross_entropy, lr=0.1)


@pytest.mark.parametrize("frozen", ["int8", "int4"])
def test_float64_embedding_and_linear_are_exact(frozen):
    """float64 (reference): the stored weights dequantize exactly (q * s), so gradients and outputs
    equal torch's on the dequantized model to rounding; embedding_qw gives float64 rows."""
    class Embeds(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.l, self.h = nn.Embedding(20, 37), nn.Linear(37, 16), nn.Linear(16, 5)

        def forward(self, ids):
            return self.h(torch.tanh(self.l(self.e(ids)))).mean(1)

    torch.manual_seed(0)
    m = Embeds().double()
    m.e.weight.requires_grad_(False)
    m.l.weight.requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 20, (4, 6), generator=g), torch.randint(0, 5, (4,), generator=g)
    prog = et.compile(m, (x,), frozen=frozen, optimizer=et.SGD(lr=0.1))
    assert _quantized_names(prog) == {"e.weight", "l.weight"}
    assert prog.state["e.weight.scale"].dtype == np.float32
    twin = dequantized(m, frozen, (x,))
    _check_program(prog, twin, x, y, F.cross_entropy, lr=0.1, tol=1e-12)
    assert all(v.dtype == torch.float64 for v in prog.state_dict().values())


def test_frozen_bytes_shrink_by_the_layout():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    for p in list(m[0].parameters()) + list(m[2].parameters()):
        p.requires_grad_(False)
    x = torch.randn(2, 64)
    got = {f: et.compile(m, (x,), frozen=f).memory.frozen_bytes for f in (None, "int8", "int4")}
    biases = 2 * 64 * 4
    assert got[None] == 2 * 64 * 64 * 4 + biases
    assert got["int8"] == 2 * (64 * 64 + 64 * 4) + biases  # int8 values + a float32 scale per row
    assert got["int4"] == 2 * (64 * 32 + 64 * 2 * 4) + biases  # two values a byte + a scale per 32
    weights = {f: got[f] - biases for f in got}
    assert weights[None] / weights["int8"] > 3.7 and weights[None] / weights["int4"] > 6.0


def test_a_weight_read_elsewhere_stays_float():
    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.b(self.a(x) + x @ self.a.weight)  # a.weight is also a matmul operand

    torch.manual_seed(0)
    m = Reads()
    for p in m.parameters():
        p.requires_grad_(False)
    m.b.bias.requires_grad_(True)
    x = torch.randn(2, 8)
    prog = et.compile(m, (x,), frozen="int8")
    assert _quantized_names(prog) == {"b.weight"} == _changed_names(m, dequantized(m, "int8", (x,)))


@needs_cc
def test_emitted_project_runs_clean_under_sanitizers_and_on_cortex_m4(tmp_path):
    """The portable kernels (no BLAS): an emitted host project built with -fsanitize=address,undefined
    prints the reference's losses, and the Cortex-M4 firmware (QEMU) prints the host's step lines."""
    import os
    import subprocess

    from edgetrain.backends.c import host
    from tests.backends.c.firmware_agreement import firmware_prints_host_steps

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(37, 12), nn.ReLU(), nn.Linear(12, 5))
    m[0].weight.requires_grad_(False)
    x, y = _mlp_data()
    prog = et.compile(m, (x[:1],), frozen="int4", optimizer=et.SGD(lr=0.1))
    rng = np.random.default_rng(0)
    samples = [(rng.normal(size=(1, 37)).astype(np.float32), np.array([i % 5])) for i in range(3)]
    out = prog.emit_c(tmp_path / "proj", samples=samples)
    exe = host.build_executable(out, host.SANITIZE_CFLAGS)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "runtime error" not in r.stderr, r.stdout + r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("step")]
    ref = et.compile(m, (x[:1],), frozen="int4", optimizer=et.SGD(lr=0.1))
    np.testing.assert_allclose(losses, [ref.step(a, b) for a, b in samples], rtol=1e-5)
    if shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"):
        firmware_prints_host_steps(prog, samples, tmp_path / "fw")


# --- language models -----------------------------------------------------------------------------
VOCAB, T, N = 100, 8, 2
#: trained: every RMSNorm and the last MLP's down projection; the rest (embeddings, attention,
#: the other projections, the head) frozen
TRAINED = ("norm.weight", "layernorm.weight", "layers.1.mlp.down_proj.weight")


def _llama(tied: bool):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   tie_word_embeddings=tied)
    lm = rm.Logits(transformers.LlamaForCausalLM(cfg).eval())
    for n, p in lm.named_parameters():
        p.requires_grad_(n.endswith(TRAINED))
    return lm


def _tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (N, T), generator=g), torch.randint(0, VOCAB, (N, T), generator=g)


def _sequence_ce(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@needs_hf
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("frozen, tied", [("int8", False), ("int4", True)])
def test_llama_trains_as_torch_on_the_dequantized_model(frozen, tied, backend):
    lm = _llama(tied)
    x, y = _tokens()
    prog = et.compile(lm, (x,), loss="sequence_cross_entropy", frozen=frozen, optimizer=et.SGD(lr=0.5),
                      backend=backend)
    twin = dequantized(lm, frozen, (x,))
    names = _quantized_names(prog)
    assert names == _changed_names(lm, twin)
    linears = {n for n, mod in lm.named_modules() if isinstance(mod, nn.Linear)}
    expect = {n + ".weight" for n in linears if not n.endswith("down_proj") or ".0." in n}
    expect = (expect - {"m.lm_head.weight"}) if tied else expect  # tied: one stored weight, the embedding's
    assert names == expect | {"m.model.embed_tokens.weight"}
    assert {"embedding_qw", "linear_qw", "matmul_qw"} <= {n.op for n in prog.train_graph.nodes}
    _check_program(prog, twin, x, y, _sequence_ce, lr=0.5)
    sd = prog.state_dict()
    want = twin.state_dict()
    assert sorted(sd) == sorted(want)
    for k in want:
        if not k.endswith(TRAINED):
            assert torch.equal(sd[k], want[k]), k
    if tied:
        assert torch.equal(sd["m.lm_head.weight"], sd["m.model.embed_tokens.weight"])


@needs_hf
def test_llama_frozen_bytes_drop():
    lm = _llama(False)
    x, _ = _tokens()
    got = {f: et.compile(lm, (x,), loss="sequence_cross_entropy", frozen=f).memory.frozen_bytes
           for f in (None, "int8", "int4")}
    # hidden 32: a row of 32 values is 128 B in float32, 36 B in int8 (+ scale), 20 B in int4; the
    # RMSNorm weights and the rotary buffer stay float
    assert got[None] / got["int8"] > 3.2 and got[None] / got["int4"] > 5.3, got


@needs_peft
@pytest.mark.parametrize("backend", BACKENDS)
def test_peft_lora_model_on_an_int4_base(backend):
    """A peft model compiled with update=et.Full(): its adapters train, its whole base is frozen,
    so every base linear and the embedding are stored int4; the adapters stay float."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    base = transformers.LlamaForCausalLM(cfg).eval()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # B non-zero: A has a gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    lm = rm.Logits(model)
    x, y = _tokens()
    prog = et.compile(lm, (x,), loss="sequence_cross_entropy", frozen="int4", optimizer=et.SGD(lr=0.5),
                      backend=backend)
    names = _quantized_names(prog)
    assert not any("lora_" in n for n in names) and sorted(prog.trainable) == sorted(
        n for n, p in lm.named_parameters() if p.requires_grad)
    assert len(names) == 2 * 7 + 2  # 7 linears a layer, the embedding, the head
    twin = dequantized(lm, "int4", (x,))
    assert names == _changed_names(lm, twin)
    _check_program(prog, twin, x, y, _sequence_ce, lr=0.5)


@needs_hf
def test_lora_scheme_quantizes_the_whole_base():
    """update=et.LoRA(...): every base linear / embedding weight is frozen, so stored int8, and
    `dequantized(..., update=et.LoRA(...))` names the same weights."""
    lm = _llama(False)
    for p in lm.parameters():
        p.requires_grad_(True)  # LoRA trains its adapters whatever requires_grad says
    x, y = _tokens()
    scheme = et.LoRA(rank=4, alpha=8, targets=("q_proj", "v_proj"))
    prog = et.compile(lm, (x,), loss="sequence_cross_entropy", update=scheme, frozen="int8")
    linears = {n + ".weight" for n, mod in lm.named_modules() if isinstance(mod, nn.Linear)}
    assert _quantized_names(prog) == linears | {"m.model.embed_tokens.weight"}
    assert _changed_names(lm, dequantized(lm, "int8", (x,), update=scheme)) == _quantized_names(prog)
    assert np.isfinite(prog.step(x.numpy(), y.numpy()))


# --- errors ----------------------------------------------------------------------------------------
def test_errors():
    m = _mlp()
    x, _ = _mlp_data()
    with pytest.raises(ValueError, match="int3"):
        et.compile(m, (x,), frozen="int3")
    with pytest.raises(ValueError, match="quantize"):
        et.compile(m, (x,), frozen="int8", quantize="int8")
    with pytest.raises(ValueError, match="int3"):
        dequantized(m, "int3", (x,))
    g = Graph((), (), (), ())
    with pytest.raises(ValueError, match="int2"):
        quantize_frozen(g, {}, {}, "int2")
    # the stored weight has no gradient: a VJP asked for one refuses
    ins = [new_value(TensorType((2, 5), "float32")), new_value(TensorType((3, 5), "int8")),
           new_value(TensorType((3,), "float32"))]
    e = Emitter()
    y = e.emit("linear_qw", *ins, bits=8, in_features=5)
    with pytest.raises(ValueError, match="frozen"):
        OPS["linear_qw"].vjp(Emitter(), e.nodes[0], [y], [None, True, None])
    with pytest.raises(ValueError, match="should be int8"):  # the stored shape must match the attrs
        Emitter().emit("linear_qw", *ins, bits=4, in_features=5)
    # a weight name taken by the quantized form's entries
    w = new_value(TensorType((3, 5), "float32"), "w")
    xin = new_value(TensorType((2, 5), "float32"), "x")
    e = Emitter()
    out = e.emit("linear", xin, w)
    g = Graph((xin, w), tuple(e.nodes), (out,), ("y",), roles=(Role.DATA, Role.FROZEN))
    with pytest.raises(ValueError, match="w.q"):
        quantize_frozen(g, {"w": np.ones((3, 5), np.float32), "w.q": np.ones(1)}, {}, "int8")
