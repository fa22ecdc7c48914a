"""The interconnect health check of notebook 12 reads osu_bw, rccl-tests and nccl-tests as they really print
(tests/fixtures/interconnect/, sources in tests/fixtures/README.md) and judges them against LUMI's container
tests' minimums (lumi-ai-factory/laifs-container-tests at commit 5876d14, jobs/mpi-*-gpu-to-gpu-pt2pt-osu_bw.yaml)."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course_utils.config import checkout_root
from course_utils.doctor import interconnect_health as health

FIXTURES = checkout_root() / "tests" / "fixtures" / "interconnect"
MIB = 2**20


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_lumis_minimums_are_those_of_its_container_tests():
    minimum = health.lumi_minimum_gb_s
    assert minimum(0, 1, 64 * MIB) == minimum(1, 0, 64 * MIB) == 50.0  # the two GCDs of one module
    assert {minimum(0, b, 64 * MIB) for b in range(2, 8)} == {37.0, 45.0}  # 45 to GCD 6, 37 elsewhere
    assert minimum(1, 7, 64 * MIB) == 30.0  # the one pair LUMI's test lets down to 30 GB/s
    assert minimum(0, 1, MIB) == 36.0 and minimum(0, 5, MIB) == 25.0
    assert minimum(0, 3, 64 * MIB, between_nodes=True) == minimum(1, 7, MIB, between_nodes=True) == 23.75
    assert minimum(2, 3, 64 * MIB) is None and minimum(0, 1, 4 * MIB) is None  # pairs and sizes LUMI does not test
    assert len(health.LUMI_INTRA_NODE_MINIMUM_MB_S) == 2 * 8 * 2


@pytest.mark.parametrize(("name", "device", "version", "rows", "at_1_mib", "at_64_mib"), [
    ("osu_bw_rocm_v7.5_pair_0_1.txt", "ROCM", "7.5", 28, 38.91421, 137.85437),
    ("osu_bw_cuda_v7.2_a100.txt", "CUDA", "7.2", 26, 73.67519, None),  # its sweep stopped at 32 MiB
])
def test_osu_bw_is_read_by_message_size(name, device, version, rows, at_1_mib, at_64_mib):
    result = health.parse_osu_bw(_text(name))
    assert (result.device, result.version, len(result.table)) == (device, version, rows)
    assert result.gb_per_s_at(MIB) == pytest.approx(at_1_mib)
    assert result.gb_per_s_at(64 * MIB) == (pytest.approx(at_64_mib) if at_64_mib else None)


def test_a_pair_is_judged_at_each_of_lumis_sizes():
    result = health.parse_osu_bw(_text("osu_bw_rocm_v7.5_pair_0_1.txt"))
    verdicts = health.judge_osu_pair(result, 0, 1)
    assert [v.status for v in verdicts] == ["healthy", "healthy"]
    assert "38.9 GB/s, at least the minimum of 36.00 GB/s" in verdicts[0].text
    between_nodes = health.judge_osu_pair(result, 0, 1, between_nodes=True)
    assert [v.minimum_gb_s for v in between_nodes] == [23.75, 23.75]
    cut_short = health.judge_osu_pair(health.parse_osu_bw(_text("osu_bw_cuda_v7.2_a100.txt")), 0, 1)
    assert [v.status for v in cut_short] == ["healthy", "not judged"] and "not measured" in cut_short[1].text


def test_a_slow_pair_is_below_its_minimum():
    """The real ROCm output with its bandwidths cut to 30 %, as a degraded link shows it."""
    slow = re.sub(r"^(\d+)\s+([0-9.]+)$", lambda m: f"{m[1]}  {float(m[2]) * 0.3:.2f}",
                  _text("osu_bw_rocm_v7.5_pair_0_1.txt"), flags=re.M)
    verdicts = health.judge_osu_pair(health.parse_osu_bw(slow), 0, 1)
    assert [v.status for v in verdicts] == ["below", "below"] and verdicts[1].healthy is False
    assert "41.4 GB/s, BELOW the minimum of 50.00 GB/s" in verdicts[1].text


def test_rccl_tests_table_with_its_ranks_and_average():
    result = health.parse_collective_table(_text("rccl_tests_mi300x_1node.txt"))
    assert (result.library, result.ranks, result.nodes, result.average_busbw) == ("rccl", 8, 1, 110.464)
    assert set(result.devices) == {"AMD Instinct MI300X"} and len(result.table) == 31
    last = result.table.iloc[-1]
    assert (last["bytes"], last["algbw"], last["busbw"], last["wrong"], last["in_place_busbw"]) == (
        8589934592, 180.40, 315.69, 0, 315.91)
    assert [v.status for v in health.judge_collective(result)] == ["not judged"]
    assert [v.status for v in health.judge_collective(result, minimum_busbw_gb_s=300)] == ["healthy"]
    assert [v.status for v in health.judge_collective(result, minimum_busbw_gb_s=400)] == ["below"]


def test_nccl_tests_on_two_nvidia_nodes():
    result = health.parse_collective_table(_text("nccl_tests_h100_2nodes.txt"))
    assert (result.library, result.ranks, result.nodes, result.average_busbw) == (None, 16, 2, 70.742)
    assert result.devices[0] == "NVIDIA H100 80GB HBM3"
    verdict, = health.judge_collective(result)
    assert verdict.measured_gb_s == 338.82 and "all_reduce_perf on 16 ranks, 2 node(s)" in verdict.text


def test_an_older_rccl_tests_table_without_root_and_with_its_error_column():
    result = health.parse_collective_table(_text("rccl_tests_mi250x_16ranks_old_cut.txt"))
    assert list(result.table.columns)[:8] == ["bytes", "count", "type", "redop", "time_us", "algbw", "busbw", "error"]
    assert len(result.table) == 8
    assert result.table["busbw"].max() == 0.06 and result.table["in_place_busbw"].max() == 0.11
    assert [v.status for v in health.judge_collective(result)] == ["not judged"]  # "error" is a tolerance, not wrong


def test_a_bandwidth_that_collapses_at_large_messages_is_broken_whatever_the_minimum():
    """NVIDIA/nccl issue 1453: mpirun's rank tags inside the rows, no header, busbw 29.5 GB/s then 5.3."""
    result = health.parse_collective_table(_text("nccl_tests_bandwidth_collapse_tagged_cut.txt"))
    assert len(result.table) == 10 and result.table["busbw"].iloc[5] == 29.50
    broken, peak = health.judge_collective(result)
    assert broken.status == "broken" and "falls from 29.5 GB/s at 33,554,432 B to 5.3 GB/s" in broken.text
    assert peak.status == "not judged"


