"""Notebooks 01, 04 and 05: the spread of repeated measurements, which every lesson's answer compares a difference with
before it calls it a finding.

A difference inside the spread measured in the same notebook is "no measurable difference"; a figure that
cannot happen (warm-up faster than steady state, a cost below 1x) is a disturbed measurement, reported with
its likely cause and never as a result.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

DISTURBED = ("Likely cause: another program took the processor, its clock changed speed, or the run was too "
             "short to average over them")


def relative_spread(samples: Sequence[float]) -> float:
    """How far repeated measurements of one thing lie apart: (largest - smallest) / median. NaN with fewer
    than two, where the spread is unknown."""
    values = [value for value in samples if value is not None and not math.isnan(value)]
    if len(values) < 2:
        return math.nan
    return (max(values) - min(values)) / statistics.median(values)


def measurable(ratio: float, spread: float) -> bool:
    """Whether ``ratio`` (one measurement over another) lies outside ``spread`` around 1; with an unknown
    spread nothing is measurable."""
    return not math.isnan(spread) and abs(ratio - 1) > spread


def spread_text(spread: float) -> str:
    """A spread as the answers print it; NaN (one measurement has no spread) says so instead of "nan%"."""
    return "unknown (one measurement)" if math.isnan(spread) else f"{spread:.0%}"


def agreement(mine: Sequence[float], theirs: Sequence[float], what: str = "images/s") -> str:
    """Markdown: do two sets of repeated measurements of the same thing agree? Their medians' ratio against
    the larger of their two spreads."""
    known = [spread for spread in (relative_spread(mine), relative_spread(theirs)) if not math.isnan(spread)]
    spread = max(known, default=math.nan)
    mine_median, their_median = statistics.median(mine), statistics.median(theirs)
    ratio = mine_median / their_median
    figures = (f"**{mine_median:.0f}** against **{their_median:.0f}** {what} (median of {len(mine)} and "
               f"{len(theirs)}; ratio {ratio:.2f}, measured spread {spread_text(spread)})")
    if math.isnan(spread):
        return f"{figures}: with one measurement of each, the spread is unknown; repeat to judge the difference."
    if not measurable(ratio, spread):
        return f"{figures}: **no measurable difference**; the two do the same work at the same speed."
    return (f"{figures}: a **difference larger than the spread**. Look for what one of them does that the other "
            f"does not (another batch size, precision or data path), or for a machine busy during one of them.")
