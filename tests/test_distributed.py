"""Where a process sits in a job, and the process group for real: torchrun's self-check, a rank left alone."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils.experiments.machine_shape import parallel_shape
from course_utils.parallel.process_group import Placement, first_host, placement

TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.parametrize("nodelist,host", [
    ("nid[005001-005004,005010]", "nid005001"), ("node1,node2", "node1"), ("gpu-[1-2]", "gpu-1"),
    ("node[01-02]", "node01"), ("single", "single"), ("x[3,7-9]-ib", "x3-ib"),
])
def test_first_host_of_slurm_node_lists(nodelist, host):
    assert first_host(nodelist) == host


def test_placement_from_torchrun():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1", "MASTER_ADDR": "n1",
           "MASTER_PORT": "29400"}
    assert placement(env) == Placement(3, 1, 4, "n1", 29400, "torchrun", node_rank=1)
    assert not placement(env).is_node_main and placement({**env, "LOCAL_RANK": "0"}).is_node_main


def test_placement_from_slurm():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "nid[005001-005004]", "SLURM_NODEID": "2"}
    where = placement(env)
    assert (where.rank, where.local_rank, where.world_size, where.master_addr) == (5, 1, 8, "nid005001")
    assert where.node_rank == 2
    assert where.master_port == 29500 + 242 and where.source == "slurm"


def test_single_process_without_launcher():
    assert placement({}) == Placement() and not placement({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).distributed


@pytest.mark.oldest
@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_self_check_with_gloo(torchrun_self_check):
    """The docstring's ``torchrun ... -m course_utils.parallel.process_group``: both ranks all-reduce over gloo
    and agree. One run per session, shared with test_launch."""
    assert os.access(TORCHRUN, os.X_OK), f"{TORCHRUN} is missing: the course's commands and job scripts call it"
    result = torchrun_self_check.result
    assert result.returncode == 0, "\n".join(result.lines[-30:])
    checks = [line for line in result.lines if "ok (backend gloo" in line]
    assert len(checks) == 2, "\n".join(result.lines[-30:])
    assert all(any(f"[rank {rank}/2] torchrun:" in line for line in checks) for rank in (0, 1)), checks


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_whose_peers_never_come_fails_instead_of_hanging(free_port):
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port)}
    code = "from course_utils.parallel.process_group import join; join(timeout_seconds=3)"
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and time.monotonic() - start < 60
    assert "timed out" in result.stderr, result.stderr[-2000:]  # its own timeout ended it, not another error


@pytest.mark.parametrize(("gpus", "ranks", "device", "says"), [
    (0, 2, "cpu", "no GPU here: the 2 ranks are CPU processes talking through gloo"),
    (1, 2, "cpu", "one GPU here: the 2 ranks are CPU processes"),  # two ranks on one GPU: NCCL refuses
    (2, 2, "auto", "2 ranks, one per GPU"),
    (8, 8, "auto", "8 ranks, one per GPU"),
])
def test_the_ddp_lessons_fit_every_machine_shape(gpus, ranks, device, says):
    shape = parallel_shape(gpus)
    assert (shape.ranks, shape.device) == (ranks, device) and says in shape.describe()
    if gpus < 2:
        assert "ask for 2 or more GPUs" in shape.describe()


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_cpu_ranks_run_the_ci_size_whatever_size_is_active_and_say_so(gpus, monkeypatch):
    """The one home of the rule five notebooks used to write out each."""
    monkeypatch.setenv("COURSE_SIZE", "workshop")
    shape = parallel_shape(gpus)
    assert shape.size.name == ("workshop" if gpus >= 2 else "ci")
    assert shape.script_device == ("cuda" if gpus >= 2 else "cpu")
    assert ("runs the ci size" in shape.describe()) == (gpus < 2)
    monkeypatch.setenv("COURSE_SIZE", "ci")
    assert "runs the ci size" not in parallel_shape(gpus).describe()
