"""Hypothesis profiles for the property tests.

``default`` draws the same examples on every run (``derandomize``: the
examples follow from each test's name), so the suite gives the same answer
on any machine and a failure replays as it is. ``explore`` draws new random
examples on every run, to look for new failing cases (run it several
times, or raise a test's ``max_examples`` for the run):

    HYPOTHESIS_PROFILE=explore python -m pytest tests/test_order_search.py

A case it finds is fixed and kept as a fixed test of its own.
"""

import os

from hypothesis import settings

settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
