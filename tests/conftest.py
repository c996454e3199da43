"""Hypothesis runs derandomized (the same examples on every run, so CI is reproducible);
HYPOTHESIS_PROFILE=explore draws new random examples to look for failures.

torch.export runs once per model and test process (tests/capture_memo.py); a test about the
export itself takes the marker `fresh_capture`."""
import os

import pytest
from hypothesis import settings

from tests import capture_memo

settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
capture_memo.install()


@pytest.fixture(autouse=True)
def _fresh_capture(request):
    """A test marked `fresh_capture` exports every model it captures."""
    fresh = request.node.get_closest_marker("fresh_capture") is not None
    capture_memo.fresh = fresh
    yield
    capture_memo.fresh = False
