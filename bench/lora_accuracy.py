"""Accuracy of LoRA on a quantized frozen base: a small byte-level decoder pretrained here on one offline
corpus, then LoRA-fine-tuned on another by PyTorch + peft (float32), edgetrain (float32 base) and edgetrain
(frozen="int4" base), same initial adapters and the same batches in the same order; held-out perplexity
before and after (issue 32, deliverable 5).

    PYTHONPATH=src python bench/lora_accuracy.py [--pretrain-steps 1000] [--pretrain-seconds 0] [--steps 300]
        [--lr 0.05] [--momentum 0.9] [--work DIR] [--out docs/results/lora-accuracy.jsonl] [--tiny]

- model: LlamaConfig, hidden 128, 4 layers, 4 heads, 2 KV heads, intermediate 384, vocabulary 256 (bytes:
  no tokenizer to download), tied embeddings, eager attention;
- pretraining (PyTorch, AdamW lr 3e-3 cosine to 3e-4, batch 16 x 128 bytes, --pretrain-steps steps, or
  fewer when a --pretrain-seconds limit is given and runs out: the figures then depend on the machine)
  on the Python standard library's .py files (sysconfig's "stdlib" path, so the running Python's
  version; its test suites left out), cached in --work (keyed by the config and these limits);
- fine-tuning on this repository's docs/*.md and README.md as of git revision --corpus-rev (default HEAD,
  the commit recorded, so edits in the working tree do not move the figures): each file's last 10 % is
  held out; batches of 8 x 64 bytes at seeded random offsets of the rest, the same list for every
  configuration; LoRA rank 8, alpha 16 on q_proj / v_proj, SGD (--lr, --momentum), the causal LM loss
  (labels = the input ids);
- configurations: "pytorch+peft" (eager, float32), "edgetrain" (et.compile(..., loss="causal_lm",
  update=et.LoRA(...)), the C backend), "edgetrain-int4" (the same with frozen="int4": the base's linear
  and embedding weights in 4-bit groups of 32, docs/lora.md); the peft model loads edgetrain's initial
  adapters (prog.state_dict()), and the int4 program draws the same ones (the same seed);
- perplexity: exp of the mean next-byte cross entropy over every held-out window of 64 bytes (each
  window's 63 predictions), from each system's own logits (prog.predict; the peft model).

Goal (issue 32): the int4 base's perplexity after fine-tuning within 2 % of float32 LoRA's.
One JSON line per configuration (to --out when given) and a table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import lm_memory  # noqa: E402  (the causal LM's Logits wrapper and transformers' import)
from lm_memory import Logits  # noqa: E402

MODEL = dict(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384)
TINY = dict(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
VOCAB, PRE_BATCH, PRE_T, BATCH, T = 256, 16, 128, 8, 64
RANK, ALPHA, TARGETS = 8, 16, ("q_proj", "v_proj")


def _transformers():
    lm_memory._torchvision_schemas()
    import transformers

    return transformers


def make_lm(cfg: dict):
    tf = _transformers()
    c = tf.LlamaConfig(hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                       num_key_value_heads=cfg["kv_heads"], intermediate_size=cfg["intermediate"], vocab_size=VOCAB,
                       max_position_embeddings=PRE_T, tie_word_embeddings=True)
    c._attn_implementation = "eager"
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(c)


def stdlib_corpus(limit: int) -> np.ndarray:
    """The standard library's .py files (sorted, test suites left out), bytes, up to `limit`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, n = [], 0
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).parts
        if parts[0] in ("test", "site-packages") or "idle_test" in parts:
            continue
        b = p.read_bytes()
        out.append(b)
        n += len(b)
        if n >= limit:
            break
    return np.frombuffer(b"\n".join(out), dtype=np.uint8)


def docs_corpus(rev: str = "HEAD", held_out: float = 0.1):
    """(train bytes, held-out bytes, commit) of this repository's docs/*.md and README.md as of git
    revision `rev` (so edits in the working tree do not move the figures; "" reads the working
    tree): each file's last `held_out` fraction is held out."""
    def git(*args) -> bytes:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True).stdout

    if rev:
        commit = git("rev-parse", rev).decode().strip()
        names = sorted(n for n in git("ls-tree", "--name-only", commit, "docs/").decode().split("\n")
                       if n.endswith(".md")) + ["README.md"]
        files = [git("show", f"{commit}:{n}") for n in names]
    else:
        commit = "working tree"
        files = [p.read_bytes() for p in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]]
    train, test = [], []
    for b in files:
        cut = int(len(b) * (1 - held_out))
        train.append(b[:cut])
        test.append(b[cut:])
    return (np.frombuffer(b"\n".join(train), dtype=np.uint8), np.frombuffer(b"\n".join(test), dtype=np.uint8),
            commit)


