"""Capture an unmodified nn.Module with torch.export and translate it to our IR."""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch.export.graph_signature import ConstantArgument, InputKind

from ..ir import Graph, Role, TensorType, Value, new_value
from ..ops import Emitter, verify
from .aten_dynamic import MaskedRows, RunTimeCheck, TensorCheck, check_value, checked
from .check_source import check_text
from .converters import TORCH_DTYPES, convert_node
from .errors import CaptureError, UnsupportedOpError

#: aten ops kept whole instead of decomposed, because our op table has them directly (detach: its
#: decomposition is an alias, which loses the stop of the gradient)
KEEP_UNDECOMPOSED = ("linear", "scaled_dot_product_attention", "detach")


@dataclass(frozen=True)
class Captured:
    """A captured forward graph and the arrays its named inputs refer to."""

    graph: Graph
    params: dict[str, np.ndarray]  # parameters, in the order torch.export lists them
    frozen_params: tuple[str, ...]  # parameters with requires_grad=False
    buffers: dict[str, np.ndarray]  # buffers and lifted constants (read-only)
    inputs: tuple[str, ...]  # names of the user inputs
    #: node index -> where it comes from (`provenance`): the model source line and the submodule's path
    source: dict[int, str] = field(default_factory=dict)


def input_name(i: int) -> str:
    return f"input:{i}"


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


#: frames of torch's own modules (nn.Conv2d.forward, F.max_pool2d): not the model's line
_TORCH_DIR = str(__import__("pathlib").Path(torch.__file__).parent)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]+(?:\n(?!\s*File ")\s*([^\n]*))?')


def _frame(fx_node):
    """(path, line, code) of the model line that produced an fx node (the innermost frame
    outside torch's own modules), or None when torch recorded no stack."""
    frames = _FRAME.findall(fx_node.meta.get("stack_trace") or "")
    if not frames:
        return None
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    path, line, code = (user or frames)[-1]
    return path, line, code.strip()


def source_line(fx_node) -> str:
    """'file.py:LINE: code' of the model line that produced an fx node, if known."""
    frame = _frame(fx_node)
    if frame is None:
        return "unknown source line"
    path, line, code = frame
    return f"{path}:{line}: {code}" if code else f"{path}:{line}"


def module_path(fx_node) -> str:
    """'features.4: Conv2d': the innermost submodule whose forward produced an fx node
    (torch.export's nn_module_stack), or '' for an op of the model's own forward."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, kind = list(stack.values())[-1]
    if not str(path):
        return ""
    name = getattr(kind, "__name__", None) or str(kind).rsplit(".", 1)[-1].strip("'>")
    return f"{path}: {name}" if name else str(path)


def provenance(fx_node) -> str:
    """Where an fx node comes from: its model source line, with the path of the submodule
    that made it between the place and the code when the line does not name that module
    itself: 'net.py:12: [features.4: Conv2d] x = self.features(x)'. One line that calls an
    nn.Sequential covers all its layers, and a block's own lines all its instances; the path
    tells them apart. A line of the model's forward that calls the module by its path
    (`self.fc(x)` for fc) stays as it is."""
    frame, module = _frame(fx_node), module_path(fx_node)
    if not module:
        return source_line(fx_node)
    if frame is None:
        return f"unknown source line [{module}]"
    path, line, code = frame
    mod_path = module.split(": ", 1)[0]
    if re.search(rf"(?<![\w.])self\.{re.escape(mod_path)}(?!\w)", code):
        return source_line(fx_node)  # the line names the module: `x = self.fc(x)`
    return f"{path}:{line}: [{module}]" + (f" {code}" if code else "")


def _dtype(t) -> str:
    if t.dtype not in TORCH_DTYPES:
        raise CaptureError(f"tensors of dtype {t.dtype} are not supported")
    return TORCH_DTYPES[t.dtype]


#: torch.export's own deprecation notice (its pytree code, not the user's), printed on every
#: capture: silenced around the export so that it does not leak into every user script
TORCH_EXPORT_NOISE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def _export(model: torch.nn.Module, args: tuple):
    was_training = model.training
    model.eval()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=TORCH_EXPORT_NOISE, category=FutureWarning)
            return _export_decomposed(model, args)
    finally:
        model.train(was_training)


def _call_kwargs(model: torch.nn.Module) -> dict:
    """use_cache=False for a model whose forward takes it (a Hugging Face language model): its
    key/value cache is no output of a training step, and torch.export cannot return one."""
    import inspect

    try:
        takes = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"use_cache": False} if takes else {}


def _export_decomposed(model: torch.nn.Module, args: tuple):
    try:
        ep = torch.export.export(model, args, kwargs=_call_kwargs(model))
        table = torch.export.default_decompositions()
        for name in KEEP_UNDECOMPOSED:
            table.pop(getattr(torch.ops.aten, name).default, None)
        return ep.run_decompositions(table)
    except Exception as err:  # torch raises many types; the user needs to know it was capture
        raise CaptureError(f"torch.export could not capture {type(model).__name__}: "
                           f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err


def _fx_args(node) -> list:
    """The fx nodes among a node's arguments (nested lists included)."""
    out = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a))
    return out


