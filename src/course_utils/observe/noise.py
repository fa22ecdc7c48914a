"""The course's one notion of noise (every notebook's measured answers, notebooks 01-11, and the benchmarks):
how far repeated measurements of one rate lie apart, when two measured rates can be told apart, and when a
figure lies outside what the measurement allows.

- **Spread**: the interval holding the middle 80 % of the samples (numpy's interpolated 10th and 90th
  percentiles), as a share of their median. Fewer than :data:`MIN_SAMPLES` samples cannot tell: the spread is
  then *unknown*, never a guessed floor.
- **Comparing two rates** (things per second, higher is faster): the ratio of their medians, and the
  interval the ratio can take when each rate may lie anywhere in its own interval. Only an interval wholly
  above 1 is "faster", wholly below 1 "slower"; one that holds 1 "cannot tell apart".
- **Physics**: a ratio or a figure has bounds the work sets (no speed-up above the ranks, no efficiency above
  100 %, no gain from a communication knob above what the exposed communication could give, no MFU above 1,
  no warm-up faster than the steady state). A measurement wholly outside them is *disturbed*: reported with
  its likely cause and the bound, never as a finding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

MIN_SAMPLES = 3  # fewer repeated measurements than this give no spread worth the name
DISTURBED_CAUSE = ("Likely cause: another program took the processor, its clock changed speed, or the run was too "
                   "short to average over them; run it again on a quieter machine")

FASTER, SLOWER, ALIKE, DISTURBED, UNKNOWN = "faster", "slower", "cannot tell apart", "disturbed", "unknown"


@dataclass(frozen=True)
class Measurement:
    """Repeated measurements of one quantity: their median and the interval of their middle 80 %."""

    median: float
    low: float  # NaN where the spread is unknown
    high: float
    count: int
    lowest: float = math.nan  # the extreme samples, known from two on: too few for a spread, a fact all the same
    highest: float = math.nan

    @classmethod
    def of(cls, samples: Iterable[float | None]) -> Measurement:
        """The measurement of ``samples``; None and NaN samples are left out."""
        values = np.asarray([value for value in samples if value is not None and math.isfinite(value)], dtype=float)
        if len(values) == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        median, extremes = float(np.median(values)), (float(values.min()), float(values.max()))
        if len(values) < MIN_SAMPLES:
            return cls(median, math.nan, math.nan, len(values), *extremes)
        low, high = np.percentile(values, [10, 90])
        return cls(median, float(low), float(high), len(values), *extremes)

    @classmethod
    def once(cls, value: float) -> Measurement:
        """A one-off event (the first epoch, the first iteration): it happens once, so it has no spread to
        repeat, and is read against the other side's interval alone."""
        return cls(value, value, value, 1, value, value)

    @property
    def known(self) -> bool:
        """Whether there were enough samples to tell the spread."""
        return not math.isnan(self.low)

    @property
    def spread(self) -> float:
        """Half the interval's width as a share of the median (0.05: about ±5 %); NaN where unknown."""
        if not self.known or self.median <= 0:
            return math.nan
        return (self.high - self.low) / 2 / self.median

    def inverse(self) -> Measurement:
        """The same measurement as its reciprocal: iteration times as rates (a long step is a low rate)."""
        return Measurement(_reciprocal(self.median), _reciprocal(self.high), _reciprocal(self.low), self.count,
                           _reciprocal(self.highest), _reciprocal(self.lowest))

    def scaled(self, factor: float) -> Measurement:
        """The same measurement in other units (seconds per step to images per second, say)."""
        return Measurement(self.median * factor, self.low * factor, self.high * factor, self.count,
                           self.lowest * factor, self.highest * factor)


def _reciprocal(value: float) -> float:
    return 1 / value if value > 0 else math.nan


def spread_text(measurement: Measurement) -> str:
    """The spread as the answers print it: "±4 % over 12 samples", or why it is unknown."""
    if measurement.count == 0:
        return "no samples"
    if measurement.count == 1 and measurement.known:
        return "once, a one-off"
    if not measurement.known:
        return f"spread unknown ({measurement.count} sample{'s' if measurement.count > 1 else ''}: {MIN_SAMPLES} " \
               "or more tell it)"
    return f"±{measurement.spread:.0%} over {measurement.count} samples"


