"""POET's schedule with the frozen weights paged too (build_problem(..., mapped_weights=True),
remat/weights.py): a LoRA step on an int4 frozen base, whose standalone host binary maps the
weights file, schedules below the lower bound that counts every frozen byte as held all along;
the drops the binary makes (weight_releases) never leave more frozen weights resident than the
model counts at any node; the binary trains bit for bit as the unscheduled one, its peak RSS
within the model's peak plus the runtime's own bytes."""
from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.devices import get_device
from edgetrain.memory import storage_roots
from edgetrain.memory.frozen_window import pages_touched
from edgetrain.remat.build import build_problem
from edgetrain.remat.greedy import ram_lower_bound
from edgetrain.remat.plan import Infeasible
from edgetrain.remat.weights import mapped_frozen, weight_releases

needs_linux_cc = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None,
                                    reason="mapped weights: Linux with gcc")


class LM(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids).logits


@functools.lru_cache(maxsize=None)
def lora_int4(hidden=64, vocab=512):
    """(program, ids): a 2-layer tiny Llama, LoRA rank 8 on q/v, its frozen base int4, causal LM loss."""
    import tests.realmodels.conftest  # noqa: F401  (the torchvision op schemas transformers needs)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=32, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    ids = torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(1))
    prog = et.compile(LM(LlamaForCausalLM(cfg)).eval(), (ids,), loss="causal_lm",
                      update=et.LoRA(rank=8, alpha=16, targets=("q_proj", "v_proj")), optimizer=et.SGD(lr=1e-3),
                      frozen="int4")
    return prog, ids


def test_mapped_weights_lower_the_bound_and_change_nothing_when_off():
    prog, _ = lora_int4()
    dev = get_device("a72")
    plain, off, on = build_problem(prog, dev), build_problem(prog, dev, mapped_weights=False), \
        build_problem(prog, dev, mapped_weights=True)
    assert off == plain and not plain.mapped_weights and not any(u.frozen for u in plain.units)
    assert plain.fixed_ram == prog.memory.trainable_bytes + prog.memory.frozen_bytes
    frozen = mapped_frozen(prog.train_graph, plain.ram_inputs, prog.trainable)
    assert frozen and sum(frozen.values()) == prog.memory.frozen_bytes  # every frozen tensor is mapped here
    assert on.mapped_weights and on.fixed_ram == prog.memory.trainable_bytes
    units = {u.name.rsplit("@", 1)[0]: u for u in on.units if u.frozen}
    read = set().union(*_frozen_read(prog.train_graph, set(frozen)))
    assert set(units) == read and len(read) > 20  # those the step reads (the others are never touched)
    for name, u in units.items():
        assert u.bytes == pages_touched(frozen[name]) and u.pageable and u.recompute_until == -1
        assert u.page_out_j == 0 and u.page_in_j > 0 and not u.nodes
    assert [u.name for u in on.units if not u.frozen] == [u.name for u in plain.units]
    assert ram_lower_bound(on) < ram_lower_bound(plain)
    # on a device reading its weights from flash they take no RAM either way: the option changes nothing
    mcu = get_device("m7")
    assert mcu.weights_in_flash
    assert build_problem(prog, mcu, mapped_weights=True).units == build_problem(prog, mcu).units
    assert ram_lower_bound(build_problem(prog, mcu, mapped_weights=True)) == ram_lower_bound(build_problem(prog, mcu))


def _frozen_read(graph, frozen_names):
    """Per node: the mapped frozen weights it reads (through views, not as the source of a view it makes)."""
    roots, inputs = storage_roots(graph), set(graph.inputs)
    out = []
    for n in graph.nodes:
        views = {roots[o] for o in n.outputs}
        out.append({roots[v].name for v in n.inputs
                    if roots[v] in inputs and roots[v].name in frozen_names and roots[v] not in views})
    return out


def counted_sets(sched, graph):
    """Per node of the scheduled `graph`: the frozen weights the problem counts as resident there."""
    p = sched.problem
    us, b0, S = p.units, p.forward_end, len(p.stages)
    name = {u.index: u.name.rsplit("@", 1)[0] for u in us if u.frozen}
    orig = _frozen_read(p.graph, set(name.values()))
    pos = {id(o): q for q, n in enumerate(p.graph.nodes) for o in n.outputs}
    stage_of = {q: s for s, st in enumerate(p.stages) for q in st.nodes}
    first = {st.nodes[0] for st in p.stages}
    qs = [pos.get(id(n.outputs[0])) for n in graph.nodes]
    nxt_q, q = [None] * len(qs), None
    for i in range(len(qs) - 1, -1, -1):
        q = qs[i] if qs[i] is not None else q
        nxt_q[i] = q
    out, prev_q = [], 0
    for i, n in enumerate(graph.nodes):
        if qs[i] is not None:
            prev_q = qs[i]
        # a page-out runs after its forward node; page-ins and recomputations before their stage's first node
        q = qs[i] if qs[i] is not None else prev_q if n.op == "page_out" else nxt_q[i]
        if q < b0:
            kept = {name[u] for u in sched.keep if u in name and us[u].last_forward < q}
            out.append(orig[q] | kept)
            continue
        s = stage_of[q]
        mat = {name[u] for u in set(sched.resident[s]) | set(sched.page_in[s]) if u in name}
        carried = {name[u] for u in (sched.resident[s + 1] if s + 1 < S else ()) if u in name}
        out.append(mat if q in first else carried)
    return out


