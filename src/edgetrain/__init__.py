"""edgetrain: compile PyTorch models into training programs that fit small devices.

The public names are imported on first use (PEP 562 `__getattr__`): `import edgetrain`
does not import torch, so that the command line's `--help`, `--version` and usage errors
answer at once; `et.compile`, `from edgetrain import Full` and the rest work as before."""
from __future__ import annotations

import importlib
import importlib.util
import logging

from .torch_backend import register as _register_torch_backend

#: every module logs to a child of the "edgetrain" logger; a library shows nothing unless the program
#: configures logging (the command line adds a stderr handler: app/cli_logging.py)
logging.getLogger(__name__).addHandler(logging.NullHandler())
_register_torch_backend()  # torch.compile(model, backend="edgetrain"), without importing TorchDynamo now

#: the version, written here only: pyproject.toml reads it ([tool.setuptools.dynamic])
__version__ = "0.1.0"
#: each public name and the submodule that defines it (None: the name is the submodule)
_PUBLIC = {"BiasOnly": "sparse", "Budget": "config", "BudgetError": "api", "CaptureError": "frontend",
           "Full": "sparse", "LastK": "sparse", "LoRA": "trainable", "NonFiniteLossError": "program", "Program": "program",
           "SGD": "config", "Sparse": "sparse", "UnsupportedOpError": "frontend", "compile": "api",
           "models": None, "schedule": "remat"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """A public name, or a subpackage (`et.sparse.analyze_contributions`), imported now."""
    if name not in _PUBLIC:
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f".{name}", __name__)
    where = _PUBLIC[name]
    module = importlib.import_module(f".{where or name}", __name__)
    value = module if where is None else getattr(module, name)
    globals()[name] = value  # once: later look-ups do not come here
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
