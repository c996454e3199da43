"""Liveness analysis, arena planning and the memory report."""
from .arena import ALIGNMENT, ArenaPlan, plan_arena
from .liveness import Lifetime, lifetimes, storage_roots
from .report import MemoryReport, plan_memory, trained_channel_bytes

__all__ = ["ALIGNMENT", "ArenaPlan", "Lifetime", "MemoryReport", "lifetimes", "plan_arena", "plan_memory",
           "storage_roots", "trained_channel_bytes"]