@dataclass(frozen=True)
class Comparison:
    """Two measured rates set against each other, and the verdict the measurements allow."""

    ratio: float  # the first rate's median over the second's
    low: float  # the lowest and highest ratio the two intervals allow (NaN where a spread is unknown)
    high: float
    verdict: str  # FASTER, SLOWER, ALIKE, DISTURBED or UNKNOWN
    bound: tuple[float, float] | None = None  # the ratios the work allows, where the caller knows them
    why: str = ""  # what sets that bound
    words: tuple[str, str] = (FASTER, SLOWER)  # for quantities other than rates: ("larger", "smaller"), say
    # FASTER where every sample of the first lay above every sample of the second, SLOWER where below, else "":
    # what two rounds each can say where their spread is unknown (a fact about those rounds, not a verdict)
    apart: str = ""

    def sentence(self) -> str:
        """The verdict in words, with the figures it rests on."""
        digits = _digits_apart_from_one(self)
        interval = "" if math.isnan(self.low) else f", the spreads allow {self.low:.{digits}f}-{self.high:.{digits}f}x"
        figures = f"**{self.ratio:.{digits}f}x**{interval}"
        if self.verdict == DISTURBED:
            return (f"{figures}: outside what the work allows ({bound_text(self.bound)}{': ' if self.why else ''}"
                    f"{self.why}). A **disturbed measurement**, not a finding. {DISTURBED_CAUSE}.")
        if self.verdict == UNKNOWN:
            return (f"{figures}: the spread is unknown (fewer than {MIN_SAMPLES} samples of one of them), so the "
                    "difference cannot be judged; repeat the measurement.")
        if self.verdict == ALIKE:
            return (f"{figures}: **no measurable difference**; these measurements cannot tell the two apart. "
                    "Rerun (more steps, a quieter machine) to narrow the spread.")
        word = self.words[0] if self.verdict == FASTER else self.words[1]
        return f"{figures}: **{word}**, by more than the two spreads allow."


def compare(first: Measurement, second: Measurement, bound: tuple[float, float] | None = None,
            why: str = "", words: tuple[str, str] = (FASTER, SLOWER)) -> Comparison:
    """The one rule for two measured rates (higher is faster): ``first`` against ``second``.

    ``bound``: the lowest and highest ratio the work allows (e.g. ``(0, ranks)`` for a speed-up), with
    ``why`` saying what sets it; a ratio wholly outside it is DISTURBED. ``words``: how the sentence names
    the first being above or below the second, for quantities that are not speeds."""
    ratio = first.median / second.median if second.median > 0 else math.nan
    known = first.known and second.known and second.low > 0
    low, high = (first.low / second.high, first.high / second.low) if known else (math.nan, math.nan)
    reach = (low, high) if known else (ratio, ratio)
    if bound is not None and (reach[0] > bound[1] or reach[1] < bound[0]):
        verdict = DISTURBED
    elif not known or math.isnan(ratio):
        verdict = UNKNOWN
    elif low > 1:
        verdict = FASTER
    elif high < 1:
        verdict = SLOWER
    else:
        verdict = ALIKE
    samples = first.count > 1 and second.count > 1
    apart = (FASTER if samples and first.lowest > second.highest else
             SLOWER if samples and first.highest < second.lowest else "")
    return Comparison(ratio, low, high, verdict, bound, why, words, apart)


def _digits_apart_from_one(comparison: Comparison) -> int:
    """Two decimals, or as many more (up to four) as a verdict of faster or slower needs for its interval not to
    read as touching 1 ("1.00-1.01x: faster" where the spreads allow 1.002-1.009x)."""
    if comparison.verdict not in (FASTER, SLOWER) or math.isnan(comparison.low):
        return 2
    nearest = comparison.low if comparison.verdict == FASTER else comparison.high
    return next((digits for digits in (2, 3) if round(nearest, digits) != 1), 4)


def bound_text(bound: tuple[float, float] | None) -> str:
    """A bound as the answers print it."""
    if bound is None:
        return "no bound"
    low, high = bound
    if math.isinf(high):
        return f"at least {low:.2f}x"
    return f"at most {high:.2f}x" if low <= 0 else f"between {low:.2f}x and {high:.2f}x"


def outside(value: float, low: float = -math.inf, high: float = math.inf) -> bool:
    """Whether a single figure (an MFU, an efficiency, a share) lies outside what the work allows."""
    return not math.isnan(value) and (value < low or value > high)


def communication_bound(exposed_share: float) -> float:
    """The most any communication setting can speed a step up: removing all of the exposed communication,
    a share ``exposed_share`` of the step, gives 1 / (1 - share)."""
    return 1 / (1 - exposed_share) if 0 <= exposed_share < 1 else math.inf


def agreement(mine: Iterable[float], theirs: Iterable[float], what: str = "images/s") -> str:
    """Markdown: do two sets of repeated measurements of one rate agree (the learner's code against the
    course's, say)?"""
    first, second = Measurement.of(mine), Measurement.of(theirs)
    return (f"**{first.median:.0f}** against **{second.median:.0f}** {what} (medians; {spread_text(first)} and "
            f"{spread_text(second)}): " + compare(first, second).sentence())
