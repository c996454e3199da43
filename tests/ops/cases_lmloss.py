"""Op-table cases of ops/lmloss.py (merged into tests/ops/cases.py CASES)."""
from __future__ import annotations

CASES = {}
