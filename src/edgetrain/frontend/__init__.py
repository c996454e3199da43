"""PyTorch 2 frontend: torch.export capture mapped onto the IR.

The converter modules are imported here, once, so that the converter table
(converters.CONVERTERS) is full whenever any part of the frontend is imported."""
from . import aten, aten_data, aten_dynamic, aten_layers, aten_norm, aten_pointwise  # noqa: F401
from . import aten_extremes, aten_moments, aten_resample, aten_select  # noqa: F401
from .capture import Captured, capture
from .errors import CaptureError, UnsupportedOpError

__all__ = ["CaptureError", "Captured", "UnsupportedOpError", "capture"]
