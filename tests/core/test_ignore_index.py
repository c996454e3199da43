"""A class loss's ignore_index other than torch's -100 (a padding token's id, a segmentation's
void class 255): et.compile(ignore_index=...) or a torch loss module (nn.CrossEntropyLoss(
ignore_index=...)), the CLI's --ignore-index, torch.compile loops whose F.cross_entropy names
one, the label checks of the runners and of the standalone C trainer; against torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import edgetrain as et
from tests.core.test_losses_families import REF_TOL, C_TOL, SegNet, TinyLM, rel_err


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return loss.item(), {k: p.grad.detach().numpy().copy() for k, p in model.named_parameters()}


def _check(prog, model, x, y, want_fn, tol):
    want_loss, want = _grads(model, want_fn(model(x), y))
    got = prog.gradients(x, y)
    assert set(got) == set(want)
    for k in want:
        assert rel_err(got[k], want[k]) <= tol, (k, rel_err(got[k], want[k]))
    got_loss = prog.step(x, y)  # lr 0: the loss of these weights
    assert abs(got_loss - want_loss) <= tol * max(1.0, abs(want_loss)), (got_loss, want_loss)


def _seg_case(dtype, ignore):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 5, generator=g, dtype=dtype)
    y = torch.randint(0, 4, (2, 5, 5), generator=g)
    y[0, 1, :3] = ignore
    return SegNet().to(dtype), x, y


@pytest.mark.parametrize("backend,dtype,tol", [("reference", torch.float64, REF_TOL), ("c", torch.float32, C_TOL)])
@pytest.mark.parametrize("ignore", [255, 2])  # outside the classes (void), and one of them
def test_per_pixel_cross_entropy_with_its_own_ignore_index(backend, dtype, tol, ignore):
    torch.manual_seed(0)
    model, x, y = _seg_case(dtype, ignore)
    prog = et.compile(model, (x,), ignore_index=ignore, backend=backend, optimizer=et.SGD(lr=0.0))
    _check(prog, model, x, y, lambda o, t: F.cross_entropy(o, t, ignore_index=ignore), tol)
    # with the default -100 the same labels are counted (2) or refused (255): the index matters
    plain = et.compile(model, (x,), backend=backend, optimizer=et.SGD(lr=0.0))
    if ignore < 4:
        assert abs(plain.step(x, y) - prog.step(x, y)) > 1e-6
    else:
        with pytest.raises(ValueError, match="ignore_index -100"):
            plain.step(x, y)


def test_a_torch_loss_module_brings_its_ignore_index():
    torch.manual_seed(0)
    model = TinyLM().double()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 11, (2, 6), generator=g)
    y = torch.randint(1, 11, (2, 6), generator=g)
    y[:, -2:] = 0  # padding token 0
    crit = nn.CrossEntropyLoss(ignore_index=0)
    prog = et.compile(model, (ids,), loss=crit, optimizer=et.SGD(lr=0.0))
    assert (prog.loss, prog.compiled.ignore_index) == ("cross_entropy", 0)
    # (N, T, V) logits: torch's module puts the classes in dim 1, so a sequence is given as it
    # is computed: the name sequence_cross_entropy, with the same ignore_index
    seq = et.compile(model, (ids,), loss="sequence_cross_entropy", ignore_index=0, optimizer=et.SGD(lr=0.0))
    _check(seq, model, ids, y, lambda o, t: crit(o.reshape(-1, o.shape[-1]), t.reshape(-1)), REF_TOL)


@pytest.mark.parametrize("module,name", [(nn.MSELoss(), "mse"), (nn.L1Loss(), "l1"),
                                         (nn.BCEWithLogitsLoss(), "bce_with_logits")])
def test_torch_loss_modules_name_their_loss(module, name):
    from edgetrain.api import loss_spec

    assert loss_spec(module) == (name, -100)


@pytest.mark.parametrize("module,match", [
    (nn.CrossEntropyLoss(label_smoothing=0.1), "label_smoothing"),
    (nn.CrossEntropyLoss(weight=torch.ones(3)), "weight"),
    (nn.CrossEntropyLoss(reduction="sum"), "reduction='sum'"),
    (nn.BCEWithLogitsLoss(pos_weight=torch.ones(3)), "pos_weight"),
    (nn.NLLLoss(), "NLLLoss"),
])
def test_loss_modules_computed_otherwise_are_refused(module, match):
    with pytest.raises(ValueError, match=match):
        et.compile(nn.Linear(4, 3), (torch.randn(2, 4),), loss=module)


def test_conflicting_ignore_indices_are_refused():
    with pytest.raises(ValueError, match="differ"):
        et.compile(nn.Linear(4, 3), (torch.randn(2, 4),), loss=nn.CrossEntropyLoss(ignore_index=3), ignore_index=5)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        et.compile(nn.Linear(4, 3), (torch.randn(2, 4),), ignore_index=2.5)


def test_torch_compile_of_a_loss_with_an_ignore_index_gives_eagers_gradients():
    """torch.compile of a function computing F.cross_entropy(..., ignore_index=255): the
    ignore_index reaches edgetrain's cross entropy (it was refused), and the label check
    uses it."""
    from edgetrain.torch_backend import last_programs

    def loss_of(m, x, y):
        return F.cross_entropy(m(x), y, ignore_index=255)

    torch.manual_seed(0)
    model, x, y = _seg_case(torch.float32, 255)
    ref = SegNet()
    ref.load_state_dict(model.state_dict())
    step = torch.compile(loss_of, backend="edgetrain")
    got, want = step(model, x, y), loss_of(ref, x, y)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-5, atol=1e-6)
    ce = [n for n in last_programs()[-1].forward.nodes if n.op == "cross_entropy"]
    assert ce and all(n.attrs["ignore_index"] == 255 for n in ce)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\) or equal the ignore_index 255"):
        step(model, x, torch.full_like(y, 7))


def test_standalone_trainer_checks_labels_against_the_programs_ignore_index(tmp_path):
    from edgetrain.backends.c.project import label_defines

    model, x, y = _seg_case(torch.float32, 255)
    prog = et.compile(model, (x,), ignore_index=255)

    class Layout:  # label_defines reads the train graph only
        graphs = {"train": type("G", (), {"graph": prog.train_graph})()}

    assert "#define ET_LABEL_IGNORE (255)" in label_defines(prog, Layout)


def test_cli_ignore_index_reaches_the_program(tmp_path):
    from edgetrain.app.cli_config import config_from_options
    from edgetrain.app.cli import build_parser

    args = build_parser().parse_args(["compile", "docs/examples/digits.py:build", "--input", "2x1x28x28",
                                      "--ignore-index", "7", "-o", str(tmp_path / "o")])
    assert config_from_options(args, args.model).ignore_index == 7


def test_torch_compile_of_cross_entropy_on_n_c_l_logits():
    """F.cross_entropy on (N, C, L) logits (a 1-D segmenter, a sequence with the classes in dim 1)
    views the log_softmax as (N, C, L, 1) for nll_loss2d: recognised (it was refused), with
    eager's loss and gradients and its ignore_index."""
    from edgetrain.torch_backend import last_programs

    torch.manual_seed(0)
    model, ref = nn.Conv1d(4, 3, 3, padding=1), nn.Conv1d(4, 3, 3, padding=1)
    ref.load_state_dict(model.state_dict())
    x, y = torch.randn(2, 4, 7), torch.randint(0, 3, (2, 7))
    y[0, 2] = 9

    def loss_of(m, x, y):
        return F.cross_entropy(m(x), y, ignore_index=9)

    got, want = torch.compile(loss_of, backend="edgetrain")(model, x, y), loss_of(ref, x, y)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-5, atol=1e-6)
    assert "cross_entropy" in [n.op for n in last_programs()[-1].forward.nodes]
