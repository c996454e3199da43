"""Graph-input roles: kept by Graph (through replace), printed, checked by the verifier; and
read, not parsed from names, by what a compiled program's graphs feed to the planners."""
from __future__ import annotations

import pytest

from edgetrain.ir import Graph, Node, Role, TensorType, new_value, ram_inputs
from edgetrain.ops import verify
from edgetrain.ops.verify import VerificationError

F = TensorType((2, 3), "float32")


def update_graph(momentum: bool = True, step: bool = False):
    """x, label, w (parameter), b (frozen)[, momentum of w][, step]: y = x * w + b, w updated."""
    x, label, w, b = new_value(F, "x"), new_value(F, "label"), new_value(F, "w"), new_value(F, "b")
    m, s = new_value(F, "momentum:w"), new_value(TensorType((), "int32"), "step")
    t, y, loss = new_value(F), new_value(F), new_value(F)
    nodes = [Node("mul", (x, w), (t,)), Node("add", (t, b), (y,)), Node("sub", (y, label), (loss,))]
    inputs, roles = [x, label, w, b], [Role.DATA, Role.LABEL, Role.PARAMETER, Role.FROZEN]
    owners = ()
    outs, names = [loss], ["loss"]
    if momentum:
        w2, m2 = new_value(F, "w"), new_value(F, "momentum:w")
        nodes.append(Node("sgd_update", (w, loss, m), (w2, m2), {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0,
                                                                 "dim": 0, "index": None}))
        inputs.append(m)
        roles.append(Role.OPTIMIZER_STATE)
        owners = ((m, w),)
        outs, names = [loss, w2, m2], ["loss", "w", "momentum:w"]
    if step:
        inputs.append(s)
        roles.append(Role.STEP)
    return Graph(tuple(inputs), tuple(nodes), tuple(outs), tuple(names), tuple(roles), owners)


def test_inputs_default_to_data():
    a, b = new_value(F, "a"), new_value(F, "b")
    t = new_value(F)
    g = Graph((a, b), (Node("add", (a, b), (t,)),), (t,), ("out",))
    assert g.roles == (Role.DATA, Role.DATA)
    assert ram_inputs(g) == {"a", "b"}


def test_lookups():
    g = verify(update_graph(step=True))
    x, label, w, b, m, s = g.inputs
    assert g.role(w) is Role.PARAMETER and g.role(b) is Role.FROZEN
    assert g.inputs_with(Role.PARAMETER, Role.FROZEN) == (w, b)
    assert g.the_input(Role.LABEL) is label and g.the_input(Role.PAGE_STORE) is None
    assert g.owner(m) is w
    assert ram_inputs(g) == {"x", "label", "step"}, "data, label and step live in RAM; state does not"
    with pytest.raises(KeyError):
        g.role(new_value(F, "x"))  # the same name is not the same input


def test_roles_are_kept_through_replace():
    g = update_graph()
    x, label, w, b, m = g.inputs
    r = g.replace(inputs=(m, b, w, x, label), nodes=g.nodes[:])
    assert [r.role(v) for v in r.inputs] == [Role.OPTIMIZER_STATE, Role.FROZEN, Role.PARAMETER, Role.DATA,
                                             Role.LABEL]
    assert r.owners == ((m, w),)
    assert g.replace(nodes=g.nodes[:2]).roles == g.roles
    dropped = g.replace(inputs=(x, label, b, m))  # the parameter goes: its state has no owner left
    assert dropped.owners == ()
    with pytest.raises(VerificationError, match="names no parameter"):
        verify(dropped.replace(nodes=(), outputs=(), output_names=()))


def test_a_new_input_needs_its_role():
    g = update_graph(momentum=False)
    store = new_value(TensorType((64,), "int8"), "page:store")
    with pytest.raises(KeyError, match="give the role"):
        g.replace(inputs=g.inputs + (store,))
    paged = g.with_inputs({store: Role.PAGE_STORE})
    assert paged.the_input(Role.PAGE_STORE) is store and paged.roles[:-1] == g.roles
    verify(paged)


def test_roles_are_printed():
    text = str(update_graph())
    lines = text.splitlines()
    assert lines[1:6] == ["    %0<x> : f32[2,3],  # data",
                          "    %1<label> : f32[2,3],  # label",
                          "    %2<w> : f32[2,3],  # parameter",
                          "    %3<b> : f32[2,3],  # frozen",
                          "    %4<momentum:w> : f32[2,3],  # optimizer state of %2<w>"]


def test_graph_refuses_malformed_roles():
    a = new_value(F, "a")
    with pytest.raises(ValueError, match="1 inputs but 2 roles"):
        Graph((a,), (), (), (), (Role.DATA, Role.LABEL))
    with pytest.raises(TypeError, match="ir.Role"):
        Graph((a,), (), (), (), ("data",))


def _with_roles(g: Graph, roles, owners=None) -> Graph:
    return g.replace(roles=tuple(roles), owners=g.owners if owners is None else tuple(owners))


def test_verifier_rejects_two_labels():
    g = update_graph(momentum=False)
    with pytest.raises(VerificationError, match=r"at most one label input, got %0<x>, %1<label>"):
        verify(_with_roles(g, [Role.LABEL, Role.LABEL, Role.PARAMETER, Role.FROZEN]))


def test_verifier_rejects_two_steps_and_a_step_of_another_type():
    g = update_graph(momentum=False, step=True)
    with pytest.raises(VerificationError, match="at most one step input"):
        verify(_with_roles(g, [Role.DATA, Role.LABEL, Role.STEP, Role.FROZEN, Role.STEP]))
    with pytest.raises(VerificationError, match=r"step input %0<x> must be an int32 scalar, got f32\[2,3\]"):
        verify(_with_roles(g, [Role.STEP, Role.LABEL, Role.PARAMETER, Role.FROZEN, Role.DATA]))


def test_verifier_rejects_a_page_store_that_is_not_flat():
    g = update_graph(momentum=False)
    with pytest.raises(VerificationError, match="page store input %3<b> must be one flat array"):
        verify(_with_roles(g, [Role.DATA, Role.LABEL, Role.PARAMETER, Role.PAGE_STORE]))


def test_verifier_rejects_inconsistent_optimizer_state():
    g = update_graph()
    x, label, w, b, m = g.inputs
    with pytest.raises(VerificationError, match=r"optimizer state %4<momentum:w> names no parameter"):
        verify(_with_roles(g, g.roles, owners=()))
    with pytest.raises(VerificationError, match=r"belongs to %3<b>, which is not a parameter input"):
        verify(_with_roles(g, g.roles, owners=[(m, b)]))
    with pytest.raises(VerificationError, match=r"%3<b> has an owning parameter but is not an optimizer-state"):
        verify(_with_roles(g, g.roles, owners=[(m, w), (b, w)]))
    with pytest.raises(VerificationError, match="belongs to two parameters"):
        verify(_with_roles(g, g.roles, owners=[(m, w), (m, w)]))
    outsider = new_value(F, "w")
    with pytest.raises(VerificationError, match="which is not a parameter input"):
        verify(_with_roles(g, g.roles, owners=[(m, outsider)]))


def test_verifier_rejects_an_input_without_a_role():
    """Graph's constructor refuses it; a graph altered behind its back is caught by the verifier."""
    g = update_graph(momentum=False)
    object.__setattr__(g, "roles", g.roles[:-1])
    with pytest.raises(VerificationError, match="4 graph inputs need one ir.Role each"):
        verify(g)
