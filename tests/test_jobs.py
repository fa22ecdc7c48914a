"""Job scripts must be valid bash and call the course's entry point with flags it knows; the cloud
recipe runs for real as two 'VMs' on this machine."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from course_utils.config import checkout_root
from course_utils.parallel.allreduce import build_parser as allreduce_parser
from course_utils.run_folder import RunFolder
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
def test_cloud_recipe_joins_two_nodes_through_c10d_and_each_node_samples_its_devices(tiny_root, two_cloud_nodes):
    summary = two_cloud_nodes(["--data-dir", str(tiny_root), "--device", "cpu", "--workers", "0", "--max-steps", "3",
                               "--batch-size", "8", "--train-samples", "64", "--test-samples", "16",
                               "--monitor", "cpu", "--monitor-interval", "0.05"])
    assert summary["world_size"] == 2 and [r["steps"] for r in summary["per_rank"]] == [3, 3]
    # Each "VM" is a node of its own (c10d numbered them), and each node's first process sampled it.
    assert sorted(r["node_rank"] for r in summary["per_rank"]) == [0, 1]
    nodes = summary["node_utilization"]
    assert [node["node_rank"] for node in nodes] == [0, 1] and all(node["backend"] == "cpu" for node in nodes)
    assert all(0 <= node["utilization_percent"] <= 100 for node in nodes)
    run = RunFolder(summary["out"])
    assert len(pd.read_csv(run.monitor)) > 0 and len(pd.read_csv(run.node_monitor(1))) > 0


def test_cloud_recipe_without_head_names_it():
    env = {k: v for k, v in os.environ.items() if k != "HEAD"}
    result = subprocess.run(["jobs/cloud/run_node.sh"], cwd=checkout_root(), env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "set HEAD to the address of the first VM" in result.stderr


def test_cloud_recipe_stops_and_says_so_when_nvidia_smi_hangs(tmp_path):
    """A hanging GPU driver makes nvidia-smi hang; the node's start must not hang with it, silently."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/bash\nexec sleep 600\n")  # as a driver that never answers
    (bin_dir / "nvidia-smi").chmod(0o755)
    environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HEAD": "127.0.0.1",
                   "NVIDIA_SMI_TIMEOUT": "2"}
    result = subprocess.run(["jobs/cloud/run_node.sh"], cwd=checkout_root(), env=environment, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "nvidia-smi did not answer in 2 s" in result.stderr, result.stderr


def _container_command(tmp_path, runtime, **env):
    """The command line jobs/cloud/ngc.sh gives ``runtime``, read by a stand-in that prints its arguments
    (neither Docker nor Apptainer runs on the CI machine)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / runtime).write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / runtime).chmod(0o755)
    environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "COURSE_CONTAINER_RUNTIME": runtime, **env}
    result = subprocess.run(["jobs/cloud/ngc.sh", "jobs/cloud/run_node.sh", "--epochs", "1"], cwd=checkout_root(),
                            env=environment, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_ngc_container_gets_the_gpus_the_host_network_and_the_recipe_variables(tmp_path):
    args = _container_command(tmp_path, "docker", HEAD="10.0.0.4", NNODES="2", NCCL_SOCKET_IFNAME="ens5")
    assert args[:7] == ["run", "--rm", "--gpus", "all", "--ipc=host", "--network", "host"]
    assert {"HEAD", "NNODES", "NCCL_SOCKET_IFNAME", "COURSE_VENV"} <= {args[i + 1] for i, a in enumerate(args)
                                                                       if a == "-e"}
    assert f"{checkout_root()}:{checkout_root()}" in args and "-p" not in args  # nothing published to the internet
    assert args[-4:] == ["nvcr.io/nvidia/pytorch:25.12-py3", "jobs/cloud/run_node.sh", "--epochs", "1"]


def test_ngc_container_through_apptainer(tmp_path):
    args = _container_command(tmp_path, "apptainer", COURSE_NGC_IMAGE="ngc.sif")
    assert args[:3] == ["exec", "--nv", "--bind"] and args[-4] == "ngc.sif"


def test_course_requirements_leave_the_containers_packages_and_constrained_pins_to_it(tmp_path):
    constraints = tmp_path / "constraint.txt"
    constraints.write_text("# the container's\nnumpy==2.1.0\nJupyterLab==4.2.5\ntorch==2.10.0a0\n")
    result = subprocess.run([sys.executable, "jobs/course_requirements.py", "--without", "torch", "torchvision",
                             "nvidia-dali", "--constraints", str(constraints)], cwd=checkout_root(),
                            capture_output=True, text=True, check=True)
    lines = result.stdout.split()
    assert "numpy" in lines and "jupyterlab" in lines and "pandas==3.1.1" in lines
    assert not any(line.startswith(("torch", "nvidia-dali")) for line in lines)
    assert "numpy==2.4.6" in result.stderr


# What LUMI's container maintainers list as a cause of hangs (lumi-ai-factory/laifs-container-recipes #28, #30).
HANGS_ON_LUMI = ("NCCL_NET_GDR_LEVEL",)


def _lumi_environment(tmp_path: Path) -> dict[str, str]:
    """The variables jobs/lumi/lumi_env.sh leaves set, sourced by bash as a job does (no module command here)."""
    script = checkout_root() / "jobs" / "lumi" / "lumi_env.sh"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "USER": "learner", "SLURM_SUBMIT_DIR": str(tmp_path),
           "SLURM_JOB_ID": f"{os.getpid()}"}
    printed = subprocess.run(["bash", "-c", f"set -euo pipefail; source {script}; env -0"], env=env,
                             capture_output=True, text=True, check=True).stdout
    return dict(entry.split("=", 1) for entry in printed.split("\0") if "=" in entry)


def test_the_lumi_environment_sets_nothing_known_to_hang_and_records_what_it_sets(tmp_path):
    env = _lumi_environment(tmp_path)
    assert not set(HANGS_ON_LUMI) & set(env), "RCCL finds the GPU-direct level itself (jobs/lumi/SETTINGS.md)"
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3" and env["MIOPEN_USER_DB_PATH"].startswith("/tmp/")
    settings = (checkout_root() / "jobs" / "lumi" / "SETTINGS.md").read_text()
    exported = re.findall(r"\b([A-Z][A-Z0-9_]+)=", (checkout_root() / "jobs" / "lumi" / "lumi_env.sh").read_text())
    unrecorded = {name for name in exported if name in env and not name.startswith("COURSE_")
                  and f"`{name}" not in settings}
    assert not unrecorded, f"set by lumi_env.sh but not in jobs/lumi/SETTINGS.md: {unrecorded}"


def test_the_readmes_container_is_the_image_the_settings_were_checked_against():
    texts = "".join((checkout_root() / name).read_text() for name in ("README.md", "docs/lumi_day_card.md"))
    images = set(re.findall(r"COURSE_CONTAINER=\S*/(lumi-multitorch-full-[\w-]+\.sif)", texts))
    assert images == {"lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif"}
    assert images.pop() in (checkout_root() / "jobs" / "lumi" / "SETTINGS.md").read_text()
