"""Notebook 12's hangs on real gloo ranks: the doctor and py-spy read ranks that really hang, the Flight Recorder
names the rank that never arrived, DETAIL names a mismatch, every launch ends within its bound and leaves no
process behind; the exercise's check is fed the script as it was, wrong fixes, a typo and a stale record. The
scripts are the ones the notebook's ``%%writefile`` cells write."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from waiting import wait_until

from course_utils.doctor import examination, hangs
from course_utils.lessons import when_it_breaks
from course_utils.lessons.script_series import shipped_script
from course_utils.parallel import launched_processes
from course_utils.parallel.launch import torchrun_command
from course_utils.tooling.exercises import Check

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

NOTEBOOK = "12_when_it_breaks.ipynb"
BOUND_SECONDS = 120  # a scenario's launch, start-up on a busy machine included


def _written(tmp_path: Path, name: str, *replacements: tuple[str, str]) -> Path:
    script = shipped_script(NOTEBOOK, name)
    for old, new in replacements:
        assert old in script, f"the notebook's {name} no longer holds {old!r}"
        script = script.replace(old, new)
    path = tmp_path / name
    path.write_text(script)
    return path


def _watched(look, seen: list[int]):
    """``look``, recording the pids of torchrun and its ranks it was given, to check afterwards that none is left."""
    def watching(launcher: int):
        seen.extend([launcher, *hangs.rank_pids(launcher).values()])
        return look(launcher)
    return watching


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie not yet reaped holds nothing
    except psutil.NoSuchProcess:
        return False


def _nothing_left(seen: list[int]) -> None:
    """torchrun and every rank the look saw have ended."""
    assert len(seen) == 3, seen  # torchrun and its two ranks were seen
    assert not [pid for pid in seen if _alive(pid)] and not hangs.launchers(os.getpid())


def test_the_doctor_finds_the_rank_that_never_arrived_while_it_hangs_and_reads_the_log_given(tmp_path):
    script, seen = _written(tmp_path, "hang.py"), []
    log = Path(__file__).parent / "fixtures" / "nccl" / "failures" / "torch_watchdog_timeout.log"
    hang = when_it_breaks.launch_hang(script, "late", "cpu", folder=tmp_path / "late", timeout_seconds=15,
                                      look=_watched(when_it_breaks.doctor_command(log), seen))
    screen = hang.looked
    assert isinstance(screen, str), "the look came after the ranks had gone"
    assert "rank 0 " in screen and "in all_reduce, at hang.py" in screen, screen
    assert "rank 1 " in screen and "in no collective, at hang.py" in screen, screen
    assert "rank(s) 1 never reached the all_reduce the others wait in and stood still at all 3 looks" in screen, screen
    assert "communication log: a collective did not finish" in screen, screen
    assert hang.seconds < BOUND_SECONDS and not hang.limit_error, hang.limit_error
    said = hang.said()
    assert "Timed out" in said.loc[0, "its error"] and "dist.all_reduce(grads)" in said.loc[0, "its script's line"]
    record = hang.flight_record
    assert record.loc[0, "collectives enqueued"] > record.loc[1, "collectives enqueued"], record
    assert record.loc[0, "last collective"] == "gloo:all_reduce" and "hang.py" in record.loc[0, "called at"]
    _nothing_left(seen)


def test_py_spy_reads_each_ranks_stack_in_mismatched_collectives_and_the_doctor_tells_a_mismatch(tmp_path):
    script, seen = _written(tmp_path, "hang.py"), []
    hang = when_it_breaks.launch_hang(script, "order", "cpu", folder=tmp_path / "order", timeout_seconds=15,
                                      look=_watched(when_it_breaks.stacks, seen))
    assert set(hang.looked) == {0, 1}, hang.looked
    looks = [examination.read_stack(rank, 0, stack, 0.0) for rank, stack in sorted(hang.looked.items())]
    assert [look.collective for look in looks] == ["all_reduce", "broadcast"], hang.looked
    assert all(look.script_line.startswith("hang.py:") for look in looks), hang.looked
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in examination.advise(looks, [], None)[0]
    assert hang.seconds < BOUND_SECONDS
    _nothing_left(seen)


@pytest.mark.oldest
@pytest.mark.parametrize("scenario, named", [("order", "OpType=BROADCAST"), ("shape", "TensorShape=[10]")])
def test_detail_names_the_mismatch_on_both_ranks(tmp_path, scenario, named):
    hang = when_it_breaks.launch_hang(_written(tmp_path, "hang.py"), scenario, "cpu", folder=tmp_path / scenario,
                                      timeout_seconds=15, detail=True)
    errors = hang.said()["its error"]
    assert len(errors) == 2 and all("Detected mismatch between collectives" in error for error in errors), errors
    assert any(named in error for error in errors), errors
    assert hang.seconds < BOUND_SECONDS and not hangs.launchers(os.getpid())


DIES = """import os, signal, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from course_utils.doctor.hangs import keep_flight_record
records, timeout = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
rank = dist.get_rank()
keep_flight_record(records, rank)
grads = torch.ones(1000)
for step in range(3):
    dist.all_reduce(grads)