@pytest.mark.parametrize("solver", ["milp", "paging", "dtr", "none"])
def test_the_binary_drops_never_exceed_what_the_model_counts(solver):
    prog, _ = lora_int4()
    problem = build_problem(prog, get_device("a72"), mapped_weights=True)
    more = problem.activation_bytes // (1 if solver == "dtr" else 4)  # dtr's greedy forward needs more room
    ram = None if solver == "none" else ram_lower_bound(problem) + more
    sched = et.schedule(prog, device="a72", ram=ram, solver=solver, time_limit=3, mapped_weights=True)
    assert sched.peak_bytes <= (ram or sched.peak_bytes)
    graph = prog.apply(sched).train_graph
    names = {u.name.rsplit("@", 1)[0] for u in problem.units if u.frozen}
    reads, drops, counted = _frozen_read(graph, names), weight_releases(sched, graph), counted_sets(sched, graph)
    resident, dropped = set(), 0
    for i, n in enumerate(graph.nodes):
        resident |= reads[i]  # a kernel reading a weight faults its pages in
        assert resident <= counted[i], (i, n.op, sorted(resident - counted[i])[:3])
        assert set(drops[i]) <= resident
        resident -= set(drops[i])
        dropped += len(drops[i])
    assert not resident or solver == "none"  # all dropped by the end of the step (but what "none" keeps)
    if solver != "none":
        assert sched.weight_page_ins > 0 and dropped >= len(names)


def _run(d):
    r = subprocess.run(["./main", "weights.bin", "samples.bin", "--steps", "2", "--save", "trained.bin"], cwd=d,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.slow
@needs_linux_cc
def test_a_schedule_below_the_old_bound_runs_bit_equal_within_its_modelled_rss(tmp_path):
    """hidden 256, vocab 4096: 1.4 MB of int4 frozen weights, which the old model held all along."""
    from edgetrain.backends.c import weights_file as wf
    from edgetrain.backends.c.layout import build_layout

    prog, ids = lora_int4(hidden=256, vocab=4096)
    dev = get_device("a72")
    old_lb = ram_lower_bound(build_problem(prog, dev))
    problem = build_problem(prog, dev, mapped_weights=True)
    ram = ram_lower_bound(problem)
    assert ram < old_lb - problem.activation_bytes // 2
    try:
        sched = et.schedule(prog, device="a72", ram=ram, time_limit=10, mapped_weights=True)
    except Infeasible as e:
        ram = e.smallest_ram
        sched = et.schedule(prog, device="a72", ram=ram, time_limit=10, mapped_weights=True)
    assert sched.peak_bytes <= ram < old_lb and sched.weight_page_ins > 0
    samples = [(ids.numpy(), ids.numpy())]
    got = {}
    for name, p in (("plain", prog), ("scheduled", prog.apply(sched))):
        d = p.emit_c(tmp_path / name, samples=samples, embed_weights=False, graphs=("train",))
        subprocess.run(["make", "-s", "main", "BLAS=0", "MAP_WEIGHTS=1"], cwd=d, check=True, capture_output=True,
                       timeout=300)
        got[name] = (_run(d), wf.read_weights(d / "trained.bin"), build_layout(p, ("train",)))
    (out, trained, lay), (_, want, _) = got["scheduled"], got["plain"]
    assert trained.keys() == want.keys() and all(np.array_equal(trained[k], want[k]) for k in want)
    assert re.findall(r"loss (\S+)", out) == re.findall(r"loss (\S+)", got["plain"][0])
    kb = {k: int(re.search(rf"{k} (\d+)", out).group(1)) * 1024 for k in ("rss_before_steps_kb", "peak_rss_kb")}
    # the step's growth of the RSS: at most the model's step bytes (its peak less the RAM state, already read
    # before the steps), the arena's bytes beyond the model's live bytes (its static plan) and the step guard's
    # copies (STEP_GUARD=1: outside POET's model)
    ram_model = wf.host_step_ram(lay)
    slack = max(0, lay.arena_bytes - sched.activation_bytes) + ram_model["guard"]
    grown = kb["peak_rss_kb"] - kb["rss_before_steps_kb"]
    assert grown <= sched.peak_bytes - problem.fixed_ram + slack, (kb, sched.peak_bytes, slack)
