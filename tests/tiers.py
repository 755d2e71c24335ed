"""Test tiers: the fast loop (`pytest -m "not slow"`) runs property tests with fewer examples.

`conftest.pytest_configure` sets ``THERMO_LENS_TEST_TIER=fast`` when the run deselects the slow
tier; the full suite (CI, the README's command) runs every property test at its full count.
"""

from __future__ import annotations

import os


def fast_loop() -> bool:
    """True inside the fast loop (`-m "not slow"`)."""
    return os.environ.get("THERMO_LENS_TEST_TIER") == "fast"


def examples(n: int) -> int:
    """Hypothesis ``max_examples``: ``n`` in the full suite, a fifth of it (at least 5) in the fast loop."""
    return max(5, n // 5) if fast_loop() else n
