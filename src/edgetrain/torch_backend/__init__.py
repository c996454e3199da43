"""torch.compile(model, backend="edgetrain"): an unchanged PyTorch training loop run by
edgetrain (backend.py), registered with TorchDynamo under the name "edgetrain".

Two ways in, both cheap for `import edgetrain` (TorchDynamo takes seconds to import, so
it is never imported here):
- the package's entry point (group `torch_dynamo_backends`, pyproject.toml), which
  TorchDynamo reads when it meets an unknown backend name: no `import edgetrain` needed;
- `register()`, run when edgetrain is imported: registers at once if TorchDynamo is
  loaded, else right after its backend registry module is (a one-shot import hook), so a
  source checkout that is not pip-installed works too.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

BACKEND_NAME = "edgetrain"
_REGISTRY = "torch._dynamo.backends.registry"


def edgetrain_backend(gm, example_inputs, **kw):
    """The backend TorchDynamo calls (options= arrives as a keyword); see backend.py."""
    from .backend import edgetrain_backend as backend

    return backend(gm, example_inputs, **kw)


def last_programs():
    """The graphs this process compiled most recently (backend.CompiledGraph: forward,
    backward, step graphs and `memory`, the step's MemoryReport), oldest first."""
    from .backend import last_programs as programs

    return programs()


def _register_with(registry) -> None:
    from .rnn import allow_rnns

    allow_rnns()  # else TorchDynamo runs any model with an nn.LSTM / nn.GRU in PyTorch, unseen
    if BACKEND_NAME in registry._COMPILER_FNS:
        return
    if registry._BACKENDS.get(BACKEND_NAME) is not None:
        return  # TorchDynamo is loading our entry point right now and registers what it returns
    registry.register_backend(compiler_fn=edgetrain_backend, name=BACKEND_NAME)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when TorchDynamo's registry module is about to load, wraps its
    loader so that the backend is registered right after the module runs; then leaves."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _REGISTRY:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            try:
                _register_with(module)
            except Exception as err:  # never break torch's import over our registration
                warnings.warn(f"edgetrain: could not register the torch.compile backend: {err}", stacklevel=2)

        spec.loader.exec_module = exec_and_register
        return spec


def register() -> None:
    """Make `torch.compile(..., backend="edgetrain")` find this backend."""
    registry = sys.modules.get(_REGISTRY)
    if registry is not None:
        _register_with(registry)
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


__all__ = ["BACKEND_NAME", "edgetrain_backend", "last_programs", "register"]
