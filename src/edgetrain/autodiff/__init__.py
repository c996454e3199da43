"""Autodiff at compile time: a reverse sweep that emits backward IR nodes."""
from .backward import ChannelSelect, build_backward, grad_name

__all__ = ["ChannelSelect", "build_backward", "grad_name"]
