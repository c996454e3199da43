"""Tensor types and values: the atoms of the IR."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .printer import format_value

#: dtypes the IR knows, with their size in bytes.
DTYPE_BYTES = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "bool": 1}
FLOAT_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class TensorType:
    """A static shape and a dtype name (one of DTYPE_BYTES)."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {sorted(DTYPE_BYTES)}")
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise ValueError(f"shape must be non-negative ints, got {self.shape}")

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(int(d) for d in shape), self.dtype)

    def __str__(self) -> str:
        short = {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "bool": "b1"}
        return f"{short[self.dtype]}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Value:
    """One SSA value. `name` is for binding graph inputs/outputs and for printing."""

    id: int
    type: TensorType
    name: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __str__(self) -> str:
        """Outside a graph a value has no number (ids are per process, never printed): `%?<name> : f32[..]`.
        Inside one, the printer numbers values per graph (ir/printer.py)."""
        return format_value(self)
