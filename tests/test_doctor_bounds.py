"""The doctor beside real processes ends by itself and says what it met: seconds that are not a finite number are an
argparse error, not a traceback; a log longer than its time is read in part and said so; a job of another user is
named as not yours; a job that ends while the doctor looks is said to have ended, not to be moving."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from waiting import wait_until

pytestmark = pytest.mark.slow  # real processes read by py-spy, and the doctor's start-up (it imports torch)

DOCTOR_SECONDS = 120  # a doctor's run on a busy machine, start-up included
NCCL = Path(__file__).parent / "fixtures" / "nccl"
OTHER_USER = "course-doctor-test"

TASK = """import os, sys, time
def work(stop):
    step = 0
    while not os.path.exists(stop):  # it moves: its step counter changes between looks, until told to stop
        step += 1
        time.sleep(0.05)
print("ready", flush=True)
work(sys.argv[1])
"""


def _doctor(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course_utils.doctor", *flags], capture_output=True, text=True,
                          timeout=DOCTOR_SECONDS)


@pytest.fixture
def step(tmp_path: Path) -> Iterator[tuple[list[subprocess.Popen], Path]]:
    """Two tasks of a Slurm step on this node (the environment srun gives each task), moving until ``stop`` exists."""
    (tmp_path / "task.py").write_text(TASK)
    stop = tmp_path / "stop"
    env = {"SLURM_JOB_ID": "78", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    tasks = [subprocess.Popen([sys.executable, str(tmp_path / "task.py"), str(stop)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, **env, "SLURM_PROCID": str(rank)}, start_new_session=True)
             for rank in (0, 1)]
    try:
        assert [task.stdout.readline().strip() for task in tasks] == ["ready", "ready"]
        yield tasks, stop
    finally:
        for task in tasks:
            if task.poll() is None:
                os.killpg(task.pid, signal.SIGKILL)
            task.wait(timeout=30)


@pytest.mark.parametrize("every", ["nan", "inf", "-inf", "-1", "soon"])
def test_seconds_that_are_not_a_finite_number_are_an_argparse_error(step, every):
    """Before: `--every nan` and `--every inf` reached time.sleep and ended in a traceback."""
    tasks, _ = step
    done = _doctor("--pid", str(tasks[0].pid), f"--every={every}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"argument --every: {every!r} is not a number of seconds (a finite number, 0 or more)" in done.stderr


def test_looks_that_would_outlast_the_doctors_bound_are_refused_before_looking(step):
    assert "--within WITHIN" in _doctor("--help").stdout
    tasks, _ = step
    done = _doctor("--pid", str(tasks[0].pid), "--looks", "3", "--every", "1000")
    assert done.returncode == 2 and "more than the looks' share of --within 90 s" in done.stderr, done.stderr


def test_a_log_longer_than_the_doctors_time_is_read_in_part_and_said_so(step, tmp_path):
    """A real log repeated to 60 MB takes tens of seconds to read here: the doctor reads what its bound allows."""
    tasks, _ = step
    log = tmp_path / "job.err"
    lines = (NCCL / "failures" / "torch_watchdog_timeout.log").read_text().splitlines()[1:]
    with open(log, "w") as stream:
        for _ in range(60 * 2**20 // len("\n".join(lines))):
            stream.write("\n".join(lines) + "\n")
    began = time.monotonic()
    done = _doctor("--pid", str(tasks[0].pid), "--looks", "1", "--within", "5", "--log", str(log))
    assert done.returncode == 0, done.stderr
    assert "communication log: a collective did not finish" in done.stdout, done.stdout
    assert "Only part of the log was read (" in done.stdout and " MB within " in done.stdout, done.stdout
    assert time.monotonic() - began < 5 + 30  # the bound, and the doctor's start-up on a busy machine


def test_a_log_that_is_a_fifo_is_refused_before_the_doctor_looks(step, tmp_path):
    """Before: "no such file", of a file that is there."""
    tasks, _ = step
    os.mkfifo(tmp_path / "job.err")
    done = _doctor("--pid", str(tasks[0].pid), "--log", str(tmp_path / "job.err"))
    assert done.returncode == 2 and "is a FIFO (named pipe), not a log file: give the file the ranks wrote" in (
        done.stderr), done.stderr


def _py_spies(doctor: subprocess.Popen) -> dict[int, str]:
    """The doctor's py-spy processes running now: pid -> command line."""
    found = {}
    try:
        for child in psutil.Process(doctor.pid).children(recursive=True):
            if child.name() == "py-spy":
                found[child.pid] = " ".join(child.cmdline())
    except psutil.Error:
        pass
    return found


