"""What a kernel emitter may ask about the values of the node it emits (EmitContext): where each
value lives (arena offset, state array, split weight parts) and C literals."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ....ir import Value
from ..layout import C_TYPES, CBackendError, GraphLayout, Layout, StateArray


@dataclass(frozen=True)
class WeightRef:
    """A state tensor as the C arrays holding it (see layout.StateArray)."""

    kind: str  # "sram" | "flash" | "split"
    name: str  # the full array (sram / flash); for split: the array of the selected part
    sel: object = None  # ChannelSelect for split
    sram: str = ""
    flash: str = ""
    sel_index: str = ""
    rest_index: str = ""
    state: Optional[StateArray] = None


class EmitContext:
    """What a kernel emitter may ask about the values of the node it emits (see module doc)."""

    step = "et_step"  # C expression of the int32 step counter

    def __init__(self, layout: Layout, graph: str, overrides: Optional[dict] = None):
        self.layout = layout
        self.graph = graph
        self.gl: GraphLayout = layout.graphs[graph]
        self.overrides = dict(overrides or {})  # Value -> C expression (gathered split weights)

    # --- where values live --------------------------------------------------------------
    def ctype(self, v: Value) -> str:
        return C_TYPES[v.dtype]

    def state_of(self, v: Value) -> Optional[StateArray]:
        r = self.gl.roots[v]
        if r in self.gl.input_set and r.name in self.layout.states:
            return self.layout.states[r.name]
        return None

    def ptr(self, v: Value) -> str:
        """C expression of type `T *` (T the value's element type) to the value's data."""
        if v in self.overrides:
            return self.overrides[v]
        r = self.gl.roots[v]
        t = C_TYPES[v.dtype]
        st = self.state_of(v)
        if st is not None:
            if st.kind == "split":
                raise CBackendError(f"{v.name}: a split weight has no single array; use ctx.weight()")
            return f"(({t} *){st.c_name})"
        if r in self.gl.input_set and r.name == "step":
            return "(&et_step)"
        if r not in self.gl.offsets:
            raise CBackendError(f"value {v} has no storage in graph {self.graph}")
        return f"(({t} *)(et_arena + {self.gl.offsets[r]}))"

    def weight(self, v: Value) -> WeightRef:
        st = self.state_of(v)
        if st is None:
            raise CBackendError(f"{v} is not a state tensor")
        if st.kind == "split":
            return WeightRef("split", st.sram, st.sel, st.sram, st.flash, st.sel_index, st.rest_index, st)
        return WeightRef(st.kind, st.c_name, state=st)

    # --- literals ------------------------------------------------------------------------
    @staticmethod
    def c_float(x) -> str:
        x = float(np.float32(x))
        if math.isnan(x):
            return "(0.0f/0.0f)"
        if math.isinf(x):
            return "(1.0f/0.0f)" if x > 0 else "(-1.0f/0.0f)"
        return f"{x!r}f"

    @staticmethod
    def c_double(x) -> str:
        x = float(x)
        if math.isnan(x) or math.isinf(x):
            return "(0.0/0.0)" if math.isnan(x) else ("(1.0/0.0)" if x > 0 else "(-1.0/0.0)")
        return repr(x)

    @staticmethod
    def c_int(x) -> str:
        x = int(x)
        if -2**31 <= x < 2**31:
            return str(x)
        return f"INT64_C({x})"
