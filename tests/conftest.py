"""Hypothesis runs derandomized (the same examples on every run, so CI is reproducible);
HYPOTHESIS_PROFILE=explore draws new random examples to look for failures."""
import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
