"""Frozen weights mapped from the weights file in the standalone host binary (weights_file.py,
runtime/et_weights.h): the frozen tensors point into the mapped file and their pages are dropped
after use, so the binary's peak RSS stays far below its state bytes, while it trains exactly as
the build that reads them into RAM (MAP_WEIGHTS=0) and leaves the weights file as it was."""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import weights_file as wf
from edgetrain.backends.c.host import PROJECT_CFLAGS
from edgetrain.backends.c.layout import build_layout
from edgetrain.backends.c.project import project_files
from edgetrain.backends.c.weights_file import release_hooks
from edgetrain.memory.frozen_window import frozen_window

needs_linux_cc = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None,
                                    reason="mapped weights: Linux with gcc")
WIDTH, FROZEN_LAYERS = 1024, 6  # six frozen 4 MiB linears (24 MiB) before a trained 40 KiB head


def _model():
    torch.manual_seed(0)
    layers = []
    for _ in range(FROZEN_LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    m = nn.Sequential(*layers, nn.Linear(WIDTH, 10))
    for p in m[:-1].parameters():
        p.requires_grad_(False)
    return m


def _samples(n=2):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(1, WIDTH)).astype(np.float32), np.array([i % 10])) for i in range(n)]


@pytest.fixture(scope="module")
def prog():
    return et.compile(_model(), (_samples()[0][0],), update=et.Full(), optimizer=et.SGD(lr=0.1, momentum=0.9))


def test_frozen_window_model():
    sizes = {"a": 1 << 20, "b": 1 << 20, "c": 100}
    w = frozen_window([{"a", "c"}, {"a"}, set(), {"b"}, {"c"}], sizes, release_min=1 << 16, page=4096)
    one = (256 + 1) * 4096  # a 1 MiB tensor's pages at an unaligned offset
    assert w.total_bytes == (2 << 20) + 100 and w.kept_bytes == 100
    # a stays while the next node reads it; after its last reader only its two edge pages stay
    assert w.peak_bytes == one + 2 * 4096 + 100 and w.at_node == 3  # c by its bytes (it shares its pages)
    assert frozen_window([{"a"}, {"b"}], sizes, release_min=1 << 30).peak_bytes == 2 << 20  # nothing released
    assert frozen_window([{"a"}, {"b"}], sizes, release_min=1).peak_bytes == one + 2 * 4096
    with pytest.raises(KeyError, match="no size"):
        frozen_window([{"z"}], sizes, 1)


def test_frozen_tensors_are_pointers_and_released_after_their_last_reader(prog):
    files = project_files(prog, _samples(), embed_weights=False, graphs=("train",))
    c, mk = files["model.c"], files["Makefile"]
    lay = build_layout(prog, ("train",))
    frozen = [st for st in lay.states.values() if st.kind == "flash"]
    assert len(frozen) == 2 * FROZEN_LAYERS  # weights and biases; the head and its momentum in RAM
    for st in frozen:
        assert f"static const float *{st.c_name};" in c
    releases = re.findall(r"ET_RELEASE_WEIGHT\((\d+), (\w+), (\d+)\);", c)
    assert sorted(r[1] for r in releases) == sorted(st.c_name for st in frozen)  # each once, after its only reader
    big = {st.c_name for st in frozen if st.numel * 4 >= 1 << 16}
    with_min = release_hooks(lay, "train", min_bytes=1 << 16)
    hooked = [ln for n in lay.graphs["train"].graph.nodes for ln in with_min(n)[1]]
    assert len(hooked) == len(big) and all(any(b + "," in ln for ln in hooked) for b in big)  # the biases not
    assert "main: override CFLAGS += -DET_MAP_WEIGHTS=$(MAP_WEIGHTS)" in mk and "MAP_WEIGHTS ?=" in mk
    ram = wf.host_step_ram(lay)
    assert ram["frozen"] == sum(st.numel * 4 for st in frozen)
    assert WIDTH * WIDTH * 4 <= ram["frozen_window"] < 2 * WIDTH * WIDTH * 4  # one weight at a time
    assert wf.host_step_ram(lay, mapped=False)["modelled"] - ram["modelled"] == ram["frozen"] - ram["frozen_window"]
    # the embedded build (the firmware's) keeps const arrays and no release
    emb = project_files(prog, _samples(), embed_weights=True, graphs=("train",))["model.c"]
    assert "ET_RELEASE_WEIGHT(" not in emb and "ET_MAP_WEIGHTS" not in emb


