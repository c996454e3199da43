"""PyTorch 2 frontend: torch.export capture mapped onto the IR."""
from .capture import CaptureError, Captured, UnsupportedOpError, capture

__all__ = ["CaptureError", "Captured", "UnsupportedOpError", "capture"]
