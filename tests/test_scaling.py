"""The all-reduce benchmark and the scaling table: formulas as nccl-tests and the lesson define them."""

import json

import pytest

from course_utils.doctor import allreduce
from course_utils.doctor.allreduce import bus_bandwidth, message_sizes, parse_bytes
from course_utils.experiments import scaling_studies
from course_utils.parallel.launch import launch


@pytest.mark.parametrize("ranks,factor", [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_is_the_ring_traffic(ranks, factor):
    assert bus_bandwidth(10.0, ranks) == pytest.approx(10.0 * factor)


def test_message_sizes_and_units():
    assert parse_bytes("1K") == 1024 and parse_bytes("64M") == 64 * 2**20 and parse_bytes("1GB") == 2**30
    assert parse_bytes("4096") == 4096
    assert message_sizes(1024, 16384) == [1024, 4096, 16384]


@pytest.mark.slow
@pytest.mark.distributed
def test_allreduce_benchmark_on_two_gloo_ranks(tmp_path):
    out = tmp_path / "allreduce.json"
    result = launch(2, "course_utils.doctor.allreduce", "--max-bytes", "64K", "--iterations", "3", "--out", str(out),
                    log_dir=tmp_path / "logs", echo=False, timeout_seconds=120)
    assert result.ok, "\n".join(result.lines[-20:])
    rows = json.loads(out.read_text())
    assert [r["bytes"] for r in rows] == [1024, 4096, 16384, 65536]
    for row in rows:
        assert row["wrong"] == 0 and row["world_size"] == 2 and row["backend"] == "gloo"
        assert row["algorithm_gb_per_s"] == pytest.approx(row["bytes"] / row["seconds"] / 1e9)
        assert row["bus_gb_per_s"] == pytest.approx(row["algorithm_gb_per_s"])  # 2(n-1)/n = 1 for n = 2
    assert "busbw (GB/s)" in "\n".join(result.lines)


def test_allreduce_alone_says_how_to_start_it(monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)  # one process, no launcher: no partner to reduce with
    assert allreduce.main([]) == 2
    assert "torchrun --standalone --nproc-per-node 2" in capsys.readouterr().err


def _summary(ranks: int, rate: float, batch: int = 32) -> dict:
    return {"world_size": ranks, "config": {"batch_size": batch}, "global_batch_size": batch * ranks,
            "images_per_second": rate, "device": "CPU", "epoch_seconds": [1000 / rate, 900 / rate],
            "per_rank": [{"steady_iteration_seconds": batch / rate * ranks}] * ranks, "steps": 50}


def test_scaling_table_speedup_and_efficiency():
    rows = scaling_studies.table([_summary(4, 360.0), _summary(1, 100.0), _summary(2, 190.0)])
    assert list(rows["ranks"]) == [1, 2, 4]
    assert list(rows["speedup"]) == pytest.approx([1.0, 1.9, 3.6])
    assert list(rows["efficiency"]) == pytest.approx([1.0, 0.95, 0.9])
    assert list(rows["wall_seconds"]) == pytest.approx([19.0, 10.0, 1900 / 360])  # every epoch's training time
    assert list(rows["mean_iteration_seconds"]) == pytest.approx([19.0 / 50, 10.0 / 50, 1900 / 360 / 50])  # a mean
    assert "box_ap" not in rows  # a classifier's runs


def test_strong_scaling_splits_the_global_batch():
    assert scaling_studies.per_rank_batch("strong", 256, 4) == 64
    assert scaling_studies.per_rank_batch("weak", 256, 4) == 256
    with pytest.raises(ValueError, match="divisible"):
        scaling_studies.per_rank_batch("strong", 100, 3)


def test_collect_names_the_missing_summary(tmp_path):
    with pytest.raises(FileNotFoundError, match="did not finish"):
        scaling_studies.collect([tmp_path])
