"""Frozen weights stored below float32: `et.compile(..., frozen="int8" | "int4")`.

`quantize_frozen` (the pipeline's "frozen_quantized" step, after the trained selection is
known) stores every frozen linear / embedding weight quantized in ops/qweights.py's layout
(int8 per output channel; int4 in groups of 32 inputs) and reads it through linear_qw /
embedding_qw, which dequantize on the fly (the backward's input gradient through matmul_qw):
the float weight is not in the program any more. Which weights: `quantizable` says, the one
rule `dequantized` applies too, so the PyTorch model it returns computes with exactly the
values the program computes with.
"""
from __future__ import annotations

import copy
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from ..ir import Graph, Node, Role, TensorType, Value, new_value
from ..ops import verify
from ..ops.qweights import dequantize, packed_cols, quantize_weight, scale_shape

FROZEN = (None, "int8", "int4")
#: frozen mode -> bits per stored weight element
BITS = {"int8": 8, "int4": 4}
#: the suffixes of a quantized weight's two state entries
Q_SUFFIX, SCALE_SUFFIX = ".q", ".scale"
_FLOATS = ("float32", "float64")
#: graph input roles a quantized weight may have (a parameter not trained, or a frozen one)
_WEIGHT_ROLES = (Role.PARAMETER, Role.FROZEN)


def _bits(mode: str) -> int:
    if mode not in BITS:
        raise ValueError(f"frozen={mode!r}: use 'int8' or 'int4' (or None for float32 frozen weights)")
    return BITS[mode]


def _weight_operand(n: Node, v: Value) -> bool:
    """Whether node `n` reads `v` as its weight only: a linear's weight or an embedding's table."""
    if n.op == "linear":
        return n.inputs[1] is v and v not in n.inputs[:1] + n.inputs[2:]
    if n.op == "embedding":
        return n.inputs[0] is v and n.inputs[1] is not v
    return False


def quantizable(g: Graph, trainable: Mapping) -> tuple[Value, ...]:
    """The weights `quantize_frozen` stores quantized, in input order: every rank-2 float input
    (a parameter or a frozen tensor) not in `trainable` whose every use is the weight of a
    `linear` or the table of an `embedding` (a tied embedding and LM head: one weight, both
    uses); a weight read anywhere else, or a graph output, stays float."""
    users = g.consumers()
    outputs = set(g.outputs)
    return tuple(v for v, r in zip(g.inputs, g.roles)
                 if r in _WEIGHT_ROLES and v.name not in trainable and v.type.rank == 2 and v.dtype in _FLOATS
                 and v not in outputs and users.get(v) and all(_weight_operand(n, v) for n in users[v]))


def _rewrite(n: Node, v: Value, wq: Value, scale: Value, bits: int) -> Node:
    attrs = {"bits": bits, "in_features": v.shape[1]}
    if n.op == "linear":
        return Node("linear_qw", (n.inputs[0], wq, scale) + n.inputs[2:], n.outputs, attrs)
    return Node("embedding_qw", (n.inputs[1], wq, scale), n.outputs, dict(attrs, dtype=v.dtype))


