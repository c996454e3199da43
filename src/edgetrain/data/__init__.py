"""Offline data sets, read straight from installed packages or local files."""
from .mnist import DataError, load_mnist

__all__ = ["DataError", "load_mnist"]
