"""edgetrain: compile PyTorch models into training programs that fit small devices."""
from . import models
from .api import BudgetError, compile
from .config import SGD, Budget
from .frontend import CaptureError, UnsupportedOpError
from .program import NonFiniteLossError, Program
from .schedule import schedule  # et.schedule is the function; `import edgetrain.schedule.plan` etc. still work
from .sparse import BiasOnly, Full, LastK, Sparse
from .torch_backend import register as _register_torch_backend

_register_torch_backend()  # torch.compile(model, backend="edgetrain"), without importing TorchDynamo now

__version__ = "0.1.0"
__all__ = ["BiasOnly", "Budget", "BudgetError", "CaptureError", "Full", "LastK", "NonFiniteLossError", "Program",
           "SGD", "Sparse", "UnsupportedOpError", "compile", "models", "schedule"]
