"""Notebook 12's straggler finder on real ranks: one rank's loader slowed is named with what it cost the other;
ranks alike get no straggler."""

import pytest

from course_utils.lessons import stragglers

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # torchrun and two gloo ranks in every test

DELAY_MS, STEPS = 80.0, 20


def test_the_slowed_rank_is_named_with_the_time_the_other_waited_for_it(tmp_path):
    stragglers.run(2, tmp_path / "slowed", slow_rank=1, delay_ms=DELAY_MS, steps=STEPS)
    table = stragglers.read_ranks(tmp_path / "slowed")
    verdict = stragglers.name_straggler(table)
    assert verdict.rank == 1, verdict.sentence()
    counted = verdict.steps
    assert counted == STEPS - stragglers.WARMUP_STEPS
    # Rank 0 waited at least most of the sleep, every counted step (it may wait longer: rank 1 also computes).
    assert verdict.waited[0] > 0.7 * DELAY_MS / 1000 * counted, verdict.sentence()
    assert "Rank 1 is the straggler" in verdict.sentence() and "rank 0 waited" in verdict.sentence()
    assert stragglers.plot(table, "one rank slowed").axes


def test_ranks_alike_have_no_straggler(tmp_path):
    stragglers.run(2, tmp_path / "alike", steps=STEPS)
    verdict = stragglers.name_straggler(stragglers.read_ranks(tmp_path / "alike"))
    assert verdict.rank is None and "No straggler" in verdict.sentence(), verdict.sentence()


def test_records_an_earlier_launch_left_are_never_read(tmp_path):
    out = tmp_path / "run"
    stragglers.run(2, out, slow_rank=1, steps=4)
    (out / "rank-0.json").rename(out / "rank-0.json.kept")
    with pytest.raises(RuntimeError, match="failed"):
        stragglers.run(2, out, delay_ms=-1)
    assert not list(out.glob("rank-*.json"))
    with pytest.raises(FileNotFoundError, match="run the cell"):
        stragglers.read_ranks(out)