def test_wrong_results_are_broken():
    """The real MI300X table with one row's #wrong edited to 3, as nccl-tests count corrupted elements."""
    lines = _text("rccl_tests_mi300x_1node.txt").splitlines()
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("1048576 "))
    fields = lines[row].split()
    fields[8] = "3"
    lines[row] = "  ".join(fields)
    verdicts = health.judge_collective(health.parse_collective_table("\n".join(lines)))
    assert verdicts[0].status == "broken" and "3 wrong elements" in verdicts[0].text


@pytest.mark.parametrize("text", ["", "srun: error: nid005123: task 3: Exited with exit code 1\n",
                                  "# Avg bus bandwidth    : 0\n"])
def test_output_without_a_table_is_named(text):
    with pytest.raises(ValueError, match="all_reduce_perf"):
        health.parse_collective_table(text)
    with pytest.raises(ValueError, match="osu_bw -m"):
        health.parse_osu_bw(text)


def test_the_job_folder_is_read_and_its_failures_set_the_exit_status(tmp_path, capsys):
    shutil.copy(FIXTURES / "osu_bw_rocm_v7.5_pair_0_1.txt", tmp_path / "osu_bw_node_0_1.txt")
    shutil.copy(FIXTURES / "rccl_tests_mi300x_1node.txt", tmp_path / "all_reduce_perf.txt")
    assert health.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "osu_bw GCD 0 -> GCD 1 (in the node), 64 MiB: 137.9 GB/s" in out
    assert "all 2 judged checks passed (1 not judged)" in out
    shutil.copy(FIXTURES / "nccl_tests_bandwidth_collapse_tagged_cut.txt", tmp_path / "all_reduce_perf.txt")
    assert health.main([str(tmp_path), "--minimum-busbw", "20"]) == 1
    assert "1 of 4 checks failed" in capsys.readouterr().out


def test_an_empty_folder_names_what_it_expected(tmp_path, capsys):
    assert health.main([str(tmp_path)]) == 2
    assert "jobs/lumi/interconnect_health.sbatch" in capsys.readouterr().err


def test_the_job_runs_the_benchmarks_where_lumis_image_installs_them():
    """The paths of LUMI AI Factory's image (laifs-container-recipes, containerfiles/mpich/Ubuntu_Rocm_Slingshot:
    OSU in /usr/libexec/osu-micro-benchmarks, rccl-tests' *_perf in /usr/libexec/rccl-tests)."""
    job = (checkout_root() / "jobs" / "lumi" / "interconnect_health.sbatch").read_text()
    assert "/usr/libexec/osu-micro-benchmarks/mpi/pt2pt/osu_bw" in job and "/usr/libexec/rccl-tests" in job
    assert "-m 1048576:67108864 D D" in job  # both of LUMI's sizes, device buffers on both sides


