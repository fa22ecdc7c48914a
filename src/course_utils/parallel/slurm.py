"""Submit a job script to Slurm from a notebook and follow it: state, log tail, exit code (notebook 08).

    job = submit("jobs/generic/ddp.sbatch", "--max-steps", "50", options=["--nodes=2"])
    remember(job, path)              # a notebook submits and goes on: a later cell, or a new kernel,
    print(report(recall(path)))      # says where the job is, and how it ended once it has
    outcome = follow(job)            # or wait: prints the log as it grows; returns when the job has ended
    outcome.state, outcome.exit_code

The state comes from ``scontrol show job`` while Slurm remembers the job, then from ``sacct``
where accounting is set up. Nothing here needs more than the Slurm commands on the PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


class SlurmUnavailable(RuntimeError):
    """No Slurm here: the commands are missing or no controller answers."""


def available() -> bool:
    """True when ``sbatch`` exists and a controller answers ``sinfo``."""
    if shutil.which("sbatch") is None:
        return False
    return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0


@dataclass(frozen=True)
class Job:
    job_id: str
    log: Path | None  # the job's --output file, when known
    submitted_at: float = 0.0  # time.time() at submission: an older file at the log's path is not this job's


@dataclass(frozen=True)
class Outcome:
    state: str  # Slurm's job state, e.g. COMPLETED, FAILED, or PENDING/RUNNING while it lasts
    exit_code: int | None  # the batch script's exit status once the job has ended
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == 0

    @property
    def ended(self) -> bool:
        """The job runs no more (or Slurm no longer knows it): nothing will change by waiting."""
        return self.state in ENDED or self.state == "UNKNOWN"


def submit(script: str | Path, *args: str, options: list[str] | tuple[str, ...] = (), cwd: Path | None = None,
           env: dict[str, str] | None = None) -> Job:
    """``sbatch [options] script args...`` from ``cwd``; returns the job and its log file."""
    if shutil.which("sbatch") is None:
        raise SlurmUnavailable("sbatch is not on the PATH: this machine has no Slurm (on a cluster, run from a "
                               "login node or a Jupyter session started through Slurm)")
    submitted_at = time.time()
    result = subprocess.run(["sbatch", "--parsable", *options, str(script), *args], cwd=cwd,
                            env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"sbatch refused {script}: {result.stderr.strip()}")
    job_id = result.stdout.strip().split(";")[0]
    return Job(job_id, _log_path(job_id, cwd), submitted_at)


def _fields(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol -o`` line."""
    pairs = (token.split("=", 1) for token in text.split() if "=" in token)
    return {key: value for key, value in pairs}


def _log_path(job_id: str, cwd: Path | None) -> Path | None:
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    path = _fields(shown.stdout).get("StdOut")
    if not path:
        return None
    return Path(path) if Path(path).is_absolute() else Path(cwd or ".") / path


def _exit_status(code: str) -> int | None:
    """``0:0`` (status:signal) as the status; a job killed by a signal gets 128 + signal, as in a shell."""
    status, _, signal = code.partition(":")
    if not status.isdigit():
        return None
    return 128 + int(signal) if signal.isdigit() and int(signal) else int(status)


def state(job: Job | str) -> Outcome:
    """Where the job is now."""
    job_id = job.job_id if isinstance(job, Job) else job
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    if shown.returncode == 0 and shown.stdout.strip():
        fields = _fields(shown.stdout)
        name = fields.get("JobState", "UNKNOWN")
        code = _exit_status(fields.get("ExitCode", "")) if name in ENDED else None
        return Outcome(name, code, fields.get("Reason", ""))
    accounted = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "--format=State,ExitCode"],
                               capture_output=True, text=True, timeout=30)
    line = accounted.stdout.strip().splitlines()[-1:] if accounted.returncode == 0 else []
    if line:
        name, _, code = line[0].partition("|")
        name = name.split()[0]
        return Outcome(name, _exit_status(code) if name in ENDED else None)
    return Outcome("UNKNOWN", None, "Slurm no longer remembers the job and has no accounting")


def remember(job: Job, path: Path) -> None:
    """Keep ``job`` in ``path`` (JSON) for :func:`recall`: a later cell, or a new kernel, reads it there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"job_id": job.job_id, "log": str(job.log) if job.log else None,
                                "submitted_at": job.submitted_at}) + "\n")


def recall(path: Path) -> Job | None:
    """The job :func:`remember` kept in ``path``; ``None`` when none was submitted."""
    if not path.exists():
        return None
    kept = json.loads(path.read_text())
    return Job(kept["job_id"], Path(kept["log"]) if kept["log"] else None, kept["submitted_at"])


def log_tail(job: Job, lines: int = 20) -> str:
    """The last ``lines`` of the job's log, when it has one that this job wrote."""
    if job.log is None or not job.log.exists() or job.log.stat().st_mtime < job.submitted_at - 1:
        return ""
    return "\n".join(job.log.read_text(errors="replace").splitlines()[-lines:])


def report(job: Job, outcome: Outcome | None = None) -> str:
    """Where ``job`` is, in words: waiting or running (come back later), or how it ended, with its log's end
    when it failed."""
    outcome = outcome or state(job)
    where = f"its log: {job.log}" if job.log else "squeue --me shows it"
    if not outcome.ended:
        reason = f" ({outcome.reason})" if outcome.reason and outcome.reason != "None" else ""
        return f"job {job.job_id} is {outcome.state}{reason}: run this cell again later ({where})"
    if outcome.ok:
        return f"job {job.job_id} COMPLETED"
    ended = f"job {job.job_id} ended {outcome.state}, exit code {outcome.exit_code}"
    tail = log_tail(job)
    return f"{ended}; the end of its log:\n{tail}" if tail else f"{ended}; {outcome.reason or where}"


def follow(job: Job, poll_seconds: float = 1.0, timeout_seconds: float | None = None, echo: bool = True) -> Outcome:
    """Wait for ``job`` to end, printing its log as it grows; ``timeout_seconds`` cancels it."""
    start, printed = time.monotonic(), 0
    while True:
        outcome = state(job)
        if echo and job.log is not None and job.log.exists() and job.log.stat().st_mtime >= job.submitted_at - 1:
            text = job.log.read_text(errors="replace")
            print(text[printed:], end="", flush=True)
            printed = len(text)
        if outcome.state in ENDED or outcome.state == "UNKNOWN":
            return outcome
        if timeout_seconds is not None and time.monotonic() - start > timeout_seconds:
            subprocess.run(["scancel", job.job_id], capture_output=True, timeout=30)
            raise TimeoutError(f"job {job.job_id} ran past {timeout_seconds} s and was cancelled")
        time.sleep(poll_seconds)
