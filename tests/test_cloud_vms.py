"""The one-VM-against-two comparison: the class's reported numbers beside a learner's two runs; the 'VMs' run on
this machine end with every process at their time limit."""

import contextlib
import os

import psutil
import pytest

from course_utils.lessons import cloud_vms
from course_utils.lessons.cloud_vms import answer, main, side_by_side


def _summary(ranks, epoch_seconds, batch_size=64, utilization=(97.2, 95.6)):
    nodes = [{"node_rank": rank, "node": f"vm{rank}", "backend": "nvml", "devices": [0], "utilization_percent": value}
             for rank, value in enumerate(utilization[:ranks])]
    return {"world_size": ranks, "epoch_seconds": epoch_seconds, "device": "NVIDIA T4", "node_utilization": nodes,
            "config": {"batch_size": batch_size}}


def test_the_class_row_and_this_runs_row():
    table = side_by_side(_summary(1, [100.0, 80.0]), _summary(2, [50.0, 50.0]))
    the_class, this_run = table.to_dict("records")
    assert the_class["speedup"] == pytest.approx(3452 / 1878) and round(the_class["speedup"], 2) == 1.84
    assert the_class["efficiency"] == pytest.approx(0.919, abs=1e-3)
    assert this_run["seconds_fewer_vms"] == 180 and this_run["speedup"] == 1.8 and this_run["efficiency"] == 0.9
    text = answer(table)
    assert "The class: **1.84x** from one VM to two (92% efficiency)" in text and "This run: **1.80x** (90%)" in text
    assert "CPU processes of one machine" not in text
    on_a_cpu = side_by_side(_summary(1, [100.0, 80.0]), {**_summary(2, [50.0, 50.0]), "device": "CPU"})
    assert "CPU processes of one machine" in answer(on_a_cpu)
    assert this_run["utilization"] == "node 0: 97 %, node 1: 96 %" and "node 1: 96 %." in text


def test_utilization_per_node_says_what_was_not_sampled_or_read():
    assert side_by_side(_summary(1, [2.0]), _summary(2, [1.0], utilization=()))["utilization"][1] == (
        "not sampled (--monitor)")
    assert side_by_side(_summary(1, [2.0]), _summary(2, [1.0], utilization=(None, 50.0)))["utilization"][1] == (
        "node 0: not readable, node 1: 50 %")


def test_runs_at_different_batches_per_gpu_are_refused():
    with pytest.raises(ValueError, match="--batch-size"):
        side_by_side(_summary(1, [10.0]), _summary(2, [6.0], batch_size=32))


def test_a_run_that_did_not_finish_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did not finish" in err


@pytest.mark.slow
@pytest.mark.distributed
def test_vms_past_their_time_limit_are_ended_with_every_process(tiny_root, tmp_path, monkeypatch, free_port):
    """Two 'VMs' (run_node.sh, torchrun, a rank each, loader workers) past the limit: none of their processes is
    left behind when local_vms returns."""
    tag = f"vms-{os.getpid()}"
    monkeypatch.setenv("COURSE_TEST_VMS", tag)
    with pytest.raises(TimeoutError, match="the 2 VMs ran past 20 s, and were ended: "):
        cloud_vms.local_vms(2, tmp_path / "run", "--size", "ci", "--data-dir", str(tiny_root), "--workers", "2",
                            "--epochs", "50", "--input-delay-ms", "50", port=free_port, timeout=20)
    left = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("COURSE_TEST_VMS") == tag and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
    assert not left, f"left running: {left}"
