"""Op-table cases of the resample family (merged into tests/ops/cases.py's CASES)."""
from __future__ import annotations

CASES: dict = {}
