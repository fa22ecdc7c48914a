"""The job scripts submitted to a real Slurm: two nodes, one DDP rank each, gloo on the CPU.

CI starts a two-node Slurm on its own machine (``.ci/local-slurm``); elsewhere the test runs
wherever a Slurm controller answers and skips, saying how to get one, where none does.
"""

import os
import subprocess
import sys
import time

import pytest

from course_utils.config import checkout_root
from course_utils.parallel import slurm
from course_utils.run_folder import RunFolder

REQUIRED = os.environ.get("COURSE_REQUIRE_SLURM") == "1"  # set by CI: there, a missing Slurm is a failure


@pytest.fixture(scope="module")
def cluster():
    if not slurm.available():
        reason = ("no Slurm controller answers (sinfo); as root, `.ci/local-slurm install && .ci/local-slurm start` "
                  "gives this machine a two-node Slurm")
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)


# Each script as a cluster would run it, scaled down to the two CPU-only virtual nodes: the generic one
# starts one torchrun per node (c10d rendezvous); LUMI's starts the ranks with srun alone, so they
# read their places from Slurm's variables, and its GCD binding is switched off (CPU_BIND=none).
_ENV = {"COURSE_VENV": sys.prefix, "COURSE_SIZE": "ci"}
SCRIPTS = {
    "generic": ("jobs/generic/ddp.sbatch", [], {}),
    "lumi": ("jobs/lumi/ddp.sbatch", ["--partition=debug", "--ntasks-per-node=1"], {"CPU_BIND": "none"}),
}


@pytest.mark.slow
def test_a_failing_job_reports_its_exit_code(cluster, tmp_path):
    script = tmp_path / "fail.sbatch"
    script.write_text("#!/bin/bash\necho about to fail\nexit 3\n")
    job = slurm.submit(script, options=[f"--output={tmp_path / 'fail.out'}", "--time=1"], cwd=tmp_path)
    outcome = slurm.follow(job, poll_seconds=0.5, timeout_seconds=120, echo=False)
    assert outcome.state == "FAILED" and outcome.exit_code == 3 and not outcome.ok


@pytest.mark.slow
def test_a_notebook_submits_goes_on_and_reads_the_job_later(cluster, tmp_path):
    """Notebook 08's way: submit and return, keep the job in a file, and read it from there (a new kernel too)
    while it waits or runs, then once it has ended."""
    script = tmp_path / "short.sbatch"
    script.write_text("#!/bin/bash\nsleep 5\necho finished\n")
    submitted = time.monotonic()
    job = slurm.submit(script, options=[f"--output={tmp_path / 'short.out'}", "--time=1"], cwd=tmp_path)
    slurm.remember(job, tmp_path / "job.json")
    assert time.monotonic() - submitted < 5, "submitting waited for the job"
    kept = slurm.recall(tmp_path / "job.json")
    assert kept == job
    early = slurm.state(kept)
    assert not early.ended and "run this cell again later" in slurm.report(kept, early)
    outcome = slurm.follow(kept, poll_seconds=0.5, timeout_seconds=120, echo=False)
    assert outcome.ok and slurm.report(kept) == f"job {job.job_id} COMPLETED"


@pytest.mark.slow
def test_a_failed_job_is_reported_with_the_end_of_its_log(cluster, tmp_path):
    script = tmp_path / "fail.sbatch"
    script.write_text("#!/bin/bash\necho about to fail\nexit 3\n")
    job = slurm.submit(script, options=[f"--output={tmp_path / 'fail.out'}", "--time=1"], cwd=tmp_path)
    slurm.follow(job, poll_seconds=0.5, timeout_seconds=120, echo=False)
    said = slurm.report(job)
    assert said.startswith(f"job {job.job_id} ended FAILED, exit code 3") and "about to fail" in said


def test_a_kept_job_reads_back_as_submitted_and_none_when_none_was(tmp_path):
    job = slurm.Job("4242", tmp_path / "job.out", 1764000000.5)
    assert slurm.recall(tmp_path / "job.json") is None
    slurm.remember(job, tmp_path / "runs" / "job.json")
    assert slurm.recall(tmp_path / "runs" / "job.json") == job
    slurm.remember(slurm.Job("4243", None), tmp_path / "job.json")
    assert slurm.recall(tmp_path / "job.json") == slurm.Job("4243", None)


def test_the_report_says_to_come_back_while_the_job_waits_and_shows_the_log_of_a_failure(tmp_path):
    log = tmp_path / "job.out"
    job = slurm.Job("4242", log, time.time() - 60)
    waiting = slurm.report(job, slurm.Outcome("PENDING", None, "Priority"))
    assert waiting == f"job 4242 is PENDING (Priority): run this cell again later (its log: {log})"
    assert slurm.report(job, slurm.Outcome("RUNNING", None, "None")).startswith("job 4242 is RUNNING: run this")
    log.write_text("".join(f"line {n}\n" for n in range(30)) + "Traceback: the error\n")
    failed = slurm.report(job, slurm.Outcome("FAILED", 1))
    assert failed.startswith("job 4242 ended FAILED, exit code 1; the end of its log:")
    assert failed.endswith("Traceback: the error") and "line 10\n" not in failed
    # A log older than the job is an earlier job's: not shown as this one's.
    assert "line 29" not in slurm.report(slurm.Job("4243", log, time.time() + 60), slurm.Outcome("FAILED", 1))
    assert slurm.report(job, slurm.Outcome("COMPLETED", 0)) == "job 4242 COMPLETED"


