"""A user's own model for the command line: `path/to/model.py:factory` or a zoo name, and
its example inputs from `--input 1x3x128x128` (or `1x128:int64`).

    model = load_model("nets/mine.py:build", kwargs={"width": 8})
    specs = [parse_input("1x3x64x64")]
    xs = example_inputs(specs)
    check_forward(model, xs, "nets/mine.py:build")   # a clear error if it rejects the shape

Everything a user can get wrong here (a file that does not parse or import, a factory that
is missing, raises or returns something else than an nn.Module, an input the model does
not accept) raises a ModelLoadError or InputSpecError (both ValueError) naming the file and
line, never a traceback from deep inside."""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

#: dtypes an input may have on the command line (token ids are int64, as torch's Embedding wants)
INPUT_DTYPES = ("float32", "int64", "int32")
#: one input may hold at most this many values (2**28 float32 = 1 GiB): a typo like 1x3x12800x12800
#: is refused before anything is allocated
MAX_INPUT_ELEMENTS = 1 << 28
#: the example input is N(0, 1) noise (float) or token ids, from this seed: the same every run
EXAMPLE_SEED = 0
#: model files are read as text; a larger "model file" is surely not one
MAX_MODEL_FILE_BYTES = 16 << 20


class ModelLoadError(ValueError):
    """The model could not be loaded: the message names the file (and line) and what is wrong."""


class InputSpecError(ValueError):
    """An --input specification cannot be read, or the model does not accept it."""


