"""Autodiff at compile time: a reverse sweep that emits backward IR nodes."""
from ..ops.base import WHOLE, ChannelSelect, Wanted, Whole
from .backward import build_backward, grad_name

__all__ = ["WHOLE", "ChannelSelect", "Wanted", "Whole", "build_backward", "grad_name"]
