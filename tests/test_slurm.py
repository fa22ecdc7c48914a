"""The generic job script submitted to a real Slurm: two nodes, one DDP rank each, gloo on the CPU.

CI starts a two-node Slurm on its own machine (``.ci/local-slurm``); elsewhere the test runs
wherever a Slurm controller answers and skips, saying how to get one, where none does.
"""

import json
import os
import sys

import pytest

from course_utils import slurm
from course_utils.config import checkout_root

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
SCRIPTS = {
    "generic": ("jobs/generic/ddp.sbatch", [], {}),
    "lumi": ("jobs/lumi/ddp.sbatch", ["--partition=debug", "--ntasks-per-node=1"], {"CPU_BIND": "none"}),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_job_runs_ddp_on_two_nodes(cluster, tiny_root, tmp_path, name, capsys):
    script, options, extra_env = SCRIPTS[name]
    out = tmp_path / "run"
    job = slurm.submit(script, "--data-dir", str(tiny_root), "--device", "cpu", "--workers", "0", "--max-steps", "4",
                       "--batch-size", "16", "--train-samples", "128", "--test-samples", "32", "--out", str(out),
                       options=["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=5",
                                f"--output={tmp_path / 'job.out'}", *options],
                       cwd=checkout_root(), env={"COURSE_VENV": sys.prefix, "COURSE_SIZE": "ci", **extra_env})
    assert job.log == tmp_path / "job.out"
    outcome = slurm.follow(job, poll_seconds=0.5, timeout_seconds=300)
    streamed = capsys.readouterr().out
    assert outcome.ok, f"{outcome}\n{streamed}"
    assert f"job {job.job_id}:" in streamed  # the log came through as it grew
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["distributed"] == "ddp"
    assert sorted(r["node"] for r in summary["per_rank"]) == ["node1", "node2"]
    assert [r["steps"] for r in summary["per_rank"]] == [4, 4]
    assert (out / "metrics.jsonl").stat().st_size > 0 and (out / "checkpoints" / "last.pt").is_file()


def test_a_failing_job_reports_its_exit_code(cluster, tmp_path):
    script = tmp_path / "fail.sbatch"
    script.write_text("#!/bin/bash\necho about to fail\nexit 3\n")
    job = slurm.submit(script, options=[f"--output={tmp_path / 'fail.out'}", "--time=1"], cwd=tmp_path)
    outcome = slurm.follow(job, poll_seconds=0.5, timeout_seconds=120, echo=False)
    assert outcome.state == "FAILED" and outcome.exit_code == 3 and not outcome.ok


def test_submitting_without_slurm_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not slurm.available()
    with pytest.raises(slurm.SlurmUnavailable, match="no Slurm"):
        slurm.submit("jobs/generic/ddp.sbatch")