def test_submitting_without_slurm_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not slurm.available()
    with pytest.raises(slurm.SlurmUnavailable, match="no Slurm"):
        slurm.submit("jobs/generic/ddp.sbatch")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_signalled_job_checkpoints_requeues_itself_and_finishes(cluster, tiny_root, tmp_path, name, run_summary):
    """Preemption for real: USR1 to the job's steps (as Slurm sends before a time limit), the ranks
    checkpoint (through torchrun, which forwards it, in the generic script), the job requeues itself
    under the same id, and the requeued run resumes from the checkpoint."""
    script, options, extra_env = SCRIPTS[name]
    out = tmp_path / "run"
    run = RunFolder(out)
    job = slurm.submit(script, "--data-dir", str(tiny_root), "--device", "cpu", "--workers", "0",
                       "--epochs", "4", "--batch-size", "8", "--train-samples", "256", "--test-samples", "32",
                       "--checkpoint-every", "4",
                       options=["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=10",
                                f"--output={tmp_path / 'job.out'}", *options],
                       cwd=checkout_root(), env={**_ENV, "COURSE_RUN_DIR": str(out), **extra_env})
    deadline = time.monotonic() + 120
    while not list(run.checkpoints.glob("step-*.pt")):
        now = slurm.state(job)
        assert now.state in ("PENDING", "RUNNING", "CONFIGURING"), f"the job ended before its first checkpoint: {now}"
        assert time.monotonic() < deadline, f"no checkpoint in {run.checkpoints} after 120 s: {now}"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", job.job_id], check=True)
    # Slurm holds a requeued job for about two minutes (Reason=BeginTime); release it at once to keep CI short.
    deadline = time.monotonic() + 120
    while (now := slurm.state(job)).state != "PENDING" or now.reason != "BeginTime":
        assert now.state not in slurm.ENDED, f"the job ended instead of requeueing itself: {now}"
        assert time.monotonic() < deadline, f"the job was not requeued within 120 s of USR1: {now}"
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"], check=True)
    outcome = slurm.follow(job, poll_seconds=0.5, timeout_seconds=400, echo=False)
    log = (tmp_path / "job.out").read_text()
    assert outcome.ok, f"{outcome}\n{log}"
    assert "stopped by SIGUSR1" in log and f"requeueing job {job.job_id}" in log and "resuming from" in log
    shown = subprocess.run(["scontrol", "show", "job", job.job_id], capture_output=True, text=True).stdout
    assert "Restarts=1" in shown
    summary = run_summary(out)
    assert summary["steps"] == 4 * 16 and summary["resumed_from"]
    # Both virtual nodes ran a DDP rank, each its share of every epoch, and rank 0 wrote the results.
    assert summary["world_size"] == 2 and summary["distributed"] == "ddp"
    assert sorted(r["node"] for r in summary["per_rank"]) == ["node1", "node2"]
    # The rendezvous numbers the nodes: rank 0's is node 0, whichever of the two it is.
    assert sorted(r["node_rank"] for r in summary["per_rank"]) == [0, 1] and summary["per_rank"][0]["node_rank"] == 0
    assert len({r["steps"] for r in summary["per_rank"]}) == 1
    assert run.metrics.stat().st_size > 0 and run.last_checkpoint.is_file()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_requeued_job_that_cannot_resume_ends_instead_of_requeueing_again(cluster, tmp_path, name, tiny_root):
    """A requeued job finds the marker of the run it continues; when its run then fails (here: no checkpoint
    loads), the job ends with the error instead of requeueing itself forever."""
    script, options, extra_env = SCRIPTS[name]
    run = RunFolder(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    run.last_checkpoint.write_bytes(b"not a checkpoint: cut short by a full disk")
    run.preempted.write_text("stopped by SIGUSR1 after step 4; resume with --resume auto\n")
    job = slurm.submit(script, "--data-dir", str(tiny_root), "--device", "cpu", "--workers", "0", "--epochs", "1",
                       options=["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=10",
                                f"--output={tmp_path / 'job.out'}", *options],
                       cwd=checkout_root(), env={**_ENV, "COURSE_RUN_DIR": str(run.path), **extra_env})
    deadline = time.monotonic() + 240
    while (now := slurm.state(job)).state not in slurm.ENDED:
        assert now.reason != "BeginTime", f"the job requeued itself after a run that failed: {now}"
        assert time.monotonic() < deadline, f"the job did not end within 240 s: {now}"
        time.sleep(0.2)
    log = (tmp_path / "job.out").read_text()
    assert now.state == "FAILED" and "requeueing" not in log, f"{now}\n{log}"
    assert "no checkpoint in" in log and "loads" in log, log
    assert not run.preempted.exists()
