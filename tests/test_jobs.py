"""Job scripts must be valid bash and call the course's entry point with flags it knows; the cloud
recipe runs for real as two 'VMs' on this machine."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.config import checkout_root
from course_utils.parallel.allreduce import build_parser as allreduce_parser
from course_utils.training.options import build_parser as train_parser

SCRIPTS = sorted(p for p in (checkout_root() / "jobs").rglob("*") if p.suffix in (".sbatch", ".sh"))
ENTRY_POINTS = {"course_utils.train": train_parser(), "course_utils.parallel.allreduce": allreduce_parser()}


def _flags(script: Path, module: str) -> list[str]:
    """The --flags given to `-m module`, following line continuations."""
    text = script.read_text().replace("\\\n", " ")
    commands = [line.split(module, 1)[1] for line in text.splitlines() if f"-m {module}" in line]
    return [flag for command in commands for flag in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", command)]


def test_there_are_job_scripts():
    assert any(script.suffix == ".sbatch" for script in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(checkout_root())))
def test_job_script(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    called = [module for module in ENTRY_POINTS if f"-m {module}" in script.read_text()]
    if script.suffix == ".sbatch" or script.name == "run_node.sh":
        assert called, "a job must call the course's entry points, never a copy of the loop"
    for module in called:
        known = {flag for action in ENTRY_POINTS[module]._actions for flag in action.option_strings}
        flags = _flags(script, module)
        assert set(flags) <= known, f"unknown flags for {module}: {set(flags) - known}"


@pytest.mark.slow
@pytest.mark.distributed
def test_cloud_recipe_joins_two_nodes_through_c10d(tiny_root, tmp_path, free_port, run_summary):
    out = tmp_path / "run"
    env = {**os.environ, "HEAD": "127.0.0.1", "PORT": str(free_port), "NNODES": "2", "NPROC_PER_NODE": "1",
           "COURSE_VENV": sys.prefix, "COURSE_SIZE": "ci", "RUN_ID": tmp_path.name}
    args = ["--data-dir", str(tiny_root), "--device", "cpu", "--workers", "0", "--max-steps", "3", "--batch-size", "8",
            "--train-samples", "64", "--test-samples", "16", "--out", str(out)]
    nodes = [subprocess.Popen(["jobs/cloud/run_node.sh", *args], cwd=checkout_root(), env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)
    summary = run_summary(out)
    assert summary["world_size"] == 2 and [r["steps"] for r in summary["per_rank"]] == [3, 3]


def test_cloud_recipe_without_head_names_it():
    env = {k: v for k, v in os.environ.items() if k != "HEAD"}
    result = subprocess.run(["jobs/cloud/run_node.sh"], cwd=checkout_root(), env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "set HEAD to the address of the first VM" in result.stderr
