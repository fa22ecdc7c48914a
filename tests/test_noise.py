"""The course's one notion of noise: one spread, "unknown" where the samples cannot tell, one rule for two
rates, one set of verdicts, and bounds the work sets."""

import math

import pytest

from course_utils.observe import noise
from course_utils.observe.noise import ALIKE, DISTURBED, FASTER, SLOWER, UNKNOWN, Measurement, compare

TEN = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.3]


def test_the_spread_is_the_middle_80_percent_over_the_median():
    measured = Measurement.of(list(range(1, 12)))  # 1..11: the 10th and 90th percentiles are 2 and 10
    assert (measured.median, measured.low, measured.high) == (6, 2, 10)
    assert measured.spread == pytest.approx(4 / 6)


def test_one_outlier_among_many_does_not_set_the_spread():
    assert Measurement.of([1.0] * 20 + [50.0]).spread == 0


@pytest.mark.parametrize("samples", [[], [3.0], [3.0, 3.3], [3.0, None, math.nan]])
def test_fewer_than_three_samples_leave_the_spread_unknown_with_no_floor(samples):
    measured = Measurement.of(samples)
    assert not measured.known and math.isnan(measured.spread)
    assert "spread unknown" in noise.spread_text(measured) or "no samples" in noise.spread_text(measured)


def test_the_inverse_of_times_is_rates_with_the_interval_flipped():
    rates = Measurement.of([0.1, 0.2, 0.4, 0.2, 0.2]).inverse()
    assert rates.median == pytest.approx(5.0) and rates.low < rates.median < rates.high


def test_two_rates_differ_only_where_their_intervals_do_not_overlap():
    same = compare(Measurement.of(TEN), Measurement.of([value * 1.003 for value in TEN]))
    assert same.verdict == ALIKE and "**no measurable difference**" in same.sentence()
    assert "Rerun" in same.sentence() and "same speed" not in same.sentence()
    faster = compare(Measurement.of([value * 1.1 for value in TEN]), Measurement.of(TEN))
    assert faster.verdict == FASTER and faster.low > 1 and "**faster**" in faster.sentence()
    assert compare(Measurement.of(TEN), Measurement.of([value * 1.1 for value in TEN])).verdict == SLOWER


def test_a_wide_spread_is_never_read_as_the_same_speed():
    """The known bad case: a 1.5x gap inside a 55 % spread was called "the same work at the same speed"."""
    wide = compare(Measurement.of([150, 60, 240, 150]), Measurement.of([100, 40, 160, 100]))
    assert wide.verdict == ALIKE and wide.ratio == pytest.approx(1.5)
    assert "cannot tell the two apart" in wide.sentence()


def test_with_an_unknown_spread_nothing_is_judged():
    assert compare(Measurement.of([100.0]), Measurement.of([150.0, 149.0, 151.0])).verdict == UNKNOWN
    assert "cannot be judged" in compare(Measurement.of([100.0]), Measurement.of([150.0])).sentence()


def test_a_ratio_wholly_outside_its_bound_is_disturbed_with_the_bound_shown():
    """DDP on 2 ranks at 11x one process: a disturbed measurement, never a finding."""
    ranks = compare(Measurement.of([1100, 1090, 1110]), Measurement.of([100, 99, 101]), bound=(0, 2),
                    why="2 ranks do at most twice one process's work")
    assert ranks.verdict == DISTURBED
    assert "at most 2.00x" in ranks.sentence() and "disturbed measurement" in ranks.sentence()
    inside = compare(Measurement.of([195, 190, 200]), Measurement.of([100, 99, 101]), bound=(0, 2))
    assert inside.verdict == FASTER  # near the bound, but the spreads allow it


def test_the_same_timings_get_the_same_verdict_wherever_they_are_read():
    """One rule: a 3 % gap on ten steady timings is read the same in every notebook (it was "no measurable
    difference" in 01/05 and "a difference" in 06/07)."""
    gap = [value * 1.03 for value in TEN]
    as_times = [Measurement.of([1 / value for value in rates]).inverse() for rates in (gap, TEN)]
    verdicts = {compare(Measurement.of(gap), Measurement.of(TEN)).verdict, compare(*as_times).verdict}
    assert verdicts == {FASTER}


def test_a_one_off_event_is_read_against_the_other_sides_interval():
    steady = Measurement.of([10.0, 10.5, 9.8, 10.2, 10.1] * 4).inverse()
    slow_start = compare(Measurement.once(1 / 40.0), steady, bound=(0, 1))
    assert slow_start.verdict == SLOWER
    fast_start = compare(Measurement.once(1 / 5.0), steady, bound=(0, 1))
    assert fast_start.verdict == DISTURBED


def test_single_figures_outside_physics_and_the_communication_bound():
    assert noise.outside(1.3, 0, 1) and not noise.outside(0.4, 0, 1) and not noise.outside(math.nan, 0, 1)
    assert noise.communication_bound(0.05) == pytest.approx(1 / 0.95)
    assert math.isinf(noise.communication_bound(1.0))


def test_agreement_reads_both_sides_with_their_spreads():
    assert "**no measurable difference**" in noise.agreement([100, 110, 95], [104, 98, 108])
    assert "**slower**" in noise.agreement([100, 102, 101], [150, 149, 151])
    assert "cannot be judged" in noise.agreement([100], [150])


def test_two_rounds_each_give_no_verdict_but_say_when_every_round_lay_apart():
    graphs, eager = Measurement.of([26_690, 27_862]), Measurement.of([11_352, 13_802])  # the H100's two rounds
    comparison = compare(graphs, eager)
    assert comparison.verdict == UNKNOWN and comparison.apart == FASTER
    assert compare(eager, graphs).apart == SLOWER
    assert compare(Measurement.of([10, 12]), Measurement.of([11, 13])).apart == ""  # the rounds interleave
    assert compare(Measurement.of([30]), Measurement.of([10, 12])).apart == ""  # one round is not a range
    seconds = Measurement.of([0.5, 0.25]).inverse()  # rates from times: the extremes swap
    assert (seconds.lowest, seconds.highest) == (2.0, 4.0)


def test_a_small_difference_told_apart_is_printed_with_the_digits_that_show_it():
    """Steady timings 0.5 % apart with a tighter spread: "faster", and the figures say so ("1.005x, the spreads
    allow 1.004-1.006x"), where two decimals read "1.00x ... 1.00-1.01x: faster"."""
    tight = [100 + offset / 100 for offset in range(-5, 6)]
    verdict = compare(Measurement.of([value * 1.005 for value in tight]), Measurement.of(tight))
    assert verdict.verdict == FASTER
    assert "**1.005x**, the spreads allow 1.004-1.006x: **faster**" in verdict.sentence(), verdict.sentence()
    assert "**1.05x**, the spreads allow" in compare(Measurement.of([value * 1.05 for value in tight]),
                                                     Measurement.of(tight)).sentence()
    assert "**1.00x**" in compare(Measurement.of(tight), Measurement.of(tight)).sentence()  # alike: two decimals
