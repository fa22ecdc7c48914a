"""Notebook 12's straggler finder on real ranks: alike, no straggler is named; then with one rank's loader slowed,
that rank is named with what it cost the other; a failed rerun leaves nothing of the earlier launch to read."""


import pytest

from course_utils.doctor import hangs, stragglers
from course_utils.lessons import when_it_breaks
from course_utils.parallel.launch import LaunchResult, last_lines, launch

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # torchrun and two gloo ranks in every test

DELAY_MS, STEPS = 80.0, 14


def test_ranks_alike_have_no_straggler_and_the_slowed_one_is_named_with_its_cost(tmp_path):
    when_it_breaks.launch_straggler(2, tmp_path / "ranks", slow_rank=1, delay_ms=DELAY_MS, steps=STEPS,
                                    alike_steps=STEPS)
    table = stragglers.read_ranks(tmp_path / "ranks")
    alike, slowed = (table[table["phase"] == phase] for phase in ("alike", "one slowed"))
    assert sorted(slowed["step"].unique()) == list(range(STEPS, 2 * STEPS))
    verdict = stragglers.name_straggler(alike)
    assert verdict.rank is None and "No straggler" in verdict.sentence(), verdict.sentence()
    verdict = stragglers.name_straggler(slowed)
    assert verdict.rank == 1 and verdict.steps == STEPS, verdict.sentence()
    # Rank 0 waited at least most of the sleep, every step (it may wait longer: rank 1 also computes).
    assert verdict.waited[0] > 0.7 * DELAY_MS / 1000 * STEPS, verdict.sentence()
    assert "Rank 1 is the straggler" in verdict.sentence() and "rank 0 waited" in verdict.sentence()
    assert when_it_breaks.plot_rank_steps(slowed, "one rank slowed").axes

    # A rerun with a wrong value after that right one: it fails, and the records the first left are never read.
    with pytest.raises(RuntimeError, match="failed"):
        when_it_breaks.launch_straggler(2, tmp_path / "ranks", delay_ms=-1)
    assert not list((tmp_path / "ranks").glob("rank-*.json"))
    with pytest.raises(FileNotFoundError, match="run the cell"):
        stragglers.read_ranks(tmp_path / "ranks")


def test_the_doctor_beside_a_straggler_says_late_not_lost(tmp_path):
    """One look would find rank 1 in its loader's sleep, outside the all-reduce rank 0 waits in, exactly as a rank
    that never arrives; over several looks its step counter moves, and the doctor names a straggler instead."""

    def training() -> bool:  # every rank has finished a step: past its start-up, the first step's lazy imports too
        return sum(" step " in line for line in last_lines(tmp_path / "ranks-logs").values()) == 2

    # Rank 1 sleeps 2 s a batch: rank 0 waits in the all-reduce for all but its few ms of compute, so a majority of
    # five looks finds it there even on a busy machine, and rank 1's step counter moves within the looks' 4 s.
    def slowed() -> LaunchResult:
        return when_it_breaks.launch_straggler(2, tmp_path / "ranks", slow_rank=1, delay_ms=2000, steps=10)

    looked = hangs.beside(slowed, when_it_breaks.doctor_command(looks=5), training)
    assert isinstance(looked.outcome, LaunchResult) and looked.outcome.ok, looked.outcome
    screen = looked.found
    assert isinstance(screen, str), "the ranks had finished before the doctor looked"
    assert "rank 1 " in screen and "in no collective" in screen and "in 5 looks" in screen, screen
    assert "rank(s) 1 move between looks while the others wait in all_reduce" in screen, screen
    assert "never reached" not in screen, screen


MODULE_LEVEL_STRAGGLER = """import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
model = torch.nn.Linear(100, 10)
for step in range(90):  # at the top level, as the course's scripts: the step counter is a global
    if rank == 1:
        time.sleep(2.0)  # its loader, slow
    model(torch.randn(32, 100)).sum().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    stop = torch.tensor(float(os.path.exists(sys.argv[1])))  # the test has looked: every rank stops together
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    print(f"rank {rank} step {step}", flush=True)
    if stop.item():
        break
dist.destroy_process_group()
"""


def test_the_doctor_beside_a_straggler_whose_loop_is_at_the_scripts_top_level_says_late_not_lost(tmp_path):
    """py-spy prints a function's locals but not a module's globals: at every look rank 1 shows the same stack (its
    sleep) and rank 0 the same (an all-reduce). What moves is what each rank sends its peer between the looks. The
    ranks step until the doctor has looked, however long a busy machine makes it take to start."""
    script, logs, looked_file = tmp_path / "straggler.py", tmp_path / "logs", tmp_path / "looked"
    script.write_text(MODULE_LEVEL_STRAGGLER)

    def stepping() -> bool:  # both ranks have finished a step: past their start-up
        return sum(" step " in line for line in last_lines(logs).values()) == 2

    def doctor_then_stop(launcher: int) -> str:
        try:
            return when_it_breaks.doctor_command(looks=3)(launcher)
        finally:
            looked_file.touch()

    looked = hangs.beside(lambda: launch(2, str(script), str(looked_file), log_dir=logs, echo=False,
                                         timeout_seconds=240), doctor_then_stop, stepping)
    assert isinstance(looked.outcome, LaunchResult) and looked.outcome.ok, looked.outcome
    screen = looked.found
    assert isinstance(screen, str), "the ranks had finished before the doctor looked"
    assert "rank 1 " in screen and "in no collective, at straggler.py:10" in screen, screen
    assert "the same stack in 3 looks" in screen and "bytes written between them" in screen, screen
    assert "rank(s) 1 move between looks while the others wait in all_reduce" in screen, screen
    assert "never reached" not in screen, screen