print(f"rank {rank} standing: the fourth all-reduce", flush=True)
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a rank: no record, no traceback
dist.all_reduce(grads)
"""


@pytest.mark.oldest
def test_pytorchs_analyser_leaves_out_the_rank_that_died_and_reads_the_others(tmp_path):
    (tmp_path / "dies.py").write_text(DIES)
    died = when_it_breaks.launch_hang(tmp_path / "dies.py", folder=tmp_path / "dies", timeout_seconds=15)
    records = tmp_path / "dies" / "flight_record"
    assert list(died.flight_record.index) == [0], died.flight_record  # the dead rank wrote no record
    assert died.flight_record.loc[0, "collectives enqueued"] == 4
    every_rank = [part for part in hangs.analyser_command(records) if part != "--allow-incomplete-ranks"]
    refused = subprocess.run(every_rank, capture_output=True, text=True, timeout=hangs.ANALYSER_SECONDS)
    assert refused.returncode != 0 and "Missing dump files from ranks {1}" in refused.stderr, refused.stderr
    report = hangs.analyse_flight_records(records)
    assert report and "Missing dump files" not in report, report
    assert died.seconds < BOUND_SECONDS and not hangs.launchers(os.getpid())


def test_the_doctor_says_what_to_pass_when_it_cannot_tell_the_job():
    """A pid of no process. A process that is no job (the test's own) is test_every_process_ends.py's: its one
    doctor run reads what the doctor says then and how it ends."""
    missing = subprocess.run([sys.executable, "-m", "course_utils.doctor", "--pid", "999999999"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "no process has pid 999999999" in missing.stderr


TASK = """import os, subprocess, sys, time
if os.environ["SLURM_PROCID"] == "0":  # a loader worker of rank 0: same environment, not a rank of its own
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("ready", flush=True)
def wait_for_a_file_that_never_comes():
    time.sleep(120)
wait_for_a_file_that_never_comes()
"""


def test_the_doctor_finds_the_tasks_of_a_slurm_step_started_without_torchrun(tmp_path):
    """Processes with the environment srun gives each task (not srun itself, which needs a cluster)."""
    (tmp_path / "task.py").write_text(TASK)
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    tasks = [subprocess.Popen([sys.executable, str(tmp_path / "task.py")], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, **step, "SLURM_PROCID": str(rank)}, start_new_session=True)
             for rank in (0, 1)]
    try:
        assert [task.stdout.readline().strip() for task in tasks] == ["ready", "ready"]
        assert hangs.slurm_step_ranks(tasks[1].pid) == {0: tasks[0].pid, 1: tasks[1].pid}
        doctor_said = subprocess.run([sys.executable, "-m", "course_utils.doctor", "--pid", str(tasks[1].pid)],
                                     capture_output=True, text=True, timeout=120)
        screen = doctor_said.stdout
        assert doctor_said.returncode == 0 and "Slurm step 77.0, 2 rank(s)" in screen, doctor_said
        assert screen.count("in no collective, at task.py:6 in wait_for_a_file_that_never_comes") == 2, screen
    finally:
        for task in tasks:
            os.killpg(task.pid, signal.SIGKILL)
            task.wait(timeout=30)


def test_a_gpu_at_full_utilization_and_idle_power_is_named_as_spinning():
    spinning = examination.Reading(0, "GPU", utilization_percent=100, power_watts=90, power_limit_watts=700)
    working = examination.Reading(1, "GPU", utilization_percent=100, power_watts=560, power_limit_watts=700)
    idle = examination.Reading(2, "GPU", utilization_percent=0, power_watts=60, power_limit_watts=700)
    assert examination.spinning_gpus([spinning, working, idle]) == [0]


# --- the exercise --------------------------------------------------------------------------------------------

ALONE = "    if loss.item() > LOSS_LIMIT:  # a bad batch: leave it out\n"
TOGETHER = ("    bad = torch.tensor(float(loss.item() > LOSS_LIMIT))\n"
            "    dist.all_reduce(bad, op=dist.ReduceOp.MAX)\n"
            "    if bad.item():\n")


def _check(tmp_path: Path, *replacements: tuple[str, str]) -> Check:
    script = _written(tmp_path, "skip_bad_batches.py", *replacements)
    return when_it_breaks.check_skipped_batches(script, tmp_path / "exercise")


def test_the_script_as_it_was_fails_and_is_not_judged(tmp_path):
    check = _check(tmp_path)
    assert not check.done and "failed on rank" in check.text and "Nothing was judged" in check.text, str(check)
    assert not hangs.launchers(os.getpid())


def test_agreeing_on_the_skip_is_done_and_a_typo_after_it_is_a_failed_launch_not_the_earlier_record(tmp_path):
    done = _check(tmp_path, (ALONE, TOGETHER))
    assert done.done and str(done).startswith("Done: "), str(done)
    typo = _check(tmp_path, (ALONE, TOGETHER), ("optimizer.step()", "optimizer.stepp()"))
    assert not typo.done and "Nothing was judged" in typo.text, str(typo)


@pytest.mark.parametrize("edits, said", [
    ([(ALONE, "    if False:\n")], "keep leaving out a bad batch"),
    ([(ALONE, TOGETHER.replace("dist.all_reduce(bad, op=dist.ReduceOp.MAX)", "dist.broadcast(bad, src=0)"))],
     "keep leaving out a bad batch"),
    ([(ALONE, TOGETHER.replace("dist.all_reduce(bad, op=dist.ReduceOp.MAX)", "dist.broadcast(bad, src=1)"))],
     "with the corrupt sample on rank 0: the ranks left out steps"),
    ([(ALONE + "        skipped.append(step)\n        continue\n    optimizer.zero_grad()\n    loss.backward()\n",
       "    optimizer.zero_grad()\n    loss.backward()\n" + ALONE + "        skipped.append(step)\n"
       "        for parameter in model.parameters():\n            parameter.grad.zero_()\n")],
     "yet ended with the same weights: their collectives stayed in step"),
], ids=["the skip taken out", "rank 0 decides for all", "the rank that drew it decides for all",
        "its gradient zeroed, still all-reduced"])
def test_wrong_fixes_that_end_cleanly_are_not_yet(tmp_path, edits, said):
    check = _check(tmp_path, *edits)
    assert not check.done and said in check.text, str(check)


def test_a_stack_read_from_a_jupyter_kernel_is_plain_text_the_doctor_can_parse(monkeypatch):
    """A Jupyter kernel asks every program it starts for colour (these are the variables ipykernel sets), and py-spy
    then puts terminal codes inside each frame: the doctor read no frame and called a rank in all_reduce 'in no
    collective'."""
    for name, value in {"TERM": "xterm-color", "CLICOLOR": "1", "CLICOLOR_FORCE": "1", "FORCE_COLOR": "1"}.items():
        monkeypatch.setenv(name, value)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\ndef wait():\n    print('up', flush=True)\n"
                                "    time.sleep(60)\nwait()"], stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "up\n"
        stack = hangs.python_stack(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.communicate()
    assert "\x1b" not in stack, repr(stack[:300])
    look = examination.read_stack(0, sleeper.pid, stack, cpu_percent=0.0)
    assert look.read and look.script_line == "<string>:4 in wait", look


def test_a_stack_that_was_not_read_is_never_taken_for_a_rank_outside_the_collectives():
    unread = examination.read_stack(1, 4321, "py-spy could not read pid 4321: Permission denied", cpu_percent=0.0)
    waiting = examination.read_stack(0, 1234, 'Thread 1 (idle): "MainThread"\n    all_reduce (torch/distributed/'
                                         'distributed_c10d.py:3913)\n    <module> (hang.py:38)\n', cpu_percent=0.0)
    assert "stack not read (py-spy could not read pid 4321" in unread.line()
    advice = examination.advise([waiting, unread], [], None)
    assert any("rank(s) 1: the stack was not read" in line for line in advice), advice
    assert not any("never reached the collective" in line or "no rank is in a collective" in line for line in advice)


def test_the_doctor_shows_the_gpus_the_jobs_ranks_were_given_not_the_whole_shared_node():
    """One GCD per attendee on a LUMI node: the other seven are other people's, busy or idle."""
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                              env={**os.environ, "ROCR_VISIBLE_DEVICES": str(gpu)}, stdout=subprocess.PIPE, text=True)
             for gpu in (2, 3)]
    try:
        # Popen returns mid-exec, before the kernel has laid out the new environment: reading it then finds none
        assert [rank.stdout.readline() for rank in ranks] == ["up\n", "up\n"]
        gpus = examination.job_gpus([launched_processes.environment(psutil.Process(rank.pid)) for rank in ranks])
    finally:
        for rank in ranks:
            rank.kill()
            rank.communicate()
    assert gpus == ({2, 3}, "ROCR_VISIBLE_DEVICES")
    node = [examination.Reading(index, "AMD Instinct MI250X") for index in range(8)]
    shown, line = examination.the_jobs(node, gpus)
    assert [reading.index for reading in shown] == [2, 3]
    assert line == "devices: the job's GPU(s) 2, 3 (its ranks' ROCR_VISIBLE_DEVICES), of the node's 8"
    assert examination.the_jobs(node, examination.job_gpus([{"CUDA_VISIBLE_DEVICES": "GPU-5e8f"}])) == (node, "")
    assert examination.job_gpus([{"CUDA_VISIBLE_DEVICES": "0"}, {}]) is None  # one rank sees them all
    shown, line = examination.the_jobs(node, ({9}, "CUDA_VISIBLE_DEVICES"))
    assert shown == node and "which the monitor does not list" in line


