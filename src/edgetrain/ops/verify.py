"""The IR verifier: single assignment, defined before use, re-inferred types, no read
after an in-place overwrite, a consistent role for every graph input. Tests run it after
every pass."""
from __future__ import annotations

from ..ir import Graph, Role, Value
from ..ir.roles import SINGLE_ROLES
from ..ir.printer import format_value, number_values
from .base import get_op


class VerificationError(ValueError):
    pass


def verify(g: Graph) -> Graph:
    """Check `g` and return it unchanged; raise VerificationError naming the node otherwise.
    Values are named as `str(g)` prints them (numbered per graph)."""
    def fmt(v):  # only on an error: numbering the values costs a pass over the graph
        return format_value(v, number_values(g))

    defined = set()
    names = set()
    for v in g.inputs:
        if v in defined:
            raise VerificationError(f"graph input {fmt(v)} listed twice")
        if not v.name or v.name in names:
            raise VerificationError(f"graph input {fmt(v)} needs a unique name")
        names.add(v.name)
        defined.add(v)
    check_roles(g, fmt)
    clobbered: dict[Value, int] = {}  # value -> the node that wrote over it in place
    for i, n in enumerate(g.nodes):
        where = f"node {i} ({n.op})"
        try:
            opdef = get_op(n.op)
        except KeyError as err:
            raise VerificationError(f"{where}: {err}") from None
        lo_hi = opdef.num_inputs
        if lo_hi and not (lo_hi[0] <= len(n.inputs) and (lo_hi[1] is None or len(n.inputs) <= lo_hi[1])):
            raise VerificationError(f"{where}: takes {lo_hi} operands, got {len(n.inputs)}")
        for v in n.inputs:
            if v not in defined:
                raise VerificationError(f"{where}: uses {fmt(v)} before it is defined")
            if v in clobbered:
                raise VerificationError(f"{where}: reads {fmt(v)} after node {clobbered[v]} overwrote it in place")
        try:
            types = opdef.infer([v.type for v in n.inputs], n.attrs)
        except (ValueError, KeyError, TypeError) as err:
            raise VerificationError(f"{where}: shape rule failed: {err}") from None
        if [t for t in types] != [o.type for o in n.outputs]:
            raise VerificationError(f"{where}: outputs {[str(o.type) for o in n.outputs]} but the shape rule "
                                    f"gives {[str(t) for t in types]}")
        for o in n.outputs:
            if o in defined:
                raise VerificationError(f"{where}: assigns {fmt(o)} a second time")
            defined.add(o)
        if opdef.mutates:
            for _, j in opdef.shares:
                if j < len(n.inputs):
                    clobbered[n.inputs[j]] = i
    for name, v in zip(g.output_names, g.outputs):
        if v not in defined:
            raise VerificationError(f"output {name} = {fmt(v)} is never defined")
        if v in clobbered:
            raise VerificationError(f"output {name} = {fmt(v)} was overwritten in place by node {clobbered[v]}")
    if len(set(g.output_names)) != len(g.output_names):
        raise VerificationError("output names must be unique")
    return g


#: the type of the step counter input (ops/qoptim.py's qsgd_update reads it)
STEP_DTYPE, STEP_SHAPE = "int32", ()


def check_roles(g: Graph, fmt) -> None:
    """Every input has a role; at most one label, step and page store; the step is an int32
    scalar and the page store a flat byte array; every optimizer-state input belongs to one
    parameter input, and only those have an owner. `fmt` names a value as the graph prints it."""
    if len(g.roles) != len(g.inputs) or not all(isinstance(r, Role) for r in g.roles):
        raise VerificationError(f"{len(g.inputs)} graph inputs need one ir.Role each, got {g.roles!r}")
    for role in SINGLE_ROLES:
        found = g.inputs_with(role)
        if len(found) > 1:
            raise VerificationError(f"a graph has at most one {role.value} input, got "
                                    f"{', '.join(fmt(v) for v in found)}")
    step = g.inputs_with(Role.STEP)
    if step and (step[0].dtype, step[0].shape) != (STEP_DTYPE, STEP_SHAPE):
        raise VerificationError(f"step input {fmt(step[0])} must be an {STEP_DTYPE} scalar, got {step[0].type}")
    store = g.inputs_with(Role.PAGE_STORE)
    if store and store[0].type.rank != 1:
        raise VerificationError(f"page store input {fmt(store[0])} must be one flat array, got {store[0].type}")
    role_of = g.roles_by_input()
    owners: dict = {}
    for state, param in g.owners:
        if role_of.get(state) is not Role.OPTIMIZER_STATE:
            raise VerificationError(f"{fmt(state)} has an owning parameter but is not an optimizer-state input")
        if state in owners:
            raise VerificationError(f"optimizer state {fmt(state)} belongs to two parameters")
        if role_of.get(param) is not Role.PARAMETER:
            raise VerificationError(f"optimizer state {fmt(state)} belongs to {fmt(param)}, which is not a "
                                    f"parameter input of the graph")
        owners[state] = param
    orphans = [v for v in g.inputs_with(Role.OPTIMIZER_STATE) if v not in owners]
    if orphans:
        raise VerificationError(f"optimizer state {fmt(orphans[0])} names no parameter it belongs to")
