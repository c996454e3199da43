"""insert_updates on small hand-built graphs: each `grad:<p>` output becomes an in-place
update of `p` (sgd_update for a float parameter, qsgd_update with a `step` input for an
integer one), the updated parameter and its momentum buffer become outputs; the graph
verifies, keeps computing what it computed before, and applies SGD as PyTorch does."""
from __future__ import annotations

import numpy as np

from edgetrain.autodiff import ChannelSelect
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, Role, TensorType, new_value
from edgetrain.ops import Emitter, verify
from edgetrain.ops.qoptim import uniform_hash
from edgetrain.passes.updates import INT_RANGES, STEP, insert_updates, momentum_name

LR, MOMENTUM = 0.1, 0.9


def grad_graph(w_type, grad_shape):
    """Inputs w and x; outputs loss = w * w (float) or a copy of x, and grad:w = -x."""
    w = new_value(w_type, "w")
    x = new_value(TensorType(grad_shape, "float32" if w_type.dtype in INT_RANGES else w_type.dtype), "x")
    e = Emitter()
    loss = e.emit("neg", x) if w_type.dtype in INT_RANGES or grad_shape != w_type.shape else e.emit("mul", w, w)
    gw = e.emit("neg", x)
    return Graph((w, x), tuple(e.nodes), (loss, gw), ("loss", "grad:w"), (Role.PARAMETER, Role.DATA))


def _run(g, feeds):
    return run_graph(g, {k: np.array(v, copy=True) for k, v in feeds.items()})[0]


def test_a_float_parameter_with_momentum():
    rng = np.random.default_rng(0)
    g = verify(grad_graph(TensorType((3, 2), "float64"), (3, 2)))
    u = verify(insert_updates(g, {"w": None}, LR, momentum=MOMENTUM))
    assert [n.op for n in u.nodes] == [n.op for n in g.nodes] + ["sgd_update"]
    assert u.output_names == ("loss", "w", momentum_name("w"))
    assert [v.name for v in u.inputs] == ["w", "x", "momentum:w"]
    assert u.input("momentum:w").type == u.input("w").type
    assert u.roles == (Role.PARAMETER, Role.DATA, Role.OPTIMIZER_STATE)
    assert u.owner(u.input("momentum:w")) is u.input("w")
    feeds = {name: rng.standard_normal((3, 2)) for name in ("w", "x", "momentum:w")}
    before, after = _run(g, feeds), _run(u, feeds)
    np.testing.assert_array_equal(after["loss"], before["loss"])  # computed before the update overwrote w
    m = MOMENTUM * feeds["momentum:w"] + before["grad:w"]  # torch.optim.SGD: buf = momentum * buf + grad
    np.testing.assert_allclose(after["momentum:w"], m, rtol=1e-15)
    np.testing.assert_allclose(after["w"], feeds["w"] - LR * m, rtol=1e-15)


def test_without_momentum_no_buffer():
    g = grad_graph(TensorType((3, 2), "float32"), (3, 2))
    u = verify(insert_updates(g, {"w": None}, LR, weight_decay=0.01))
    assert [v.name for v in u.inputs] == ["w", "x"] and u.output_names == ("loss", "w")
    feeds = {"w": np.ones((3, 2), np.float32), "x": np.full((3, 2), 2.0, np.float32)}
    np.testing.assert_allclose(_run(u, feeds)["w"], 1 - LR * (-2.0 + 0.01 * 1), rtol=1e-6)


def test_selected_channels_only():
    """A ChannelSelect: the gradient has the selected rows only; the other rows stay."""
    rng = np.random.default_rng(1)
    g = verify(grad_graph(TensorType((4, 2), "float64"), (2, 2)))
    u = verify(insert_updates(g, {"w": ChannelSelect(0, (0, 2))}, LR, momentum=MOMENTUM))
    assert u.input("momentum:w").shape == (2, 2)
    (upd,) = [n for n in u.nodes if n.op == "sgd_update"]
    assert upd.attrs["dim"] == 0 and upd.attrs["index"] == (0, 2)
    feeds = {"w": rng.standard_normal((4, 2)), "x": rng.standard_normal((2, 2)), "momentum:w": np.zeros((2, 2))}
    w = _run(u, feeds)["w"]
    np.testing.assert_array_equal(w[[1, 3]], feeds["w"][[1, 3]])
    np.testing.assert_allclose(w[[0, 2]], feeds["w"][[0, 2]] + LR * feeds["x"], rtol=1e-15)


def test_an_int8_parameter_gets_qsgd_and_a_step_input():
    rng = np.random.default_rng(2)
    g = verify(grad_graph(TensorType((4, 3), "int8"), (4, 3)))
    scale = (1.0, 2.0, 0.5, 4.0)
    u = verify(insert_updates(g, {"w": None}, LR, grad_scales={"w": scale}, seed=7))
    (upd,) = [n for n in u.nodes if n.op == "qsgd_update"]
    assert u.input(STEP).type == TensorType((), "int32") and upd.inputs[2] is u.input(STEP)
    assert u.role(u.input(STEP)) is Role.STEP
    assert upd.attrs["scale"] == scale and upd.attrs["seed"] == 7 and upd.attrs["param_id"] == 0
    assert (upd.attrs["qmin"], upd.attrs["qmax"]) == INT_RANGES["int8"]
    w0 = rng.integers(-127, 128, (4, 3)).astype(np.int8)
    x = (rng.standard_normal((4, 3)) * 20).astype(np.float32)
    out = _run(u, {"w": w0, "x": x, STEP: np.array(5, np.int32)})
    # w' = clamp(floor(w - lr * scale[c] * g + u)) in float32, u from (seed, param, step, element)
    noise = uniform_hash(7, 0, 5, np.arange(w0.size)).reshape(w0.shape)
    v = w0.astype(np.float32) - np.float32(LR) * (np.asarray(scale, np.float32)[:, None] * -x)
    np.testing.assert_array_equal(out["w"], np.clip(np.floor(v + noise), -127, 127).astype(np.int8))
    np.testing.assert_array_equal(out["loss"], -x)