def test_the_job_without_an_image_names_the_variable_before_it_makes_anything(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "COURSE_CONTAINER"}
    before = set(Path(tempfile.gettempdir()).glob("course-miopen.*"))
    result = subprocess.run(["bash", "jobs/lumi/interconnect_health.sbatch"], cwd=checkout_root(), env=environment,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "set COURSE_CONTAINER to the LUMI AI Factory image" in result.stderr
    assert set(Path(tempfile.gettempdir()).glob("course-miopen.*")) == before


def test_a_benchmark_that_failed_is_reported_and_the_others_still_judged(tmp_path, capsys):
    """The job appends the exit status when a benchmark fails, and goes on with the next pair."""
    shutil.copy(FIXTURES / "osu_bw_rocm_v7.5_pair_0_1.txt", tmp_path / "osu_bw_node_0_1.txt")
    (tmp_path / "osu_bw_nodes_0_2.txt").write_text("srun: error: nid005123: task 1: Exited with exit code 1\n"
                                                   "osu_bw failed: exit 1\n")
    assert health.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "osu_bw_nodes_0_2.txt: no result; its last line: osu_bw failed: exit 1" in out
    assert "1 of 3 checks failed" in out


STAND_IN_BENCHMARK = """#!/bin/bash
# In place of the image's {name}, which needs GPUs: notes where Slurm put each rank and which GCD it was
# given, then (rank 0, as the real one) prints a real output of the program.
echo "$SLURM_STEP_ID $SLURM_PROCID $SLURM_NODEID ${{ROCR_VISIBLE_DEVICES:-none}} $*" >>"{log}"
if [[ $SLURM_PROCID == 0 ]]; then cat "{output}"; fi
"""


@pytest.mark.slow
def test_the_job_runs_every_pair_on_a_real_slurm_and_judges_them(tmp_path):
    """jobs/lumi/interconnect_health.sbatch on the two-node Slurm of CI (tests/test_slurm.py): its srun steps,
    each rank's GCD, the reader at the end and the exit status are real; the benchmarks, which need the GPUs
    and the image, are stand-ins that print real outputs (the image through a `singularity` that runs the
    command it is given)."""
    from course_utils.parallel import slurm

    if not slurm.available():
        pytest.skip("no Slurm controller answers (sinfo); see tests/test_slurm.py")
    bin_dir, log = tmp_path / "bin", tmp_path / "ranks.log"
    bin_dir.mkdir()
    (bin_dir / "singularity").write_text('#!/bin/bash\n[[ $1 == run ]] && shift 2 && exec "$@"\nexit 2\n')
    for name, fixture in (("osu_bw", "osu_bw_rocm_v7.5_pair_0_1.txt"),
                          ("all_reduce_perf", "rccl_tests_mi300x_1node.txt")):
        (bin_dir / name).write_text(STAND_IN_BENCHMARK.format(name=name, log=log, output=FIXTURES / fixture))
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    out = tmp_path / "results"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "COURSE_CONTAINER": str(tmp_path / "image.sif"),
           "COURSE_VENV": sys.prefix, "CPU_BIND": "none", "OSU_BW": str(bin_dir / "osu_bw"),
           "RCCL_TESTS": str(bin_dir), "COURSE_RUN_DIR": str(out), "COURSE_SIZE": "ci"}
    job = slurm.submit("jobs/lumi/interconnect_health.sbatch", cwd=checkout_root(), env=env,
                       options=["--partition=debug", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=0",
                                "--cpus-per-task=1", "--time=10", f"--output={tmp_path / 'job.out'}"])
    outcome = slurm.follow(job, poll_seconds=1, timeout_seconds=540, echo=False)
    text = (tmp_path / "job.out").read_text()
    # Every pair ran in its own step; the same GCD twice misses LUMI's minimum for a copy within one GCD.
    assert outcome.state == "FAILED" and outcome.exit_code == 1, text
    assert len(list(out.glob("osu_bw_node_*.txt"))) == len(list(out.glob("osu_bw_nodes_*.txt"))) == 16
    assert "4 of 65 checks failed" in text and "osu_bw GCD 1 -> GCD 1 (in the node), 64 MiB: 137.9 GB/s, BELOW" in text
    steps = {}
    for line in log.read_text().splitlines():
        step, rank, node, gcd, *args = line.split()
        steps.setdefault(step, {})[int(rank)] = (node, gcd, args)
    osu = [ranks for ranks in steps.values() if ranks[0][2] == ["-m", "1048576:67108864", "D", "D"]]
    assert len(osu) == 32 and all(len(ranks) == 2 for ranks in osu)
    inside = [(ranks[0][1], ranks[1][1]) for ranks in osu if ranks[0][0] == ranks[1][0]]
    between = [(ranks[0][1], ranks[1][1]) for ranks in osu if ranks[0][0] != ranks[1][0]]
    every_pair = sorted((str(a), str(b)) for a in (0, 1) for b in range(8))
    assert sorted(inside) == sorted(between) == every_pair
    collective, = (ranks for ranks in steps.values() if ranks[0][2][:2] == ["-b", "8"])
    assert sorted(collective) == [0, 1, 2, 3]  # one rank per GCD, each given its own (select_gcd.sh)
    assert sorted(gcd for _, gcd, _ in collective.values()) == ["0", "0", "1", "1"]
