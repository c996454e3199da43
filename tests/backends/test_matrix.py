"""Every backend computes the same program, model by model: every zoo model x update scheme x
dtype runs on the reference runtime and on the C backend, and `predict`, `gradients` and three
`step`s agree (int8 bit for bit; float32 within 1e-5 of each tensor's largest magnitude, or
with the float64 run that takes a ReLU / clamp decision within float32 rounding of its threshold
the way the C did: tests/backends/c/kinks.py).

The quick set runs each zoo model once at its real resolution, covering every scheme and both
dtypes; the whole product (small resolutions, each model at its real one too) and the paper's
three int8 models with their published schemes are marked `slow` (`pytest -m slow`; CI runs
both)."""
from __future__ import annotations

import json
from typing import Mapping

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.backends.c.graph_lib import FAST_CFLAGS
from edgetrain.backends.c.host import DEFAULT_CFLAGS, to_c_program
from tests.backends.c.float_agreement import relative_error
from tests.backends.c.kinks import feeds_copy, flipped_runs
from tests.models import tiny_training_file as ttf

#: a quick build for the quick set and the small runs; the slow product's real-size runs build
#: with the flags users get (DEFAULT_CFLAGS, -O3: where a compiler's vectoriser shows itself)
FLAGS = FAST_CFLAGS
RTOL = 1e-5
#: predict of an int8 program with float layers: a float32 op feeding a quantize rounds to the
#: nearer int8 level, and C float32 and numpy float32 (whose SIMD math differs from one CPU to
#: another) can land on either side of a half; one int8 level then moves a small model's logits
#: by about 1 % (bert-tiny on an AMD EPYC: 1.1 % and 1.6 % from equal states, 0 on a Xeon)
INT8_FLOAT_PREDICT_RTOL = 0.05
SCHEMES = {"full": et.Full(), "bias": et.BiasOnly(), "last": et.LastK(3),
           # a Sparse scheme that exists in every zoo model (layers counted without the classifier)
           "sparse": et.Sparse(bias_last=4, weights={0: 0.5, 2: 0.25, 5: 1.0})}
DTYPES = ("float32", "int8")
MODELS = et.models.names()
#: the small size of the product's runs (the MCU nets and ResNet-18 downsample 32x; BERT's tokens)
SMALL = {"bert-tiny": 16}
SMALL_IMAGE = 32
#: the quick set: each model once at its real size; together every scheme and both dtypes
QUICK = [("mbv2-w0.35", "last", "int8"), ("mcunet-5fps", "full", "float32"), ("proxyless-w0.3", "last", "float32"),
         ("resnet18", "sparse", "int8"), ("resnet18-cifar", "bias", "int8"), ("bert-tiny", "sparse", "float32")]


def example(name: str, real: bool, batch: int = 1) -> torch.Tensor:
    if real or name in ("ds-cnn", "ad-autoencoder"):  # MLPerf Tiny's: a fixed pool / dense input size
        return et.models.example_input(name, batch=batch, seed=1)
    x = et.models.example_input(name, batch=batch, seed=1)
    if x.is_floating_point():
        return x[..., :SMALL_IMAGE, :SMALL_IMAGE].contiguous()
    return x[:, :SMALL.get(name, 16)].contiguous()


