"""Liveness analysis and the memory report."""
from .liveness import Lifetime, lifetimes, storage_roots
from .report import MemoryReport, plan_memory

__all__ = ["Lifetime", "MemoryReport", "lifetimes", "plan_memory", "storage_roots"]