def _run(d, *args):
    r = subprocess.run(["./main", "weights.bin", "samples.bin", *map(str, args)], cwd=d, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@needs_linux_cc
def test_mapped_build_trains_bit_equal_with_most_frozen_bytes_never_resident(prog, tmp_path):
    out = prog.emit_c(tmp_path / "mapped", samples=_samples(), embed_weights=False, graphs=("train",))
    plain = tmp_path / "plain"
    shutil.copytree(out, plain)
    for d, flag in ((out, "1"), (plain, "0")):  # portable kernels: the BLAS's own buffers are not the subject
        subprocess.run(["make", "-s", "-B", "main", "BLAS=0", f"MAP_WEIGHTS={flag}"], cwd=d, check=True,
                       capture_output=True, timeout=300)
    before = hashlib.sha256((out / "weights.bin").read_bytes()).hexdigest()
    got = {d: _run(d, "--steps", 2, "--save", "trained.bin") for d in (out, plain)}
    assert hashlib.sha256((out / "weights.bin").read_bytes()).hexdigest() == before  # the file is not written
    a, b = wf.read_weights(out / "trained.bin"), wf.read_weights(plain / "trained.bin")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert re.findall(r"loss (\S+)", got[out]) == re.findall(r"loss (\S+)", got[plain])
    head = [k for k, st in build_layout(prog, ("train",)).states.items() if st.kind != "flash"]
    init = wf.read_weights(out / "weights.bin")
    assert head and any(not np.array_equal(a[k], init[k]) for k in head)  # the head did train
    assert all(np.array_equal(a[k], init[k]) for k in a if k not in head)  # the frozen ones saved as they were

    def peak(s):
        return int(re.search(r"peak_rss_kb (\d+)", s).group(1)) * 1024

    assert "mapped_weights 1" in got[out] and "mapped_weights 0" in got[plain]
    released = int(re.search(r"released_weight_bytes (\d+)", got[out]).group(1))
    assert released >= 2 * FROZEN_LAYERS * (WIDTH * WIDTH * 4 - 8192)  # every weight dropped once a step
    frozen = FROZEN_LAYERS * (WIDTH * WIDTH + WIDTH) * 4
    state = (out / "weights.bin").stat().st_size
    # the mapped binary's peak: below the state bytes by most of the frozen bytes (one 4 MiB weight resident
    # at a time, 24 MiB frozen), and below the unmapped build's by as much
    assert peak(got[out]) < state - frozen // 2, (peak(got[out]), state)
    assert peak(got[plain]) - peak(got[out]) > frozen // 2, (peak(got[plain]), peak(got[out]))


@needs_linux_cc
def test_scheduled_decoder_runs_mapped_as_the_unscheduled_one(tmp_path):
    """A 2-layer Llama (q_proj / v_proj trained, the rest frozen, a tied 128 KB embedding released
    after use) under POET's MILP at 80 % of its activation bytes: the standalone binary trains to the
    same weights, bit for bit, as the unscheduled program, with the reference's losses."""
    import tests.realmodels.conftest  # noqa: F401  (the torchvision op schemas transformers needs)
    from transformers import LlamaConfig, LlamaForCausalLM

    from edgetrain.devices import get_device
    from edgetrain.remat.build import build_problem

    class LM(nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(input_ids=ids).logits

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=32, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    model = LM(LlamaForCausalLM(cfg)).eval()
    for n, p in model.named_parameters():
        p.requires_grad_(n.endswith(("q_proj.weight", "v_proj.weight")))
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, 1000, (1, 8), generator=g), torch.randint(0, 1000, (1, 8), generator=g)
    prog = et.compile(model, (ids,), loss="sequence_cross_entropy", update=et.Full(), optimizer=et.SGD(lr=0.1))
    problem = build_problem(prog, get_device("a72"))
    sched = et.schedule(prog, device="a72", ram=problem.fixed_ram + problem.activation_bytes * 4 // 5,
                         time_limit=5)
    assert sched.recomputations or sched.page_ins
    samples = [(ids.numpy(), labels.numpy())]
    trained, losses = [], []
    quick = [f for f in PROJECT_CFLAGS if f != "-O3"] + ["-O1"]
    for name, p in (("plain", prog), ("sched", prog.apply(sched))):
        d = p.emit_c(tmp_path / name, samples=samples, embed_weights=False, graphs=("train",))
        # the Makefile's flags at -O1 (both builds alike; the model's -O3 build took 10-14 s of the test)
        subprocess.run(["make", "-s", "main", "BLAS=0", f"CFLAGS={' '.join(quick)}"], cwd=d, check=True,
                       capture_output=True, timeout=300)
        s = _run(d, "--steps", 2, "--save", "trained.bin")
        assert "mapped_weights 1" in s and int(re.search(r"released_weight_bytes (\d+)", s).group(1)) > 0
        losses.append([float(v) for v in re.findall(r"loss (\S+)", s)])
        trained.append(wf.read_weights(d / "trained.bin"))
    assert trained[0].keys() == trained[1].keys()
    assert all(np.array_equal(trained[0][k], trained[1][k]) for k in trained[0])
    assert losses[0] == losses[1]
    np.testing.assert_allclose(losses[0], [prog.step(ids.numpy(), labels.numpy()) for _ in range(2)], rtol=1e-5)