def batches(x: torch.Tensor, classes: int, n: int = 3, seed: int = 0):
    """n (x, y) batches shaped like x: images around x (new noise each), or new token ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if x.is_floating_point():
            xi = (x.numpy() + 0.5 * rng.standard_normal(x.shape)).astype(np.float32)
        else:
            xi = rng.integers(0, int(x.max()) + 1, size=x.shape).astype(np.int64)
        out.append((xi, rng.integers(0, classes, size=x.shape[0]).astype(np.int64)))
    return out


#: float kernels whose sums run in another order than numpy's (BLAS, pairwise sums) or whose
#: exp / tanh / erf is another algorithm: an int8 program that keeps such layers in float32
#: (bert-tiny: attention, layer norm, GELU) holds its integers bit-exact and its float tensors
#: (gradients, momentum) within RTOL; every other int8 program is bit-exact throughout
FLOAT_COMPUTE = frozenset({"matmul", "linear", "linear_grad_weight", "conv2d", "conv2d_grad_input",
                           "conv2d_grad_weight", "layer_norm", "layer_norm_grad_input", "layer_norm_grad_weight",
                           "softmax", "softmax_grad", "log_softmax", "log_softmax_grad", "gelu", "gelu_grad",
                           "tanh", "tanh_grad", "sigmoid", "sigmoid_grad", "sum", "mean", "batch_norm",
                           "batch_norm_grad_input", "batch_norm_grad_weight", "batch_norm_backward_fused",
                           "embedding_grad"})
#: a gradient is compared relative to its own largest magnitude, but not below this share of
#: the program's largest gradient: a gradient that is zero in exact arithmetic (a key bias before
#: softmax, which a per-row constant does not change) is rounding noise on both backends
GRAD_FLOOR = 1e-3
#: the zoo models whose int8 programs keep float layers (FLOAT_COMPUTE); the others must not
INT8_WITH_FLOAT_LAYERS = frozenset({"bert-tiny", "ad-autoencoder"})  # the autoencoder's BatchNorm1d stays float


def close(got, want, what: str, exact: bool, floor: float = 0.0, rtol: float = RTOL):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "iu":  # integers (int8 weights, int32 biases) are equal in every program
        assert np.array_equal(got, want), f"{what}: {int((got != want).sum())} of {want.size} integers differ"
        return
    err = relative_error(got, want, floor)
    tol = 0.0 if exact else rtol
    assert err <= tol, f"{what}: relative difference {err:.3g} > {tol:g}"


def agree(what: str, got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], floors, runs):
    """Float32 tensors `got` meet `want` within RTOL of each one's largest magnitude (at least
    floors(want)[name]), or meet one of the float64 runs `runs()` yields ({name: tensor}): the
    exact computation, then with the nearest ReLU / clamp kinks flipped (kinks.py). Integer
    tensors are equal."""
    for k, w in want.items():
        if np.asarray(w).dtype.kind in "iu":
            close(got[k], w, f"{what}: {k}", exact=True)
    floats = [k for k, w in want.items() if np.asarray(w).dtype.kind == "f"]
    fl = floors(want)
    bad = {k: e for k in floats if (e := relative_error(got[k], want[k], fl[k])) > RTOL}
    if not bad:
        return
    tried = []
    for flips, alt in runs():
        fl = floors(alt)
        errs = {k: relative_error(got[k], alt[k], fl[k]) for k in floats}
        if max(errs.values(), default=0.0) <= RTOL:
            return
        tried.append((", ".join(map(str, flips)) or "none", max(errs, key=errs.get), max(errs.values())))
    pytest.fail(f"{what}: relative differences {bad} from the float32 reference; the float64 runs "
                f"(flipped kinks, worst tensor, its difference) meet it neither: {tried}")


def _floors(share: float, prefix: str = ""):
    """floors(tensors): for each tensor (those starting with `prefix`; the others 0), `share`
    of the largest magnitude among them."""
    def floors(t: Mapping[str, np.ndarray]) -> dict[str, float]:
        named = [k for k in t if k.startswith(prefix)]
        largest = max((float(np.abs(t[k]).max(initial=0)) for k in named), default=0.0)
        return {k: share * largest if k in named else 0.0 for k in t}
    return floors


def run_both(ref, x, data, int8: bool, flags=FLAGS):
    """The C twin of `ref` and the reference agree on predict, gradients and three steps.

    Each step starts both backends from the same state (the reference's, copied into the C
    program after the comparison): a step is compared, not a trajectory. A float32 result
    that misses the reference is accepted where it meets the float64 run with a ReLU / clamp
    decision within float32 rounding of its threshold taken the other way (agree, kinks.py):
    resnet18-cifar's step 2 on oneDNN's AVX2 convolutions takes one such element the other way."""
    c = to_c_program(ref, flags)
    exact = int8 and not ({n.op for n in ref.train_graph.nodes} & FLOAT_COMPUTE)
    x = x.numpy()
    predict_rtol = INT8_FLOAT_PREDICT_RTOL if int8 else RTOL  # (int8 and exact: 0)
    xb, yb = data[0]
    # int8 outputs are dequantized integers: equal as floats; float32 within RTOL
    close(c.predict(x), ref.predict(x), "predict", exact, rtol=predict_rtol)
    gg = ref.compiled.grad_graph
    feeds = feeds_copy(ref, gg, xb, yb)
    g_ref, g_c = ref.gradients(xb, yb), c.gradients(xb, yb)
    assert set(g_c) == set(g_ref)
    grad_floors = _floors(GRAD_FLOOR)
    if exact:
        for k in g_ref:
            close(g_c[k], g_ref[k], f"gradient of {k}", exact)
    else:
        agree("gradients", g_c, g_ref, grad_floors,
              lambda: ((f, ref.runner.full_gradients(out)) for f, out, _ in flipped_runs(gg, feeds)))
    tg = ref.train_graph
    # momentum buffers are gradient sums: the same floor, from the largest of them
    state_floors = _floors(GRAD_FLOOR, "momentum:")
    for i, (xi, yi) in enumerate(data):
        feeds = feeds_copy(ref, tg, xi, yi)
        lr_, lc = ref.step(xi, yi), c.step(xi, yi)
        # the loss of an int8 program is computed from identical logits in the same order: equal
        assert (lc == lr_) if exact else np.isclose(lc, lr_, rtol=RTOL, atol=0), f"step {i}: loss {lc} != {lr_}"
        if exact:
            for k in ref.state:
                close(c.state[k], ref.state[k], f"step {i}: {k}", exact)
        else:
            agree(f"step {i}", c.state, ref.state, state_floors,
                  lambda: ((f, {k: after[k] for k in ref.state}) for f, _, after in flipped_runs(tg, feeds)))
        for k in ref.state:
            c.state[k][...] = ref.state[k]
    close(c.predict(x), ref.predict(x), "predict after the steps", exact, rtol=predict_rtol)
    assert c.runner.check_guards()
    return c


def compile_pair(name: str, scheme: str, dtype: str, real: bool):
    model = et.models.get(name, num_classes=10).eval()
    x = example(name, real)
    data = batches(x, 10)
    kw = dict(update=SCHEMES[scheme], optimizer=et.SGD(lr=0.01, momentum=0.9))
    if dtype == "int8":
        kw.update(quantize="int8", calibration=[x] + [(xi,) for xi, _ in data[:1]],
                  optimizer=et.SGD(lr=0.01, momentum=0.9, qas=True))
    prog = et.compile(model, (x,), **kw)
    if dtype == "int8":  # which int8 programs are held bit-exact in their float tensors too
        floats = {n.op for n in prog.train_graph.nodes} & FLOAT_COMPUTE
        assert bool(floats) == (name in INT8_WITH_FLOAT_LAYERS), f"{name} int8 computes {sorted(floats)} in float"
    return prog, x, data


@pytest.mark.parametrize("name,scheme,dtype", QUICK, ids=["-".join(c) for c in QUICK])
def test_zoo_model_on_c_equals_reference(name, scheme, dtype):
    ref, x, data = compile_pair(name, scheme, dtype, real=True)
    run_both(ref, x, data, dtype == "int8")


PRODUCT = [(m, s, d, r) for m in MODELS for s in SCHEMES for d in DTYPES for r in (False, True)
           if (m, s, d) not in QUICK or not r]


@pytest.mark.slow
@pytest.mark.parametrize("name,scheme,dtype,real", PRODUCT,
                         ids=[f"{m}-{s}-{d}-{'real' if r else 'small'}" for m, s, d, r in PRODUCT])
def test_zoo_product_on_c_equals_reference(name, scheme, dtype, real):
    ref, x, data = compile_pair(name, scheme, dtype, real)
    run_both(ref, x, data, dtype == "int8", DEFAULT_CFLAGS if real else FLAGS)


def _published(name: str):
    path = ttf.ASSETS / "schemes.json"
    if not (ttf.ASSETS / f"{name}.pkl").exists() or not path.exists():
        pytest.skip(f"the paper's model files are absent ({ttf.ASSETS}; ../shared/assets)")
    return json.loads(path.read_text())["schemes"][name]


#: each model's smallest and largest published scheme (by position in schemes.json)
PAPER = [(m, i) for m in ("mbv2-w0.35", "proxyless-w0.3", "mcunet-5fps") for i in (0, -1)]


@pytest.mark.slow
@pytest.mark.parametrize("name,which", PAPER, ids=[f"{m}-{'smallest' if i == 0 else 'largest'}" for m, i in PAPER])
def test_paper_int8_model_with_published_scheme(name, which):
    """The paper's int8 models (its integers and scales) at 128x128 with its published sparse
    schemes: the C backend's predict, gradients and steps bit-exact with the reference."""
    s = list(_published(name).values())[which]
    scheme = et.Sparse(bias_last=s["bias_last"], weights={int(k): v for k, v in s["weights"].items() if v})
    model = et.models.from_tiny_training(ttf.ASSETS / f"{name}.pkl", num_classes=10)
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(2)) * 255
    data = [(xi * 60 + 128, y) for xi, y in batches(x - x, 10)]
    ref = et.compile(model, (x,), update=scheme, quantize="int8", optimizer=et.SGD(lr=0.01, momentum=0.9))
    run_both(ref, x, data, True, DEFAULT_CFLAGS)