def windows(data: np.ndarray, starts, t: int) -> np.ndarray:
    return np.stack([data[s:s + t] for s in starts]).astype(np.int64)


def pretrain(cfg: dict, steps: int, seconds: float, work: Path, corpus_bytes: int) -> tuple[Path, dict]:
    """The pretrained base's state dict (cached in `work`) and its facts: `steps` steps, or fewer
    when `seconds` (> 0) run out first."""
    key = hashlib.sha256(json.dumps([cfg, steps, seconds, corpus_bytes, PRE_BATCH, PRE_T]).encode()).hexdigest()[:12]
    path = work / f"pretrained-{key}.pt"
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return path, json.loads(meta.read_text())
    data = stdlib_corpus(corpus_bytes)
    lm = make_lm(cfg).train()
    opt = torch.optim.AdamW(lm.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(0)
    t0, step, losses = time.perf_counter(), 0, []
    limit = seconds if seconds > 0 else math.inf
    while step < steps and (elapsed := time.perf_counter() - t0) < limit:
        done = max(step / steps, elapsed / limit)
        for g in opt.param_groups:  # cosine from 3e-3 to 3e-4 over the steps (or the time budget)
            g["lr"] = 3e-4 + 0.5 * (3e-3 - 3e-4) * (1 + math.cos(math.pi * done))
        ids = torch.from_numpy(windows(data, rng.integers(0, len(data) - PRE_T, PRE_BATCH), PRE_T))
        loss = lm(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
        step += 1
    work.mkdir(parents=True, exist_ok=True)
    torch.save(lm.state_dict(), path)
    facts = {"pretrain_steps": step, "pretrain_s": round(time.perf_counter() - t0, 1),
             "pretrain_corpus_bytes": int(len(data)),
             "pretrain_loss_last100": round(float(np.mean(losses[-100:])), 4)}
    meta.write_text(json.dumps(facts))
    return path, facts


def base_model(cfg: dict, state: Path) -> Logits:
    lm = make_lm(cfg)
    lm.load_state_dict(torch.load(state))
    return Logits(lm.eval())


def perplexity(logits_fn, eval_ids: np.ndarray) -> float:
    """exp(mean next-byte cross entropy) over `eval_ids` (N, T), in batches of BATCH."""
    total, count = 0.0, 0
    for i in range(0, len(eval_ids), BATCH):
        x = eval_ids[i:i + BATCH]
        z = np.asarray(logits_fn(x), dtype=np.float64)[:, :-1]
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        total -= np.take_along_axis(logp, x[:, 1:, None], -1).sum()
        count += x[:, 1:].size
    return float(math.exp(total / count))


def run_peft(cfg, state, adapters: dict, batches, eval_ids, lr: float, momentum: float) -> dict:
    import peft

    lm = base_model(cfg, state).lm
    lm = peft.get_peft_model(lm, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                 target_modules=list(TARGETS)))
    res = peft.set_peft_model_state_dict(lm, {k.replace("base_model.model.lm.", "base_model.model.", 1): v
                                              for k, v in adapters.items()})
    if res.unexpected_keys:
        raise RuntimeError(f"edgetrain's adapters did not load into peft: {res.unexpected_keys[:3]}")
    lm.eval()  # dropout is 0; eval() only keeps transformers from caching

    def logits(x):
        with torch.no_grad():
            return lm(input_ids=torch.from_numpy(x)).logits.numpy()

    before = perplexity(logits, eval_ids)
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=lr, momentum=momentum)
    t0, losses = time.perf_counter(), []
    for x in batches:
        ids = torch.from_numpy(x)
        loss = lm(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    train_s = time.perf_counter() - t0
    return {"ppl_before": before, "ppl_after": perplexity(logits, eval_ids), "train_s": round(train_s, 2),
            "losses": losses}


def compile_lora(cfg, state, frozen, lr, momentum):
    import edgetrain as et

    x = np.zeros((BATCH, T), np.int64)
    return et.compile(base_model(cfg, state), (torch.from_numpy(x),), loss="causal_lm", backend="c", frozen=frozen,
                      update=et.LoRA(rank=RANK, alpha=ALPHA, targets=TARGETS),
                      optimizer=et.SGD(lr=lr, momentum=momentum))


def run_edgetrain(prog, batches, eval_ids) -> dict:
    before = perplexity(prog.predict, eval_ids)
    t0, losses = time.perf_counter(), []
    for x in batches:
        losses.append(float(prog.step(x, x)))
    train_s = time.perf_counter() - t0
    return {"ppl_before": before, "ppl_after": perplexity(prog.predict, eval_ids), "train_s": round(train_s, 2),
            "losses": losses}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pretrain-steps", type=int, default=1000)
    ap.add_argument("--pretrain-seconds", type=float, default=0.0,
                    help="stop pretraining earlier at this time (0: no limit, so the base does not depend on the "
                         "machine's speed)")
    ap.add_argument("--corpus-bytes", type=int, default=16 << 20, help="the most stdlib bytes pretrained on")
    ap.add_argument("--corpus-rev", default="HEAD",
                    help="the git revision the docs are read at ('': the working tree)")
    ap.add_argument("--steps", type=int, default=300, help="fine-tuning steps (batches of 8 x 64 bytes)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--eval-windows", type=int, default=0, help="at most this many held-out windows (0: all)")
    ap.add_argument("--configs", nargs="+", default=["pytorch+peft", "edgetrain", "edgetrain-int4"],
                    choices=("pytorch+peft", "edgetrain", "edgetrain-int4"))
    ap.add_argument("--tiny", action="store_true", help="a tiny model and short runs (tests)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (pretraining, the peer)")
    ap.add_argument("--work", default="/tmp/edgetrain-lora-accuracy")
    ap.add_argument("--out", default=None, help="append the JSON lines here (docs/results/lora-accuracy.jsonl)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = TINY if a.tiny else MODEL
    work = Path(a.work)
    state, pre = pretrain(cfg, a.pretrain_steps, a.pretrain_seconds, work, a.corpus_bytes)
    train, test, commit = docs_corpus(a.corpus_rev)
    rng = np.random.default_rng(1)
    batches = [windows(train, rng.integers(0, len(train) - T, BATCH), T) for _ in range(a.steps)]
    eval_ids = windows(test, range(0, len(test) - T + 1, T), T)
    if a.eval_windows:
        eval_ids = eval_ids[:a.eval_windows]
    eval_ids = eval_ids[:len(eval_ids) // BATCH * BATCH]
    head = {"model": {**cfg, "vocab": VOCAB, "tied": True}, **pre,
            "finetune_corpus": f"docs/*.md + README.md at {commit}", "finetune_corpus_bytes": int(len(train)),
            "held_out_bytes": int(len(test)), "eval_windows": int(len(eval_ids)), "batch": BATCH, "seq": T,
            "steps": a.steps, "lr": a.lr, "momentum": a.momentum, "lora": f"r{RANK} a{ALPHA} {','.join(TARGETS)}",
            "threads": a.threads}
    progs = {"edgetrain": None, "edgetrain-int4": "int4"}
    rows, adapters = [], None
    for name in ("edgetrain", "edgetrain-int4", "pytorch+peft"):  # the programs first: their adapters seed peft's
        if name not in a.configs and not (name == "edgetrain" and "pytorch+peft" in a.configs):
            continue
        if name == "pytorch+peft":
            r = run_peft(cfg, state, adapters, batches, eval_ids, a.lr, a.momentum)
        else:
            prog = compile_lora(cfg, state, progs[name], a.lr, a.momentum)
            initial = prog.state_dict()
            same = adapters is None or (initial.keys() == adapters.keys()
                                        and all(torch.equal(initial[k], adapters[k]) for k in initial))
            adapters = adapters or initial
            if name not in a.configs:
                continue
            r = {**run_edgetrain(prog, batches, eval_ids), "same_initial_adapters": same}
        loss = r.pop("losses")
        row = {**head, "config": name, **{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()},
               "loss_first": round(loss[0], 4), "loss_last20": round(float(np.mean(loss[-20:])), 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    ref = next((r["ppl_after"] for r in rows if r["config"] == "edgetrain"), None)
    print(f"\nbyte-level Llama {cfg}, pretrained {pre['pretrain_steps']} steps ({pre['pretrain_s']} s) on the "
          f"stdlib; "
          f"LoRA r{RANK} on {'/'.join(TARGETS)}, {a.steps} steps of {BATCH} x {T} bytes on the docs, "
          f"SGD lr {a.lr} momentum {a.momentum}; held-out {len(eval_ids)} x {T} bytes")
    print("| configuration | perplexity before | after | vs edgetrain float32 | train s |")
    print("|---|---|---|---|---|")
    for r in rows:
        rel = f"{100 * (r['ppl_after'] / ref - 1):+.2f} %" if ref else "-"
        print(f"| {r['config']} | {r['ppl_before']:.3f} | {r['ppl_after']:.3f} | {rel} | {r['train_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