SLEEPER = """import pathlib, sys, time
pathlib.Path(__file__).with_name("up" + sys.argv[1]).touch()
time.sleep(120)
"""


def test_without_pid_the_doctor_lists_each_job_with_what_it_runs_and_with_none_names_the_node(tmp_path):
    """Two torchrun jobs of this test's own (other jobs of the same user may run beside them: each is listed)."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    jobs = [subprocess.Popen(torchrun_command(1, str(tmp_path / "sleeper.py"), (f"--job={job}",), tmp_path / f"l{job}"),
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for job in (1, 2)]
    try:
        # until a job's rank runs, its launcher may still be mid-exec, showing this test's command line
        wait_until(lambda: all((tmp_path / f"up--job={job}").exists() for job in (1, 2)), "both sleepers' start",
                   timeout=120)
        with pytest.raises(SystemExit) as refused:
            examination.find_job(None)
        said = str(refused.value)
        assert "torchrun jobs of yours run on this node; name one with --pid" in said, said
        for job in (1, 2):
            assert f"torchrun pid {jobs[job - 1].pid}: sleeper.py --job={job}" in said, said
    finally:
        for job in jobs:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    none = examination.not_one_job([])
    assert f"no torchrun job of yours runs on this node ({socket.gethostname()})" in none and "srun --overlap" in none
