"""Notebooks 06, 07, 08, 09 and 10: how much a measurement varies, and what a difference inside that means.

A short run on a busy machine varies from iteration to iteration; a verdict that compares two runs reads
the difference against that spread, measured in the same notebook, and calls a figure that cannot be
true (above the ideal, a cost below nothing) a disturbed measurement instead of a finding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FLOOR = 0.02  # short runs differ by at least this much however steady their iterations look


def relative_spread(samples: Sequence[float]) -> float:
    """Half the interquartile range of ``samples`` over their median: how far a typical sample strays.
    A few samples give no quartiles worth the name; their spread is then the half-range."""
    values = np.asarray([value for value in samples if np.isfinite(value)], dtype=float)
    if len(values) == 0 or np.median(values) <= 0:
        return float("nan")
    low, high = np.percentile(values, [25, 75]) if len(values) >= 4 else (values.min(), values.max())
    return max(FLOOR, float((high - low) / 2 / np.median(values)))


def combined(*spreads: float) -> float:
    """The spread of a ratio of measurements: their relative spreads added (the worst case), NaNs ignored."""
    known = [spread for spread in spreads if np.isfinite(spread)]
    return sum(known) if known else FLOOR


def within(ratio: float, spread: float) -> bool:
    """True when ``ratio`` (one measurement over another) is 1 within ``spread``."""
    return abs(ratio - 1) <= spread
