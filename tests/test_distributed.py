import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils.distributed import Placement, first_host, placement

TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.parametrize("nodelist,host", [
    ("nid[005001-005004,005010]", "nid005001"), ("node1,node2", "node1"), ("gpu-[1-2]", "gpu-1"),
    ("node[01-02]", "node01"), ("single", "single"), ("x[3,7-9]-ib", "x3-ib"),
])
def test_first_host_of_slurm_node_lists(nodelist, host):
    assert first_host(nodelist) == host


def test_placement_from_torchrun():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "29400"}
    assert placement(env) == Placement(3, 1, 4, "n1", 29400, "torchrun")


def test_placement_from_slurm():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "nid[005001-005004]"}
    where = placement(env)
    assert (where.rank, where.local_rank, where.world_size, where.master_addr) == (5, 1, 8, "nid005001")
    assert where.master_port == 29500 + 242 and where.source == "slurm"


def test_single_process_without_launcher():
    assert placement({}) == Placement() and not placement({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).distributed


def test_torchrun_self_check_with_gloo():
    result = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "course_utils.distributed"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("ok (backend gloo") == 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_rank_whose_peers_never_come_fails_instead_of_hanging():
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    code = "from course_utils.distributed import setup; setup(timeout_seconds=3)"
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and time.monotonic() - start < 60