@dataclass(frozen=True)
class InputSpec:
    """One model input: its shape (batch first), dtype, and for integer inputs the exclusive
    upper bound of the example values (`high`; 1 gives zeros)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int = 1

    def __str__(self) -> str:
        s = "x".join(map(str, self.shape))
        if self.dtype != "float32":
            s += f":{self.dtype}" + (f":{self.high}" if self.high != 1 else "")
        return s


def parse_input(text: str) -> InputSpec:
    """'1x3x128x128' -> float32 (1, 3, 128, 128); '1x128:int64' -> int64 token ids (example
    values 0); '1x128:int64:30522' -> example ids drawn below 30522."""
    if not isinstance(text, str):
        raise InputSpecError(f"--input: expected text like 1x3x128x128, got {text!r}")
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or not re.fullmatch(r"[0-9]+(?:[xX*][0-9]+)*", parts[0].strip()):
        raise InputSpecError(f"--input {text!r}: write the shape as dimensions joined by x, batch first, "
                             f"optionally with a dtype: 1x3x128x128, 1x128:int64")
    dims = tuple(int(d) for d in re.split(r"[xX*]", parts[0].strip()))
    if any(d < 1 for d in dims):
        raise InputSpecError(f"--input {text!r}: every dimension must be at least 1")
    if int(np.prod([float(d) for d in dims])) > MAX_INPUT_ELEMENTS:
        raise InputSpecError(f"--input {text!r}: {np.prod([float(d) for d in dims]):.3g} values in one input, "
                             f"more than the {MAX_INPUT_ELEMENTS:,} allowed")
    dtype = parts[1].strip().lower() if len(parts) > 1 else "float32"
    if dtype not in INPUT_DTYPES:
        raise InputSpecError(f"--input {text!r}: dtype {dtype!r} is not one of {', '.join(INPUT_DTYPES)}")
    high = 1
    if len(parts) == 3:
        if dtype == "float32":
            raise InputSpecError(f"--input {text!r}: an upper bound of example values applies to integer inputs")
        if not re.fullmatch(r"[0-9]+", parts[2].strip()) or int(parts[2]) < 1 or int(parts[2]) > 2**31 - 1:
            raise InputSpecError(f"--input {text!r}: the upper bound of example ids must be an integer "
                                 f"in [1, 2**31)")
        high = int(parts[2])
    return InputSpec(dims, dtype, high)


def example_inputs(specs: Sequence[InputSpec], seed: int = EXAMPLE_SEED) -> tuple:
    """Deterministic example tensors for `specs` (torch's global RNG untouched)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        if s.dtype == "float32":
            out.append(torch.randn(s.shape, generator=gen))
        else:
            out.append(torch.randint(0, s.high, s.shape, generator=gen, dtype=getattr(torch, s.dtype)))
    return tuple(out)


def default_inputs(zoo_name: str) -> list[str]:
    """The --input text of a zoo model's own input at batch 1."""
    from .. import models
    from ..models.bert import VOCAB_SIZE

    x = models.example_input(zoo_name)
    if x.dtype.is_floating_point:
        return [str(InputSpec(tuple(x.shape)))]
    return [str(InputSpec(tuple(x.shape), str(x.dtype)[6:], VOCAB_SIZE))]


# --- model specs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """A zoo name (`path` None) or a model file and the name of the factory in it."""

    name: str  # the zoo name, or the factory's name
    path: Optional[Path] = None

    @property
    def is_file(self) -> bool:
        return self.path is not None

    def __str__(self) -> str:
        return f"{self.path}:{self.name}" if self.path is not None else self.name


def parse_model_spec(text: str) -> ModelSpec:
    """'path/to/model.py:factory' (the file made absolute) or a zoo name."""
    from .. import models

    if not isinstance(text, str) or not text.strip() or "\0" in text:
        raise ModelLoadError(f"model {text!r}: give path/to/model.py:factory or a zoo name "
                             f"({', '.join(models.names())})")
    text = text.strip()
    if text in models.names():
        return ModelSpec(text)
    file, sep, factory = text.rpartition(":")
    if not sep or not file.endswith(".py"):
        file, factory = text, ""
    if not file.endswith(".py"):
        raise ModelLoadError(f"model {text!r} is neither path/to/model.py:factory nor a zoo name "
                             f"({', '.join(models.names())})")
    path = Path(file).expanduser()
    if not factory:
        raise ModelLoadError(f"model {text!r}: name the function that builds the model, as {file}:FACTORY"
                             + _candidates_hint(path))
    if not factory.isidentifier():
        raise ModelLoadError(f"model {text!r}: {factory!r} is not a Python name")
    return ModelSpec(factory, path.resolve())


def _candidates_hint(path: Path) -> str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except Exception:  # the file is checked properly when it is loaded
        return ""
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
    return f" (callables in {path.name}: {', '.join(names)})" if names else ""


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class ModelSource:
    """A model file's text as read once: what is hashed is what runs (no second read that an
    edit in between could change)."""

    path: Path
    text: str

    @property
    def sha256(self) -> str:
        return source_digest(self.text)


def source_digest(text: str) -> str:
    """The sha256 of a model file's text (its UTF-8 bytes, which is what the file holds)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_model_source(path: Path) -> ModelSource:
    """The text of model file `path` (ModelLoadError if it is missing or not UTF-8 text)."""
    return ModelSource(Path(path), _read_source(Path(path)))


def _where(err: BaseException, path: Path) -> str:
    """' at model.py:LINE: code' of the deepest frame of `err` in the user's file, or ''."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {path}:{f.lineno}" + (f": {f.line.strip()}" if f.line else "")


def _describe(err: BaseException) -> str:
    msg = str(err).strip().splitlines()
    return f"{type(err).__name__}: {msg[0]}" if msg else type(err).__name__


def _read_source(path: Path) -> str:
    if not path.exists():
        raise ModelLoadError(f"model file {path} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"model file {path} is not a file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ModelLoadError(f"cannot read model file {path}: {err.strerror or err}") from None
    if len(data) > MAX_MODEL_FILE_BYTES:
        raise ModelLoadError(f"model file {path} is {len(data):,} bytes: not a Python model file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ModelLoadError(f"model file {path} is not UTF-8 text (byte {err.start}): not a Python file") from None


def load_module(path: Path, source: Optional[str] = None):
    """Import the model file `path` as a fresh module (its directory on sys.path while it runs,
    so it may import its neighbours). With `source` (the file's text, read and checked by the
    caller) that text runs and the file is not read again."""
    if source is None:
        source = _read_source(path)
    try:
        code = compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as err:  # also IndentationError, TabError
        line = (err.text or "").rstrip("\n")
        caret = f"\n    {line}\n    {' ' * max((err.offset or 1) - 1, 0)}^" if line.strip() else ""
        raise ModelLoadError(f"{path}:{err.lineno}:{err.offset or 0}: syntax error: {err.msg}{caret}") from None
    except (ValueError, MemoryError, RecursionError) as err:  # e.g. null bytes, absurdly nested
        raise ModelLoadError(f"model file {path} cannot be compiled: {_describe(err)}") from None
    name = "edgetrain_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[name] = module  # dataclasses and pickling look themselves up here
    sys.path.insert(0, str(path.parent))
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as err:  # the user's code may raise anything while importing
        sys.modules.pop(name, None)
        raise ModelLoadError(f"importing model file {path} raised {_describe(err)}{_where(err, path)}") from None
    finally:
        try:
            sys.path.remove(str(path.parent))
        except ValueError:
            pass
    return module


def load_model(spec, kwargs: Optional[Mapping[str, Any]] = None, num_classes: Optional[int] = None,
               seed: int = 0, source: Optional[ModelSource] = None):
    """The nn.Module `spec` names (a ModelSpec or its text), in eval mode. A file's factory is
    called as factory(**kwargs) (plus num_classes= when given) with torch's RNG seeded by
    `seed` (and restored after), so a randomly initialised model is the same every time.
    With `source` (read_model_source of the spec's file) its text is what runs."""
    import torch

    from .. import models

    if not isinstance(spec, ModelSpec):
        spec = parse_model_spec(spec)
    kwargs = dict(kwargs or {})
    if not spec.is_file:
        try:
            return models.get(spec.name, num_classes=10 if num_classes is None else num_classes, seed=seed, **kwargs)
        except TypeError as err:
            raise ModelLoadError(f"zoo model {spec.name}: {err}") from None
    module = load_module(spec.path, source.text if source is not None else None)
    factory = module.__dict__.get(spec.name)
    if factory is None:
        found = sorted(k for k, v in module.__dict__.items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ModelLoadError(f"model file {spec.path} defines no {spec.name!r}"
                             + (f"; it defines {', '.join(found)}" if found else ""))
    if not callable(factory):
        raise ModelLoadError(f"{spec}: {spec.name} is a {type(factory).__name__}, not a function or class "
                             f"that builds the model")
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = factory(**kwargs)
        except (Exception, SystemExit) as err:
            raise ModelLoadError(f"{spec}: calling {spec.name}({_kwargs_text(kwargs)}) raised "
                                 f"{_describe(err)}{_where(err, spec.path)}") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{spec}: {spec.name}({_kwargs_text(kwargs)}) returned an object of type {type(model).__name__}, "
                             f"not a torch.nn.Module")
    return model.eval()


def _kwargs_text(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def parse_model_args(items: Sequence[str]) -> dict[str, Any]:
    """['width=8', 'act=relu'] -> {'width': 8, 'act': 'relu'} (values read as Python literals,
    else kept as text)."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ModelLoadError(f"--model-arg {item!r}: write NAME=VALUE, e.g. width=8")
        try:
            out[key] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            out[key] = value.strip()
    return out


def check_forward(model, inputs: tuple, what: str, loss: Optional[str] = None):
    """Run `model` once on `inputs` (no gradients): InputSpecError naming the shapes and the
    model's line where it fails, or when the output cannot be trained with `loss`. Returns
    the output."""
    import torch

    shapes = ", ".join("x".join(map(str, x.shape)) + ("" if x.dtype == torch.float32 else f":{str(x.dtype)[6:]}")
                       for x in inputs)
    try:
        with torch.no_grad():
            out = model(*inputs)
    except (Exception, SystemExit) as err:
        path = Path(sys.modules[type(model).__module__].__file__) if type(model).__module__ in sys.modules and \
            getattr(sys.modules[type(model).__module__], "__file__", None) else None
        where = _where(err, path) if path is not None else ""
        raise InputSpecError(f"{what} does not accept input {shapes}: {_describe(err)}{where}") from None
    if not isinstance(out, torch.Tensor):
        raise InputSpecError(f"{what} returned a {type(out).__name__} for input {shapes}; it must return one "
                             f"tensor (its output)")
    if loss in ("cross_entropy", "sequence_cross_entropy") and out.dim() < 2:
        raise InputSpecError(f"{what} gives output {tuple(out.shape)} for input {shapes}; {loss} training needs "
                             f"logits of rank >= 2 ((batch, classes, ...) or (batch, ..., classes))")
    return out
