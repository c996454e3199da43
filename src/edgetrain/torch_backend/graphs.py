"""AOTAutograd's forward FX graph -> the edgetrain forward graph, and the flat inputs it
takes (parameters, buffers, the call's arguments) with their model names."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ..frontend.capture import CaptureError
from ..ir import Graph, Node, Role, TensorType, Value, new_value
from ..ops import verify
from ..passes import eliminate_dead_code
from ..trainable import SchemeError, find_layers, resolve_scheme
from .options import Named
from . import translate_losses  # noqa: F401  (registers the loss converters)
from .translate import Transposed, Translator, torch_dtype_name

#: the buffer a train-mode batch norm counts its batches in (torch's _BatchNorm)
TRACKED = "num_batches_tracked"


@dataclass(frozen=True)
class FlatInput:
    """One of AOTAutograd's flat inputs (its graphs' `primals`)."""

    kind: str  # "param", "buffer", "input" (data, or an activation from an earlier graph), "number"
    name: str  # a parameter's or buffer's name as in the model; "input:<k>" for the others
    value: Any  # the tensor or number of the call that compiled
    array: Optional[np.ndarray] = None  # a parameter's value (read outside AOTAutograd's fake mode)


def source_name(node) -> str:
    """Dynamo's source of a graph input, e.g. "L['self']._modules['fc']._parameters['weight']"."""
    src = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(src, "name", None)
    name = name() if callable(name) else name
    return name if isinstance(name, str) else ""


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def flat_inputs(gm: torch.fx.GraphModule, sources: list[tuple[str, str]], args) -> list[FlatInput]:
    """AOTAutograd's flat inputs: the module's own parameters and buffers, then the call's
    arguments (`sources`: each placeholder's name and Dynamo source), with names and kinds."""
    out = [FlatInput("param", n, p) for n, p in gm.named_parameters(remove_duplicate=False)]
    out += [FlatInput("buffer", n, b) for n, b in gm.named_buffers(remove_duplicate=False)]
    data = 0
    for (holder, src), a in zip(sources, args):
        path = ".".join(re.findall(r"_(?:modules|parameters|buffers)\['([^']+)'\]", src)) or holder
        if not isinstance(a, torch.Tensor):
            out.append(FlatInput("number", holder, a))
        elif isinstance(a, torch.nn.Parameter) or "_parameters[" in src:
            out.append(FlatInput("param", path, a))
        elif "_buffers[" in src:
            out.append(FlatInput("buffer", path, a))
        else:
            out.append(FlatInput("input", f"input:{data}", a))
            data += 1
    seen: dict[str, int] = {}
    for i, f in enumerate(out):  # graph input names must be unique
        k = seen.get(f.name, 0)
        seen[f.name] = k + 1
        out[i] = FlatInput(f.kind, f"{f.name}#{k}" if k else f.name, f.value,
                           to_numpy(f.value) if f.kind == "param" else None)
    return out


def placeholders(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def meta_type(node) -> TensorType:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"graph input {node.name} is not a tensor")
    return TensorType(tuple(int(d) for d in val.shape), torch_dtype_name(val.dtype))


def entry_value(e):
    """The Value an output entry stands for (a Transposed one's matrix), else the entry."""
    return e.value if isinstance(e, Transposed) else e