def quantize_frozen(g: Graph, state: Mapping[str, np.ndarray], trainable: Mapping, mode: str
                    ) -> tuple[Graph, dict[str, np.ndarray], Callable]:
    """`g` with every `quantizable` weight read from its quantized form (inputs `<name>.q`, int8,
    and `<name>.scale`, float32, both of role frozen, in the weight's place), the state holding
    those forms instead of the float weights, and the export: state -> the state under the
    original names, each quantized weight dequantized in its original dtype (what the program
    computes with), its two entries dropped."""
    bits = _bits(mode)
    chosen = quantizable(g, trainable)
    new_state = dict(state)
    stored: dict[Value, tuple[Value, Value]] = {}
    for v in chosen:
        names = (v.name + Q_SUFFIX, v.name + SCALE_SUFFIX)
        taken = [k for k in names if k in new_state]
        if taken:
            raise ValueError(f"frozen={mode!r}: the model already has a tensor named {taken[0]!r}")
        out, n = v.shape
        wq = new_value(TensorType((out, packed_cols(n, bits)), "int8"), names[0])
        sc = new_value(TensorType(scale_shape(out, n, bits), "float32"), names[1])
        new_state[names[0]], new_state[names[1]] = quantize_weight(new_state.pop(v.name), bits)
        stored[v] = (wq, sc)
    inputs, roles = [], []
    for v, r in zip(g.inputs, g.roles):
        pair = stored.get(v)
        inputs += list(pair) if pair else [v]
        roles += [Role.FROZEN, Role.FROZEN] if pair else [r]
    nodes = []
    for node in g.nodes:
        w = next((v for v in node.inputs if v in stored and _weight_operand(node, v)), None)
        nodes.append(_rewrite(node, w, *stored[w], bits) if w is not None else node)
    out = verify(g.replace(inputs=tuple(inputs), roles=tuple(roles), nodes=tuple(nodes)))
    layout = {v.name: (v.shape[1], v.dtype) for v in chosen}

    def export(st: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        res = dict(st)
        for name, (n, dtype) in layout.items():
            q, s = res.pop(name + Q_SUFFIX), res.pop(name + SCALE_SUFFIX)
            res[name] = dequantize(q, s, bits, n, dtype=np.dtype(dtype))
        return res

    return out, new_state, export


def dequantized(model, frozen: Optional[str], example_inputs: Sequence, update=None):
    """A deep copy of `model` in which exactly the weights that `et.compile(model, example_inputs,
    update=update, frozen=frozen)` stores quantized hold the values its program computes with
    (each w -> dequantize(quantize(w)), rounded to the weight's dtype as ops/qweights.py's
    `dequantize`); every other tensor as it is. `update` defaults to et.Full(): the weights
    with requires_grad=False; under et.LoRA(...) every base linear / embedding weight. The
    capture decides (the same rule as the compiler's, on the same graph), so it needs the
    example inputs; frozen=None returns a plain copy. Use it to check a program against
    torch.autograd: its gradients, loss and outputs are those of this model."""
    import torch

    from ..frontend import capture
    from ..trainable import Full

    twin = copy.deepcopy(model)
    if frozen is None:
        return twin
    bits = _bits(frozen)
    update = Full() if update is None else update
    graph, trainable = _selection(capture(model, tuple(example_inputs)), update)
    chosen = quantizable(graph, trainable)
    tensors = {**dict(twin.named_parameters(remove_duplicate=False)), **dict(twin.named_buffers())}
    with torch.no_grad():
        for v in chosen:
            if v.name not in tensors:
                raise KeyError(f"dequantized: the program's weight {v.name!r} is not a tensor of the model")
            t = tensors[v.name]
            q, s = quantize_weight(t.detach().cpu().numpy(), bits)
            w = dequantize(q, s, bits, v.shape[1], dtype=np.dtype(str(t.dtype).replace("torch.", "")))
            t.copy_(torch.from_numpy(w))
    return twin


def _selection(cap, update):
    """(graph, trained selection) of a captured model under `update`, as the pipeline's train
    phase resolves it (pipeline.select_trainable): under LoRA the adapters are added first and
    are all it trains; otherwise the scheme resolved on the captured layers, frozen parameters
    (requires_grad=False) never trained. (A float program's front is its capture.)"""
    from ..trainable import LoRA, add_adapters, find_layers, resolve_scheme

    if isinstance(update, LoRA):
        graph, _, names = add_adapters(cap.graph, {**cap.params, **cap.buffers}, update)
        return graph, {n: None for n in names}
    layers = find_layers(cap.graph, set(cap.params))
    return cap.graph, resolve_scheme(update, layers, dict(cap.params), set(cap.frozen_params))
