"""AOTAutograd's forward and backward FX graphs -> edgetrain graphs: the forward, the
backward (only the requested gradients, dead code eliminated), and the training step (both
in one node order) that the memory plan is made for."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ..frontend.capture import CaptureError
from ..ir import Graph, Node, TensorType, Value, new_value
from ..ops import verify
from ..passes import eliminate_dead_code
from ..sparse import find_layers, resolve_scheme
from ..sparse.schemes import SchemeError
from .options import Named
from .translate import Transposed, Translator, Unused, torch_dtype_name


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
    """The translation of one AOTAutograd compilation: `forward` (its outputs: the user
    outputs, then the saved values the backward reads), `backward` and `step`."""

    def __init__(self, flat: list[FlatInput], update, fw_gm: torch.fx.GraphModule, n_user: int):
        self.flat = flat
        holders = placeholders(fw_gm)
        if len(holders) != len(flat):
            raise CaptureError(f"AOTAutograd's forward graph takes {len(holders)} inputs, the Dynamo graph "
                               f"{len(flat)} (aliased or duplicated inputs are not supported)")
        t = Translator()
        self.fw_bind: list[tuple[int, Value]] = []  # (flat index, forward graph input)
        for i, (node, f) in enumerate(zip(holders, flat)):
            if f.kind == "number":
                t.env[node.name] = f.value
                continue
            v = new_value(meta_type(node), f.name)
            t.env[node.name] = v
            self.fw_bind.append((i, v))
        self.fw_inputs = {v: i for i, v in self.fw_bind}
        self.out_nodes = list(fw_gm.graph.output_node().args[0])
        self.all_entries = t.run(fw_gm.graph)  # per output: Value, Transposed, Unused, number or None
        self.n_user = n_user
        self.fw_nodes = tuple(t.e.nodes)
        self.labels = {v: c for v, c in t.labels.items() if v in self.fw_inputs}  # checked at each run
        self.trainable = self._resolve(update, Graph(tuple(self.fw_inputs), self.fw_nodes, (), ()))
        self.forward, self.entries = self._forward_graph(keep=None)
        self.backward: Optional[Graph] = None
        self.step: Optional[Graph] = None

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

    def ram_names(self) -> list[str]:
        return [f.name for f in self.flat if f.kind == "input"]

    # -- forward -------------------------------------------------------------------------------
    def _forward_graph(self, keep: Optional[set]) -> tuple[Graph, list]:
        """The forward graph returning the user outputs and the saved values named in `keep`
        (all when None); the others become Unused placeholders."""
        entries, outs, names = [], [], []
        for k, (node, entry) in enumerate(zip(self.out_nodes, self.all_entries)):
            name = getattr(node, "name", str(k))
            if k >= self.n_user and keep is not None and name not in keep:
                entry = Unused(f"saved value {name}, which the backward does not read")
            entries.append(entry)
            v = entry_value(entry)
            if isinstance(v, Value) and v not in self.fw_inputs and v not in outs:
                outs.append(v)
                names.append(f"out:{name}")
        g = Graph(tuple(self.fw_inputs), self.fw_nodes, tuple(outs), tuple(names))
        return verify(eliminate_dead_code(g)), entries

    # -- backward ------------------------------------------------------------------------------
    def add_backward(self, bw_gm: torch.fx.GraphModule) -> None:
        """Translate the backward graph: gradients of the trained parameters (and of inputs
        that need them) only; the forward then keeps only the saved values it reads."""
        t = Translator({n: s for n, s in self.trainable.items() if s is not None})
        by_name = {getattr(n, "name", None): e for n, e in zip(self.out_nodes, self.all_entries)}
        self.sub: dict[Value, Value] = {}  # backward graph input -> the forward value it is
        self.feed: list[tuple[str, Optional[Value]]] = []  # per backward FX input: how to bind it
        self.tangents: list[Value] = []
        mine: dict[Value, Value] = {}  # forward value -> backward graph input

        def bw_value(v: Value, label: str) -> Value:
            if v not in mine:
                mine[v] = new_value(v.type, v.name if v in self.fw_inputs else f"saved:{label}")
                self.sub[mine[v]] = v
            return mine[v]

        for node in placeholders(bw_gm):
            if node.name.startswith("tangents"):
                v = new_value(meta_type(node), f"tangent:{len(self.tangents)}")
                self.tangents.append(v)
                t.env[node.name] = v
                self.feed.append(("value", v))
                continue
            if node.name not in by_name:
                raise CaptureError(f"backward input {node.name} is not an output of the forward graph")
            entry = by_name[node.name]
            if isinstance(entry, (Value, Transposed)):
                inner = bw_value(entry_value(entry), node.name)
                t.env[node.name] = inner if isinstance(entry, Value) else Transposed(inner)
                self.feed.append(("value" if isinstance(entry, Value) else "transposed", inner))
            else:  # Unused, a number, None
                t.env[node.name] = entry
                self.feed.append(("skip", None))
        grads = t.run(bw_gm.graph)
        if len(grads) != len(self.flat):
            raise CaptureError(f"the backward graph returns {len(grads)} gradients for {len(self.flat)} inputs")
        outs, names, self.grad_names = [], [], []
        for f, g in zip(self.flat, grads):
            if g is None or (f.kind == "param" and f.name not in self.trainable):
                self.grad_names.append(None)  # not trained: no gradient (torch leaves .grad None)
                continue
            v = t.value(g)
            sel = self.trainable.get(f.name)
            if sel is not None and v.shape == tuple(f.value.shape):  # not narrowed by its VJP
                v = t.e.emit("index_select", v, dim=sel.dim, index=sel.index)
            outs.append(v)
            names.append(f"grad:{f.name}")
            self.grad_names.append(names[-1])
        body = eliminate_dead_code(Graph((), tuple(t.e.nodes), tuple(outs), tuple(names)))
        used = {v for n in body.nodes for v in n.inputs} | set(outs)
        self.backward = verify(body.replace(inputs=tuple(v for v in list(self.sub) + self.tangents if v in used)))
        read = {self.sub.get(v) for v in self.backward.inputs}
        keep = {name for name, e in by_name.items() if entry_value(e) in read}
        self.forward, self.entries = self._forward_graph(keep)
        self.step = self._step_graph()

    def bw_ram_names(self) -> list[str]:
        """Backward inputs in RAM: saved activations, data and tangents (not weights)."""
        kinds = {v: self.flat[i].kind for v, i in self.fw_inputs.items()}
        return [v.name for v in self.backward.inputs if kinds.get(self.sub.get(v), "input") == "input"]

    def _step_graph(self) -> Graph:
        """Forward then backward in one node order, the backward reading the forward's values."""
        def m(v):
            return self.sub.get(v, v)

        bw_nodes = tuple(Node(n.op, tuple(m(v) for v in n.inputs), n.outputs, n.attrs) for n in self.backward.nodes)
        user, names = [], []
        for k, e in enumerate(self.entries[:self.n_user]):
            v = entry_value(e)
            if isinstance(v, Value) and v not in self.fw_inputs and v not in user:
                user.append(v)
                names.append(f"out:{k}")
        return verify(Graph(self.forward.inputs + tuple(self.tangents), self.forward.nodes + bw_nodes,
                            tuple(user) + tuple(m(v) for v in self.backward.outputs),
                            tuple(names) + self.backward.output_names))
