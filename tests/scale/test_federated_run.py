"""Federated runs: the serial run equals a hand-made FedAvg of the same client updates; Flower's
simulation (3 clients, 2 rounds, 200 MNIST images on a local Ray of 2 workers)
equals the serial run bit for bit; the CLI writes its per-round figures and, without Flower,
exits 2 saying how to install it."""
import json
import sys

import numpy as np
import pytest

from edgetrain.app.cli import main
from edgetrain.federated import (FederatedJob, FlowerMissing, require_flower, run_centralized, run_flower, run_serial,
                                 setup_of)
from edgetrain.federated.rounds import initial_values

JOB = FederatedJob("digitnet", "mnist", clients=3, rounds=2, partition="dirichlet:0.5", train_images=120,
                   test_images=40, batch=8, local_steps=2, lr=0.05, momentum=0.5, backend="reference")


def hand_fedavg(job: FederatedJob) -> dict:
    """The run written out: each client from the global tensors with zero momentum, its steps
    numbered past the earlier (round, client) pairs', then the sample-weighted mean of the real
    values w_scale * q (biases x_scale * w_scale * q), rounded half to even, clamped."""
    s = setup_of(job)
    prog = s.prog.replace()  # a program of its own
    scale = {}
    for layer in prog.quant_layers.values():
        scale[layer.weight] = np.asarray(layer.w_scales, np.float64)
        scale[layer.bias] = layer.x.scale * np.asarray(layer.w_scales, np.float64)
    glob = initial_values(s)
    for rnd in (1, 2):
        sent, counts = [], []
        for k in range(job.clients):
            prog.load_state(prog.compiled.fresh_state(), steps=((rnd - 1) * job.clients + k) * job.local_steps)
            prog.load_trained(glob)
            rng = np.random.default_rng([job.seed, 0xC11E, rnd, k])
            shard = s.shards[k]
            need = job.local_steps * job.batch
            idx = np.concatenate([shard[rng.permutation(len(shard))] for _ in range(-(-need // len(shard)))])[:need]
            for b in range(job.local_steps):
                i = idx[b * job.batch:(b + 1) * job.batch]
                prog.step(s.train.batch(i, s.shape, s.mean, s.std), s.train.labels[i])
            sent.append({n: t.values for n, t in prog.trained_tensors().items()})
            counts.append(len(shard))
        new = {}
        for name, t in prog.trained_tensors().items():
            sc = scale[name]
            if t.index is not None and t.dim == 0:
                sc = sc[list(t.index)]
            sc = sc.reshape((-1,) + (1,) * (t.values.ndim - 1))
            real = sum(n / sum(counts) * c[name].astype(np.float64) * sc for n, c in zip(counts, sent))
            lo, hi = (-127, 127) if t.values.dtype == np.int8 else (-(2 ** 24), 2 ** 24)
            new[name] = np.clip(np.rint(real / sc), lo, hi).astype(t.values.dtype)
        glob = new
    return glob


def test_serial_run_equals_hand_fedavg():
    res = run_serial(JOB)
    want = hand_fedavg(JOB)
    assert list(res.values) == list(want)
    for name in want:
        assert np.array_equal(res.values[name], want[name]), name
    assert [r.round for r in res.rounds] == [0, 1, 2]
    assert all(0 <= r.accuracy <= 1 for r in res.rounds)
    first = initial_values(setup_of(JOB))
    assert any(not np.array_equal(first[n], res.values[n]) for n in first)  # training moved something
    assert sorted(len(s) for s in setup_of(JOB).shards) == sorted(res.shard_sizes) and sum(res.shard_sizes) == 120


def test_centralized_baseline_takes_the_federations_sample_steps():
    res = run_centralized(JOB)
    prog = setup_of(JOB).prog
    assert [r.round for r in res.rounds] == [0, 1, 2] and res.shard_sizes == [120]
    # 3 clients x 2 local steps per round, on one program whose step count runs on
    assert prog.steps == JOB.rounds * JOB.clients * JOB.local_steps
    trained = prog.trained_tensors()
    assert all(np.array_equal(trained[n].values, v) for n, v in res.values.items())  # the final values reported
    first = initial_values(setup_of(JOB))
    assert any(not np.array_equal(first[n], res.values[n]) for n in first)


def test_cli_serial_run_writes_per_round_figures(tmp_path, capsys):
    out = tmp_path / "fl.json"
    code = main(["federate", "digitnet", "--serial", "--clients", "2", "--rounds", "1", "--data", "mnist",
                 "--train-images", "40", "--test-images", "20", "--local-steps", "1", "--backend", "reference",
                 "--partition", "iid", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    d = json.loads(out.read_text())
    assert [r["round"] for r in d["rounds"]] == [0, 1]
    r1 = d["rounds"][1]
    assert 0 < r1["client_bytes"] < r1["model_bytes"] and d["shard_sizes"] == [20, 20]
    assert "of the model" in capsys.readouterr().out


def test_cli_bad_partition_is_a_usage_error(capsys):
    code = main(["federate", "digitnet", "--data", "mnist", "--partition", "dirichlet:0", "--serial"])
    assert code == 2 and "dirichlet:ALPHA" in capsys.readouterr().err


def test_without_flower_the_command_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flwr", None)  # `import flwr` now raises ImportError
    with pytest.raises(FlowerMissing, match=r'pip install -e "\.\[scale\]"'):
        require_flower()
    assert main(["federate", "digitnet", "--data", "mnist", "--clients", "2", "--rounds", "1"]) == 2
    assert 'pip install -e ".[scale]"' in capsys.readouterr().err


@pytest.mark.slow
def test_flower_simulation_equals_the_serial_run():
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    job = FederatedJob("digitnet", "mnist", clients=3, rounds=2, partition="dirichlet:0.5", train_images=200,
                       test_images=60, batch=8, local_steps=2, lr=0.05, momentum=0.5, backend="reference")
    fed = run_flower(job, workers=2)
    ref = run_serial(job)
    assert list(fed.values) == list(ref.values)
    for name in ref.values:
        assert np.array_equal(fed.values[name], ref.values[name]), name
    assert [(r.round, r.accuracy, r.loss, r.client_bytes) for r in fed.rounds] == \
        [(r.round, r.accuracy, r.loss, r.client_bytes) for r in ref.rounds]


def test_federate_explains_itself(capsys):
    with pytest.raises(SystemExit) as e:
        main(["federate", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: edgetrain federate")
    assert "  edgetrain federate " in out and "exit codes:" in out and "rounding half to even" in out.replace("\n", " ")