def foldable(node, known: dict) -> bool:
    """Every input of the node is known at capture time (shapes, constants, buffers) and the op
    is deterministic: it is evaluated once during capture and never reaches the graph."""
    tags = getattr(node.target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags or torch.Tag.inplace_view in tags:
        return False
    return all(a.name in known for a in _fx_args(node))


#: allocations whose contents torch leaves undefined: evaluated as zeros, so that a constant
#: built from them (an empty tensor then filled) never carries whatever memory held
_UNDEFINED = {torch.ops.aten.empty.memory_format: torch.ops.aten.zeros.default,
              torch.ops.aten.empty_like.default: torch.ops.aten.zeros_like.default,
              torch.ops.aten.new_empty.default: torch.ops.aten.new_zeros.default,
              torch.ops.aten.new_empty_strided.default: torch.ops.aten.new_zeros.default}


def evaluate(node, known: dict):
    """Run one fx node with torch on its known inputs."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: known[a.name])
    target = node.target
    if target in _UNDEFINED:
        if target is torch.ops.aten.new_empty_strided.default:  # row-major values: the strides do not matter
            args = args[:2]
        target = _UNDEFINED[target]
        kwargs = {k: v for k, v in kwargs.items() if k != "memory_format" or target is not torch.ops.aten.zeros.default}
    elif target is torch.ops.aten.empty_strided.default:  # our values are row-major: the strides do not matter
        target, args = torch.ops.aten.zeros.default, args[:1]
    with torch.no_grad():
        return target(*args, **kwargs)


def constant_value(e: Emitter, t, array: Callable[[torch.Tensor], Value]):
    """A Value holding the capture-time constant `t`: a scalar `const` (broadcast when the
    tensor is one value repeated, as a mask of all True or a tensor of zeros), else
    `array(t)`, a read-only graph input holding it."""
    if not isinstance(t, torch.Tensor):
        return t  # a Python number or None: converters take those as they are
    dtype = _dtype(t)
    flat = t.detach().reshape(-1)
    if flat.numel() > 0 and bool((flat == flat[0]).all()):
        c = e.const(flat[0].item(), dtype)
        return c if t.dim() == 0 else e.emit("expand", c, shape=tuple(t.shape))
    return array(t)


def _array_input(t: torch.Tensor, name: str, inputs: list, buffers: dict) -> Value:
    """A graph input beside the buffers holding `t`, named after the fx node that computed it."""
    key = f"const:{name}"
    while key in buffers:
        key += "'"
    buffers[key] = to_numpy(t)
    v = new_value(TensorType(tuple(t.shape), _dtype(t)), key)
    inputs.append(v)
    return v


def _logits_of(ep, out_values):
    """[the `logits` leaf] when the model returned a ModelOutput or dict of several values with a
    key "logits" (a Hugging Face model's output); `out_values` otherwise."""
    spec = ep.call_spec.out_spec
    if out_values is None or len(out_values) < 2 or spec is None or not isinstance(spec.context, (list, tuple)) \
            or "logits" not in spec.context or len(spec.context) != len(spec.children_specs):
        return out_values
    start = 0
    for key, child in zip(spec.context, spec.children_specs):
        if key == "logits" and child.num_leaves == 1:
            return [out_values[start]]
        start += child.num_leaves
    return out_values


#: torch.export's message of a run-time assert: the expression it checks
_ASSERTED = re.compile(r"^Runtime assertion failed for expression (.+?) on node '[^']*'$", re.S)


def check_message(fx_node, torch_message: str) -> str:
    """The message of a run-time check of the model: the message of the model's own check call on
    the node's source line when it has one (torch._check(cond, lambda: "..."), transformers'
    torch_compilable_check(cond, "...")), else torch.export's; with the expression torch.export
    asserts and where it comes from (provenance)."""
    asserted = _ASSERTED.match(torch_message)
    frame = _frame(fx_node)
    text = check_text(frame[0], int(frame[1])) if frame is not None else None
    if text is None:
        return f"{torch_message} (at {provenance(fx_node)})"
    expr = f" {asserted.group(1)}" if asserted else ""
    return f"{text} (run-time check{expr} at {provenance(fx_node)})"


def _checked(e, ep, env: dict, out: Value, source: dict) -> Value:
    """`out` through the run-time checks of the model, in its order: torch.export's asserts on
    sizes known only at run time (aten_dynamic.RunTimeCheck: BART's eos count check) and what the
    gathers of masked rows need (MaskedRows.checks); each a `check` op (ops/check.py) that stops
    the program with its message where one fails."""
    checks, lines, seen = [], [], set()
    for node in ep.graph.nodes:
        found = env.get(node.name)
        before = len(e.nodes)
        if isinstance(found, RunTimeCheck):
            try:
                ok = check_value(e, found)
            except UnsupportedOpError as err:
                raise UnsupportedOpError(f"{err} (at {provenance(node)})") from None
            if ok is not None:
                checks.append((ok, check_message(node, found.message)))
                lines.append(provenance(node))
        elif isinstance(found, TensorCheck):
            checks.append((found.ok, f"{found.message} (at {provenance(node)})"))
            lines.append(provenance(node))
        elif isinstance(found, MaskedRows) and id(found) not in seen:  # (a view of it as itself: once)
            seen.add(id(found))
            checks += [(ok, f"{message} (at {provenance(node)})") for ok, message in found.checks]
            lines += [provenance(node)] * len(found.checks)
        for k in range(before, len(e.nodes)):
            source[k] = provenance(node)
    before = len(e.nodes)
    out = checked(e, checks, out)
    for k, line in zip(range(before, len(e.nodes)), lines):
        source[k] = line
    return out


def capture(model: torch.nn.Module, example_inputs: tuple) -> Captured:
    """Capture `model` (in eval mode: batch norm on running statistics, dropout off)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    args = tuple(torch.as_tensor(x) for x in example_inputs)
    ep = _export(model, args)
    sig = ep.graph_signature
    named_params = dict(model.named_parameters())
    state = {**ep.state_dict, **ep.constants}
    kinds = {s.arg.name: s for s in sig.input_specs}

    env: dict[str, Any] = {}
    shared: dict[tuple, Value] = {}  # (storage, shape, strides) of a parameter or buffer -> its value
    known: dict[str, Any] = {}  # fx name -> its value computed at capture time (torch tensors, numbers)
    inputs: list[Value] = []
    params, buffers, frozen = {}, {}, []
    data, learnable = set(), set()  # the inputs of role DATA and PARAMETER; every other one is FROZEN
    user_i = 0
    e = Emitter()
    source: dict[int, str] = {}
    out_values = None
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            spec = kinds[node.name]
            if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):  # use_cache=False
                known[node.name] = spec.arg.value
                continue
            if spec.kind == InputKind.USER_INPUT:
                t = args[user_i]
                v = new_value(TensorType(tuple(t.shape), _dtype(t)), input_name(user_i))
                data.add(v)
                user_i += 1
            else:
                t = state[spec.target]
                tied = shared.get((t.data_ptr(), tuple(t.shape), tuple(t.stride())))
                if tied is not None:  # a tied weight (GPT-2's lm_head is its wte): one value, gradients add up
                    env[node.name] = tied
                    if spec.kind == InputKind.BUFFER or spec.kind == InputKind.CONSTANT_TENSOR:
                        known[node.name] = t
                    continue
                v = new_value(TensorType(tuple(t.shape), _dtype(t)), spec.target)
                shared[(t.data_ptr(), tuple(t.shape), tuple(t.stride()))] = v
                if spec.kind == InputKind.PARAMETER:
                    params[spec.target] = to_numpy(t)
                    if not named_params.get(spec.target, t).requires_grad:
                        frozen.append(spec.target)
                    else:
                        learnable.add(v)
                else:
                    buffers[spec.target] = to_numpy(t)
                    known[node.name] = t  # read-only: what is computed from it alone is a constant
            inputs.append(v)
            env[node.name] = v
        elif node.op == "call_function":
            before = len(e.nodes)
            if foldable(node, known):
                try:
                    known[node.name] = evaluate(node, known)
                except Exception as err:  # torch's own error on a constant subgraph
                    raise CaptureError(f"cannot evaluate the constant {node.target} at {provenance(node)}: "
                                       f"{type(err).__name__}: {err}") from err
                continue

            def materialize(name, t):
                """A Value for the capture-time constant `t` (computed by fx node `name`, or
                derived from it by a converter), made once per node."""
                if t is known.get(name) and name in env:
                    return env[name]
                v = constant_value(e, t, lambda array: _array_input(array, name, inputs, buffers))
                if t is known.get(name):
                    env[name] = v
                return v

            try:
                env[node.name] = convert_node(e, node, env, known, materialize)
            except UnsupportedOpError as err:
                raise UnsupportedOpError(f"{err} (at {provenance(node)})") from None
            except (ValueError, KeyError, TypeError) as err:
                raise CaptureError(f"cannot translate {node.target} at {provenance(node)}: {err}") from err
            for k in range(before, len(e.nodes)):
                source[k] = provenance(node)
        elif node.op == "output":
            out_values = [env.get(a.name) if hasattr(a, "name") else a for a in node.args[0]]
    out_values = _logits_of(ep, out_values)
    if not out_values or len(out_values) != 1 or not isinstance(out_values[0], Value):
        raise CaptureError("the model must return exactly one tensor (its output), or a Hugging Face ModelOutput "
                           f"or dict with 'logits'; it returned {len(out_values or [])} values")
    out = _checked(e, ep, env, out_values[0], source)
    roles = tuple(Role.DATA if v in data else Role.PARAMETER if v in learnable else Role.FROZEN for v in inputs)
    g = Graph(tuple(inputs), tuple(e.nodes), (out,), ("output",), roles)
    verify(g)
    return Captured(g, params, tuple(frozen), buffers, tuple(input_name(i) for i in range(user_i)), source)