class AotGraphs:
    """The translation of AOTAutograd's forward (inference) graph of one Dynamo graph: `forward`
    returns the Dynamo graph's outputs (`entries`, one per output: a Value, Transposed, Unused,
    number or None) and the new values of the inputs it mutates (`mutations`: (flat index,
    Value), a train-mode batch norm's buffers), which AOTAutograd's graph returns first."""

    def __init__(self, flat: list[FlatInput], update, fw_gm: torch.fx.GraphModule, mutated: tuple[int, ...] = (),
                 random: bool = True):
        self.flat = flat
        holders = placeholders(fw_gm)
        if len(holders) != len(flat):
            raise CaptureError(f"AOTAutograd's forward graph takes {len(holders)} inputs, the Dynamo graph "
                               f"{len(flat)} (aliased or duplicated inputs are not supported)")
        t = Translator(random)
        self.fw_bind: list[tuple[int, Value]] = []  # (flat index, forward graph input)
        #: integer buffers the graph reads but never writes (index tables, masks), known when it
        #: is translated as at capture: flat index -> their values then (`stale` checks them)
        self.known_buffers: dict[int, torch.Tensor] = {}
        for i, (node, f) in enumerate(zip(holders, flat)):
            if f.kind == "number":
                t.env[node.name] = t.known[node.name] = f.value
                continue
            v = new_value(meta_type(node), f.name)
            t.env[node.name] = v
            self.fw_bind.append((i, v))
            if f.kind == "buffer" and i not in mutated and not f.value.dtype.is_floating_point:
                self.known_buffers[i] = t.known[node.name] = f.value.detach().clone()
        self.fw_inputs = {v: i for i, v in self.fw_bind}
        outs = t.run(fw_gm)
        self.mutations: list[tuple[int, Value]] = []
        for i, e in zip(mutated, outs[:len(mutated)]):
            if not isinstance(e, Value) or flat[i].kind == "number":
                raise CaptureError(f"the graph writes its input {flat[i].name} with a value edgetrain does not compute")
            self.mutations.append((i, e))
        self.entries = outs[len(mutated):]
        self.constants = {v.name: a for v, a in t.constants.items()}  # tensors converters made (a causal mask)
        self.draws = t.draws  # random tensors torch draws at each call, in graph order (dropout's masks)
        self.inputs = tuple(self.fw_inputs) + tuple(t.constants) + tuple(d.value for d in t.draws)
        # the random draws are fed on every call, as data is
        self.roles = (tuple(self._role(i, set(mutated)) for i, _ in self.fw_bind) + (Role.FROZEN,) * len(t.constants)
                      + (Role.DATA,) * len(t.draws))
        self.labels = {v: c for v, c in t.labels.items() if v in self.fw_inputs}  # checked at each run
        nodes = self._fold_batch_counts(tuple(t.e.nodes))
        self.trainable = self._resolve(update, Graph(self.inputs, nodes, (), (), self.roles))
        self.forward = self._forward_graph(nodes)

    def _fold_batch_counts(self, nodes: tuple) -> tuple:
        """A train-mode batch norm's `num_batches_tracked + 1` (an int64 add of the graph) moved
        into its batch_norm_update_stats, which counts the batch in place (as et.compile's step
        does): one op writes all of the module's statistics, and no int64 arithmetic is left."""
        producer = {o: n for n in nodes for o in n.outputs}
        updates = {n.inputs[0].name: n for n in nodes if n.op == "batch_norm_update_stats" and len(n.inputs) == 3}
        replaced, dropped = {}, set()
        for k, (i, v) in enumerate(self.mutations):
            name = self.flat[i].name
            add = producer.get(v)
            if not name.endswith(TRACKED) or add is None or add.op != "add":
                continue
            upd = updates.get(name[:-len(TRACKED)] + "running_mean")
            one = producer.get(add.inputs[1])
            if (upd is None or upd in replaced or add.inputs[0].name != name or one is None or one.op != "const"
                    or one.attrs["value"] != 1):
                continue
            count = new_value(v.type, name)
            replaced[upd] = Node(upd.op, upd.inputs + (add.inputs[0],), upd.outputs + (count,), upd.attrs)
            dropped.add(add)
            self.mutations[k] = (i, count)
        return tuple(replaced.get(n, n) for n in nodes if n not in dropped)

    def _role(self, i: int, mutated: set) -> Role:
        """The role of flat input `i`: a parameter (frozen without requires_grad), a buffer
        (a running statistic when the graph writes it), else data."""
        f = self.flat[i]
        if f.kind == "param":
            return Role.PARAMETER if f.value.requires_grad else Role.FROZEN
        if f.kind == "buffer":
            return Role.RUNNING_STAT if i in mutated else Role.FROZEN
        return Role.DATA

    # -- which parameters train --------------------------------------------------------------
    def _resolve(self, update, g: Graph) -> dict:
        params = {f.name: f.array for f in self.flat if f.kind == "param"}
        frozen = {f.name for f in self.flat if f.kind == "param" and not f.value.requires_grad}
        if not set(params) - frozen:
            return {}
        if isinstance(update, Named):
            return {n: None for n in params if n in update.names and n not in frozen}
        try:
            return resolve_scheme(update, find_layers(g, set(params)), params, frozen)
        except SchemeError as err:
            if "trains no parameter" in str(err):  # a graph (between graph breaks) without the scheme's layers
                return {}
            raise

    def stale(self, tensors: list) -> bool:
        """Whether a buffer known at translation has changed since (the graphs hold its values)."""
        return any(not torch.equal(tensors[i], was) for i, was in self.known_buffers.items())

    def ram_names(self) -> list[str]:
        """The per-call inputs: data (and activations of an earlier graph) and random draws."""
        return [f.name for f in self.flat if f.kind == "input"] + [d.value.name for d in self.draws]

    def draw(self) -> dict:
        """This call's random tensors, by input name, drawn in the graph's order."""
        return {d.value.name: to_numpy(d.draw()) for d in self.draws}

    def written(self) -> list[str]:
        """The inputs the forward writes in place (stored in RAM, as trained weights are)."""
        return [self.flat[i].name for i, _ in self.mutations]

    def _forward_graph(self, nodes) -> Graph:
        """Outputs `out:<k>` (each Dynamo output computed here, once), then `mutated:<name>`."""
        outs, names = [], []
        for k, e in enumerate(self.entries):
            v = entry_value(e)
            if isinstance(v, Value) and v not in self.fw_inputs and v not in outs:
                outs.append(v)
                names.append(f"out:{k}")
        for i, v in self.mutations:
            outs.append(v)
            names.append(f"mutated:{self.flat[i].name}")
        g = Graph(self.inputs, nodes, tuple(outs), tuple(names), self.roles)
        return verify(eliminate_dead_code(g))
