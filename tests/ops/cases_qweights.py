"""Op-table cases of ops/qweights.py (merged into tests/ops/cases.py CASES)."""
from __future__ import annotations

CASES = {}