def _after_two_looks(doctor: subprocess.Popen, last_rank: int) -> None:
    """Wait until the doctor has read the last rank twice (two py-spy runs on it, both done): between two looks."""
    read, deadline = set(), time.monotonic() + DOCTOR_SECONDS
    while doctor.poll() is None and time.monotonic() < deadline:
        spies = _py_spies(doctor)
        read |= {pid for pid, command in spies.items() if command.endswith(f"--pid {last_rank} --locals")}
        if len(read) >= 2 and not spies:
            return
        time.sleep(0.01)


def test_a_job_that_ends_while_the_doctor_looks_is_said_to_have_ended(step):
    """Before: the ranks' step counters, changed between the two looks before they ended, made them "moving", and
    the doctor exited 0."""
    tasks, stop = step
    doctor = subprocess.Popen([sys.executable, "-m", "course_utils.doctor", "--pid", str(tasks[0].pid), "--looks",
                               "8", "--every", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _after_two_looks(doctor, tasks[1].pid)
    stop.touch()  # the tasks end now, between the doctor's looks
    out, err = doctor.communicate(timeout=DOCTOR_SECONDS)
    assert doctor.returncode == 1, (out, err)
    assert "Slurm step 78.0, 2 rank(s) on this node: the job ended while the doctor looked" in out, out
    assert out.count("ended while the doctor looked; last seen in no collective, at task.py:") == 2, out
    assert "moving" not in out and "the job ended while the doctor looked: read how in its output" in out, out


@pytest.fixture(scope="module")
def other_user() -> Iterator[pwd.struct_passwd]:
    """A user of this machine that is not the test's, created for it (only root may)."""
    if os.geteuid() != 0:
        pytest.skip("creating another user needs root; as a user, point the doctor at a process of root's by hand")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd on this machine")
    created = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                             capture_output=True, text=True, timeout=60)
    assert created.returncode in (0, 9), created.stderr  # 9: there already
    yield pwd.getpwnam(OTHER_USER)
    subprocess.run(["userdel", OTHER_USER], capture_output=True, timeout=60)


def test_a_job_of_another_user_is_named_as_not_yours(other_user):
    """A `sleep` of that user named torchrun, as its launcher would be: before, "0 rank(s) on this node", exit 0."""
    def as_other_user() -> None:
        os.setgroups([])
        os.setgid(other_user.pw_gid)
        os.setuid(other_user.pw_uid)

    launcher = subprocess.Popen(["bash", "-c", "exec -a torchrun sleep 120"], preexec_fn=as_other_user)
    try:
        wait_until(lambda: psutil.Process(launcher.pid).cmdline()[:1] == ["torchrun"], "bash becoming the sleep")
        done = _doctor("--pid", str(launcher.pid))
    finally:
        launcher.kill()
        launcher.wait(timeout=30)
    assert done.returncode != 0 and "0 rank(s)" not in done.stdout, done
    said = done.stderr
    assert f"pid {launcher.pid} belongs to user {OTHER_USER}, not to you (root): the job is not yours" in said, said
    assert "py-spy reads a process's stack only as the same user or as root" in said, said
    assert f"sudo -u {OTHER_USER} python -m course_utils.doctor --pid {launcher.pid}" in said, said
