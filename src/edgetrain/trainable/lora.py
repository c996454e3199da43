"""LoRA: low-rank adapters added to the captured graph, the only tensors trained.

`LoRA(rank, alpha, targets, dropout)` is an update scheme. For each linear (and conv) layer
whose module name is one of `targets` or ends with "." + one of them, `add_adapters` rewrites
y = layer(x) into y = layer(x) + B(A(x)) * (alpha / rank) in the IR, as peft's LoRA layers
compute it: A (rank, in) initialised as peft does (kaiming-uniform, a=sqrt(5), i.e. uniform in
+-1/sqrt(fan_in)), B (out, rank) zero; for a convolution A is a convolution with the layer's
kernel, stride and padding and B a 1x1 convolution (peft's conv adapters). The adapters are new
parameter inputs named `<module>.lora_A.weight` / `<module>.lora_B.weight`; the base weights are
frozen whatever their requires_grad says (the trained selection is the adapters alone).

`peft_state_dict` gives the adapters under peft's key names, `merge_adapters` the base weights
with W + scaling * B @ A merged in (what `Program.state_dict` / `merged_state_dict` return).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from ..ir import Graph, Node, Role, TensorType, Value, new_value
from ..ops import Emitter

#: the suffixes of an adapter's two parameter names (peft's, less its adapter name "default")
A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"
#: a base layer's weight parameter name: <module> + WEIGHT_SUFFIX
WEIGHT_SUFFIX = ".weight"
#: what peft's get_peft_model_state_dict puts before a module name
PEFT_PREFIX = "base_model.model."
#: graph-input roles a base weight may have (requires_grad=False parameters are FROZEN)
BASE_ROLES = (Role.PARAMETER, Role.FROZEN)
#: how many of the model's layer names a "no target matched" error lists
LISTED_LAYERS = 12


class LoRAError(ValueError):
    """A LoRA scheme that cannot apply to this model (no target matched, a bad rank)."""


@dataclass(frozen=True)
class LoRA:
    """Train low-rank adapters on the layers whose module names end with one of `targets`."""

    rank: int = 8
    alpha: float = 16
    targets: tuple = ("q_proj", "v_proj")
    dropout: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets) if not isinstance(self.targets, str)
                           else (self.targets,))
        if not isinstance(self.rank, int) or self.rank < 1:
            raise LoRAError(f"LoRA needs rank >= 1, got {self.rank!r}")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise LoRAError(f"LoRA targets must be non-empty module-name suffixes, got {self.targets!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise LoRAError(f"LoRA dropout must lie in [0, 1), got {self.dropout!r}")

    @property
    def scaling(self) -> float:
        return float(self.alpha) / self.rank

    def matches(self, module: str) -> bool:
        """Whether `module` is a target: equal to one, or ending with "." + one (peft's rule)."""
        return any(module == t or module.endswith("." + t) for t in self.targets)


@dataclass(frozen=True)
class _Site:
    """A layer an adapter can go on: its node, its weight parameter and the module it belongs to."""

    node: Node
    weight: Value  # the parameter input (conv1d: the (O, C, K) weight the conv reads a view of)
    module: str


def _sites(g: Graph) -> list[_Site]:
    """The linear / conv2d nodes whose weight is a parameter input named <module>.weight, in order.
    A conv1d is a conv2d reading a (O, C, 1, K) reshape of its (O, C, K) weight (frontend)."""
    roles = g.roles_by_input()
    producers = g.producers()
    out = []
    for n in g.nodes:
        if n.op not in ("linear", "conv2d") or len(n.inputs) < 2:
            continue
        w = n.inputs[1]
        src = producers.get(w)
        if n.op == "conv2d" and src is not None and src.op == "reshape" and src.inputs[0].type.rank == 3:
            w = src.inputs[0]  # conv1d
        if roles.get(w) in BASE_ROLES and w.name.endswith(WEIGHT_SUFFIX):
            out.append(_Site(n, w, w.name[:-len(WEIGHT_SUFFIX)]))
    return out


def _refuse_adapted(g: Graph) -> None:
    """A model that has LoRA adapters already (a peft model) takes update=et.Full()."""
    have = [v.name for v in g.inputs if ".lora_A." in v.name or ".lora_B." in v.name]
    if have:
        raise LoRAError(f"the model has LoRA adapters already ({have[0]!r}, {len(have)} in all: a peft model?); "
                        f"compile it with update=et.Full(): its requires_grad flags train only its adapters")


def _no_match(g: Graph, sites: list[_Site], scheme: LoRA) -> LoRAError:
    users = g.consumers()
    own = [s for s in sites if len(users.get(s.weight, ())) == 1]
    others = sum(1 for n in g.nodes if n.op in ("linear", "conv2d")) - len(own)
    why = (f"; {others} linear / conv node(s) read a weight that is not theirs alone (tied to another layer's, "
           f"as an lm_head tied to the embedding, used twice, or computed) and take no adapter" if others else "")
    if not own:
        quant = any(n.op.startswith("q") for n in g.nodes)
        why += (" (quantize='int8' programs have no float layers: use frozen='int8' for a quantized base)"
                if quant else "")
        return LoRAError(f"LoRA targets {scheme.targets} matched no layer: the model has no linear or conv layer "
                         f"whose weight is its own parameter{why}")
    names = list(dict.fromkeys(s.module.rsplit(".", 1)[-1] for s in own))
    shown = ", ".join(repr(n) for n in names[:LISTED_LAYERS]) + (", ..." if len(names) > LISTED_LAYERS else "")
    return LoRAError(f"LoRA targets {scheme.targets} matched no linear or conv layer; the model's layers end with "
                     f"{shown} (e.g. {own[0].module!r}): name module-name suffixes among these{why}")


def _check_site(site: _Site, users: Mapping[Value, list]) -> None:
    n, w = site.node, site.weight
    if len(users.get(w, ())) > 1:
        raise LoRAError(f"LoRA target {site.module!r}: its weight {w.name!r} is shared by "
                        f"{len(users[w])} nodes (tied weights, e.g. an lm_head tied to the embedding); "
                        f"an adapter on it would change every user: leave it out of targets")
    if n.op == "conv2d":
        if n.attrs["groups"] != 1:
            raise LoRAError(f"LoRA target {site.module!r} is a grouped convolution (groups={n.attrs['groups']}): "
                            f"conv adapters need groups=1 (peft cannot merge grouped ones either)")
        if tuple(n.attrs["dilation"]) != (1, 1):
            raise LoRAError(f"LoRA target {site.module!r} is a dilated convolution "
                            f"(dilation={tuple(n.attrs['dilation'])}): peft's conv adapter has no dilation, "
                            f"so its A would not match the layer's output; leave it out of targets")
    if w.dtype not in ("float32", "float64"):
        raise LoRAError(f"LoRA target {site.module!r}: its weight is {w.dtype}, adapters need a float layer")


def _init_A(shape: tuple, dtype: str, gen) -> np.ndarray:
    """peft's A: nn.init.kaiming_uniform_(a=sqrt(5)), uniform in +-1/sqrt(fan_in), drawn from `gen`."""
    import torch

    t = torch.empty(shape, dtype=getattr(torch, dtype))
    torch.nn.init.kaiming_uniform_(t, a=math.sqrt(5), generator=gen)
    return t.numpy()


def _emit_adapter(e: Emitter, n: Node, site: _Site, a: Value, b: Value, scaling: float) -> Value:
    """y + B(A(x)) * scaling after node `n` (output y), as peft's forward computes it."""
    x = n.inputs[0]
    if n.op == "linear":
        h = e.emit("linear", e.emit("linear", x, a), b)
    else:
        a4, b4 = a, b
        if a.type.rank == 3:  # conv1d: (r, C, K) and (O, r, 1) viewed as 2-d kernels
            a4 = e.emit("reshape", a, shape=(a.shape[0], a.shape[1], 1, a.shape[2]))
            b4 = e.emit("reshape", b, shape=b.shape + (1,))
        geo = dict(n.attrs)
        one = dict(geo, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
        h = e.emit("conv2d", e.emit("conv2d", x, a4, **geo), b4, **one)
    return e.emit("add", n.out, e.emit("mul", h, e.const(scaling, n.out.dtype)))


def add_adapters(g: Graph, state: Mapping[str, np.ndarray], scheme: LoRA,
                 seed: int = 0) -> tuple[Graph, dict[str, np.ndarray], tuple[str, ...]]:
    """`g` with an adapter on every targeted layer, the state with the adapters' initial
    values added, and the adapters' parameter names (the tensors the scheme trains).
    A is drawn from a torch.Generator seeded with `seed`, layer after layer in graph order."""
    import torch

    if not isinstance(scheme, LoRA):
        raise TypeError(f"add_adapters takes an edgetrain.LoRA, got {type(scheme).__name__}")
    _refuse_adapted(g)
    if scheme.dropout:
        raise LoRAError(f"LoRA dropout={scheme.dropout}: a compiled training step draws no random masks, so "
                        f"adapter dropout is not supported; use dropout=0.0")
    sites = _sites(g)
    chosen = {s.node.outputs[0]: s for s in sites if scheme.matches(s.module)}  # by output: nodes get rebuilt
    if not chosen:
        raise _no_match(g, sites, scheme)
    users = g.consumers()
    for s in chosen.values():
        _check_site(s, users)
    gen = torch.Generator().manual_seed(int(seed))
    e, subst = Emitter(), {}
    added: dict[Value, Role] = {}
    new_state = dict(state)
    for n in g.nodes:
        if any(v in subst for v in n.inputs):
            n = Node(n.op, tuple(subst.get(v, v) for v in n.inputs), n.outputs, n.attrs)
        e.nodes.append(n)
        site = chosen.get(n.outputs[0]) if n.outputs else None
        if site is None:
            continue
        w, r = site.weight, scheme.rank
        a_shape, b_shape = (r,) + w.shape[1:], (w.shape[0], r) + (1,) * (w.type.rank - 2)
        a = new_value(TensorType(a_shape, w.dtype), site.module + A_SUFFIX)
        b = new_value(TensorType(b_shape, w.dtype), site.module + B_SUFFIX)
        for v in (a, b):
            if v.name in new_state:
                raise LoRAError(f"LoRA: the model already has a tensor named {v.name!r}")
        new_state[a.name] = _init_A(a_shape, w.dtype, gen)
        new_state[b.name] = np.zeros(b_shape, dtype=w.dtype)
        added.update({a: Role.PARAMETER, b: Role.PARAMETER})
        subst[n.out] = _emit_adapter(e, n, site, a, b, scheme.scaling)
    out = g.with_inputs(added).replace(nodes=tuple(e.nodes), outputs=tuple(subst.get(v, v) for v in g.outputs))
    return out, new_state, tuple(v.name for v in added)


# --- export --------------------------------------------------------------------------------
def adapter_modules(names) -> list[str]:
    """The modules carrying adapters, from the adapters' parameter names, in order."""
    return list(dict.fromkeys(n[:-len(A_SUFFIX)] for n in names if n.endswith(A_SUFFIX)))


def _strip(module: str, prefix: Optional[str]) -> str:
    if not prefix:
        return module
    if not module.startswith(prefix):
        raise LoRAError(f"prefix={prefix!r}: the adapted module {module!r} does not start with it")
    return module[len(prefix):]


def peft_state_dict(state: Mapping[str, np.ndarray], names, prefix: Optional[str] = None) -> dict:
    """{peft key: array} of the adapters `names` in `state`: `base_model.model.<module>.lora_A.weight`
    and `.lora_B.weight` (what peft.get_peft_model_state_dict gives and set_peft_model_state_dict /
    PeftModel.from_pretrained read), `prefix` (the attribute a wrapper holds the peft-wrapped
    model under, e.g. "m.") stripped from each module name."""
    out = {}
    for m in adapter_modules(names):
        key = PEFT_PREFIX + _strip(m, prefix)
        out[key + A_SUFFIX] = state[m + A_SUFFIX]
        out[key + B_SUFFIX] = state[m + B_SUFFIX]
    return out


def delta_weight(a: np.ndarray, b: np.ndarray, scaling: float) -> np.ndarray:
    """What peft's merge adds to the base weight: (B @ A) * scaling, for a convolution
    sum_r B[o, r] A[r, i, ...] (A's kernel, B 1x1), shaped as the base weight."""
    r = a.shape[0]
    d = b.reshape(b.shape[0], r) @ a.reshape(r, -1)
    return (d * np.asarray(scaling, dtype=a.dtype)).reshape((b.shape[0],) + a.shape[1:]).astype(a.dtype)


def merge_adapters(base: Mapping[str, np.ndarray], adapters: Mapping[str, np.ndarray], names,
                   scaling: float) -> dict[str, np.ndarray]:
    """`base` (state by name) with each adapted weight `<module>.weight` replaced by
    W + delta_weight(A, B) (the adapters read from `adapters`)."""
    out = dict(base)
    for m in adapter_modules(names):
        w = m + WEIGHT_SUFFIX
        if w not in out:
            raise LoRAError(f"merge: the adapted weight {w!r} is not in the program's state")
        out[w] = (np.asarray(out[w]) + delta_weight(adapters[m + A_SUFFIX], adapters[m + B_SUFFIX], scaling)
                  ).astype(np.asarray(out[w]).dtype)
    return out
