"""Every reader of another program's output is bounded (DESIGN.md): a line of a megabyte is read in linear time, a log
of hundreds of megabytes in a stream under a memory limit, and anything but a regular text file is refused by name
with its fix, never waited on or read for ever: real FIFOs, devices, folders, binary and unreadable files, given to
the real commands."""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils import bounded_reading
from course_utils.doctor import comm_failures, transport
from course_utils.doctor import interconnect_health as health

FIXTURES = Path(__file__).parent / "fixtures"
NCCL = FIXTURES / "nccl"
LINE = 2**16  # a 64 KB line; the quadratic patterns took 40 s on one
SECONDS = 1.0  # "well under a second" on a busy CI machine; linear readers take milliseconds
COMMAND_SECONDS = 60  # a command's start-up on a busy machine; a reader that waits for ever meets it


def _lines(name: str) -> list[str]:
    """A real log without its ``# cut: ...`` first line."""
    path = NCCL / "failures" / name
    return (path if path.exists() else NCCL / "field" / name).read_text().splitlines()[1:]


# Each of these made one pattern try the rest of the line again at each character (a lazy group before \s*$, .*
# between two words, two quantifiers of blanks side by side, a greedy name before a colon): minutes on 64 KB.
BLANKS = " " * LINE
PATHOLOGICAL = {
    "blanks": BLANKS,
    "a warning's blanks": f"NCCL WARN a{BLANKS}x",
    "an error's blanks": f"RuntimeError: a{BLANKS}x",
    "interfaces' blanks": f"NCCL INFO Bootstrap : Using a{BLANKS}x",
    "one long interface name": "NCCL INFO NET/Socket : Using " + "a" * LINE,
    "a network's blanks": f"NCCL INFO Using network a{BLANKS}x",
    "a channel's blanks": f"NCCL INFO Channel 00/0 : 0[0] -> 1[1] via a{BLANKS}x",
    "a version's blanks": f"NCCL version{BLANKS}x",
    "repeated watchdogs": "Watchdog caught collective operation timeout: WorkNCCL(" * (LINE // 55),
    "repeated plugin loads": "NET/Plugin : Plugin load " * (LINE // 25),
    "repeated OFI warnings": "NCCL WARN NET/OFI " * (LINE // 18),
    "repeated library prefixes": "NCCL INFO " * (LINE // 10),
    "a device name's blanks": f"# Rank 0 Group 0 Pid 1 on h device 0 [0x01] a{BLANKS}b",
    "repeated device brackets": "# Rank 0 x" + " on h device 0 [" * (LINE // 16),
    "an osu title's blanks": f"# OSU MPI-ROCM Bandwidth{BLANKS} Test",
    "rank tags": "[1," * (LINE // 3),
}


def _read_by_every_reader(line: str) -> None:
    comm_failures.diagnose([line, "NCCL INFO Connected all rings"])
    transport.read([line])
    for parse in (health.parse_collective_table, health.parse_osu_bw):
        try:
            parse([line])
        except ValueError:  # no table: what matters here is how long it took to say so
            pass


@pytest.mark.parametrize("line", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_no_pattern_takes_quadratic_time_on_a_long_line(monkeypatch, line):
    """The patterns themselves are linear: with lines not cut at all, a 64 KB line takes milliseconds."""
    monkeypatch.setattr(bounded_reading, "MAX_LINE_CHARS", 2 * len(line))
    began = time.perf_counter()
    _read_by_every_reader(line)
    assert time.perf_counter() - began < SECONDS


def test_a_megabyte_line_is_cut_and_the_failure_after_it_still_found(tmp_path):
    """A log file of megabyte lines (each kind above, at 16 times the size) and a real failure at its end."""
    log = tmp_path / "job.err"
    with open(log, "w") as stream:
        for line in PATHOLOGICAL.values():
            stream.write(line * 16 + "\n")
        stream.write("\n".join(_lines("torchrun_root_cause_sigkill.log")) + "\n")
    began = time.perf_counter()
    diagnosis = comm_failures.read_log(log)
    assert time.perf_counter() - began < SECONDS
    killed = [finding for finding in diagnosis.findings if finding.failure.name == "rank_killed"]
    assert killed and killed[0].line_number > len(PATHOLOGICAL), diagnosis.findings


# --- a stream under a memory limit --------------------------------------------------------------------------------

HOLE = 400 * 2**20  # a node that crashed while writing leaves such a hole of NUL bytes in its log


def _log_with_a_hole(path: Path, failure: str) -> Path:
    """Real lines, a hole of 400 MB (a sparse file: written at once), then a real failure's lines."""
    with open(path, "w") as stream:
        stream.write("\n".join(_lines("nccl_ib_gdrdma.log")) + "\n")
        stream.seek(stream.tell() + HOLE)
        stream.write("\n" + "\n".join(_lines(failure)) + "\n")
    return path


def _virtual_memory_after_import(module: str) -> int:
    """Bytes of address space a Python that imported ``module`` holds (VmPeak): the reader's own floor."""
    status = subprocess.run([sys.executable, "-c", f"import {module}; print(open('/proc/self/status').read())"],
                            capture_output=True, text=True, timeout=COMMAND_SECONDS, check=True).stdout
    peak = next(line for line in status.splitlines() if line.startswith("VmPeak:"))
    return int(peak.split()[1]) * 1024


def run_limited(command: list[str], module: str, headroom: int = 200 * 2**20) -> subprocess.CompletedProcess:
    """``command`` with its address space limited to what importing ``module`` takes, plus ``headroom``: less than
    half the log, so that reading it whole fails."""
    limit = _virtual_memory_after_import(module) + headroom

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_SECONDS, preexec_fn=limited,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_a_log_of_hundreds_of_megabytes_is_read_in_a_stream_under_a_memory_limit(tmp_path):
    log = _log_with_a_hole(tmp_path / "job.err", "torchrun_root_cause_sigkill.log")
    said = run_limited([sys.executable, "-m", "course_utils.doctor.comm_failures", str(log)],
                       "course_utils.doctor.comm_failures")
    assert said.returncode == 0, said.stderr[-2000:]
    assert said.stdout.startswith("communication log: a rank was killed from outside"), said.stdout
    said = run_limited([sys.executable, "-m", "course_utils.doctor.transport", str(log)],
                       "course_utils.doctor.transport")
    assert said.returncode == 0 and "InfiniBand" in said.stdout, said.stderr[-2000:]


@pytest.mark.slow
def test_the_doctors_log_is_read_in_a_stream_under_a_memory_limit(tmp_path):
    """The doctor beside a task of a Slurm step (the environment srun gives it), given the log with the hole."""
    log = _log_with_a_hole(tmp_path / "job.err", "torchrun_root_cause_sigkill.log")
    step = {"SLURM_JOB_ID": "79", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env={**os.environ, **step})
    try:
        said = run_limited([sys.executable, "-m", "course_utils.doctor", "--pid", str(task.pid), "--looks", "1",
                            "--log", str(log)], "course_utils.doctor")
    finally:
        task.kill()
        task.wait(timeout=30)
    assert said.returncode == 0, said.stderr[-2000:]
    assert "communication log: a rank was killed from outside" in said.stdout, said.stdout


def test_a_log_read_within_a_time_bound_says_how_much_it_read(tmp_path):
    """The doctor's bound: a log longer than the time given is read in part, and the sentence says so."""
    log = tmp_path / "job.err"
    log.write_text("\n".join(_lines("nccl_ib_gdrdma.log") * 2000) + "\n")
    began = time.perf_counter()
    diagnosis = comm_failures.read_log(log, seconds=0.2)
    assert time.perf_counter() - began < 0.2 + SECONDS
    assert diagnosis.unread.endswith("within 0.2 s") and " of " in diagnosis.unread, diagnosis.unread
    assert "Only part of the log was read" in diagnosis.sentence()


# --- regular files only ---------------------------------------------------------------------------------------------

def _fifo(folder: Path) -> Path:
    os.mkfifo(folder / "job.err")
    return folder / "job.err"


def _zero(folder: Path) -> Path:
    (folder / "job.err").symlink_to("/dev/zero")
    return folder / "job.err"


def _folder(folder: Path) -> Path:
    (folder / "job.err").mkdir()
    return folder / "job.err"


def _missing(folder: Path) -> Path:
    return folder / "job.err"


def _nul_bytes(folder: Path) -> Path:
    (folder / "job.err").write_bytes(b"NCCL INFO \0\0\0\0" * 100)
    return folder / "job.err"


def _not_utf8(folder: Path) -> Path:
    (folder / "job.err").write_bytes(bytes(range(128, 256)) * 50)  # a compressed log reads like this
    return folder / "job.err"


NOT_A_LOG = {
    "a FIFO": (_fifo, "is a FIFO (named pipe), not a log file: give the file the ranks wrote"),
    "a link to /dev/zero": (_zero, "is a character device, not a log file: give the file the ranks wrote"),
    "a folder": (_folder, "is a folder, not a log file"),
    "a missing file": (_missing, "no such file; give the file the ranks wrote"),
    "NUL bytes": (_nul_bytes, "is binary, not a text log"),
    "bytes that are not UTF-8": (_not_utf8, "is binary, not a text log"),
}
READERS = ("course_utils.doctor.comm_failures", "course_utils.doctor.transport")


@pytest.mark.parametrize("reader", READERS, ids=lambda name: name.rsplit(".", 1)[1])
@pytest.mark.parametrize(("make", "said"), NOT_A_LOG.values(), ids=NOT_A_LOG.keys())
def test_a_reader_refuses_what_is_not_a_regular_text_file_by_name(tmp_path, reader, make, said):
    """Before: a FIFO held the reader for ever, /dev/zero filled the memory, a folder gave "Is a directory" and a
    binary file was read as a log that names nothing."""
    path = make(tmp_path)
    done = subprocess.run([sys.executable, "-m", reader, str(path)], capture_output=True, text=True,
                          timeout=COMMAND_SECONDS)
    assert done.returncode == 2 and said in done.stderr and str(path) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24  # linux/capability.h, linux/prctl.h


def _without_root_s_reading_rights() -> None:
    """Root reads any file through these two capabilities: without them it meets a file's mode like anyone."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_an_unreadable_log_is_named_with_the_fix(tmp_path):
    """Before: "cannot read (Permission denied)" from the command; in the doctor's --log, a traceback."""
    log = tmp_path / "job.err"
    log.write_text("\n".join(_lines("torch_watchdog_timeout.log")) + "\n")
    log.chmod(0)
    done = subprocess.run([sys.executable, "-m", "course_utils.doctor.comm_failures", str(log)],
                          capture_output=True, text=True, timeout=COMMAND_SECONDS,
                          preexec_fn=_without_root_s_reading_rights if os.geteuid() == 0 else None)
    assert done.returncode == 2, done.stderr
    assert f"{log}: permission denied" in done.stderr and "chmod a+r" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_first_line_of_a_log_that_is_text_is_read_as_before(tmp_path):
    """The checks do not refuse a real log: a UTF-8 character cut at the end of the checked start is still text."""
    log = tmp_path / "job.err"
    start = "x" * (bounded_reading.TEXT_CHECK_BYTES - 1) + "é\n"
    log.write_text(start + "\n".join(_lines("torch_watchdog_timeout.log")) + "\n")
    assert comm_failures.read_log(log).cause.name == "collective_timeout"


# --- the interconnect health check's result files -------------------------------------------------------------------

def _health(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course_utils.doctor.interconnect_health", str(folder)],
                          capture_output=True, text=True, timeout=COMMAND_SECONDS)


def test_a_result_that_is_a_link_to_dev_zero_or_a_fifo_is_refused_and_the_others_judged(tmp_path):
    """Before: the link to /dev/zero filled the memory, the FIFO held the check for ever."""
    shutil.copy(FIXTURES / "interconnect" / "osu_bw_rocm_v7.5_pair_0_1.txt", tmp_path / "osu_bw_node_0_1.txt")
    (tmp_path / "all_reduce_perf.txt").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "osu_bw_nodes_0_2.txt")
    done = _health(tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{tmp_path / 'all_reduce_perf.txt'} is a character device, not a result file" in done.stdout
    assert f"{tmp_path / 'osu_bw_nodes_0_2.txt'} is a FIFO (named pipe), not a result file" in done.stdout
    assert "osu_bw GCD 0 -> GCD 1 (in the node), 64 MiB: 137.9 GB/s" in done.stdout
    assert "2 of 4 checks failed" in done.stdout


def test_a_binary_result_is_named_not_a_decoding_error(tmp_path):
    """Before: UnicodeDecodeError, a traceback."""
    (tmp_path / "all_reduce_perf.txt").write_bytes(bytes(range(256)) * 4)
    done = _health(tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "all_reduce_perf.txt is binary, not a text result" in done.stdout


def test_a_well_formed_result_under_a_name_it_does_not_know_says_the_names_it_reads(tmp_path):
    """Before: 'no result' for a whole osu_bw table saved as osu_bw_node_0_1_rerun.txt, as if the benchmark failed."""
    shutil.copy(FIXTURES / "interconnect" / "osu_bw_rocm_v7.5_pair_0_1.txt", tmp_path / "osu_bw_node_0_1_rerun.txt")
    shutil.copy(FIXTURES / "interconnect" / "rccl_tests_mi300x_1node.txt", tmp_path / "all_reduce_perf.txt")
    done = _health(tmp_path)
    assert done.returncode == 0, done.stdout
    assert ("osu_bw_node_0_1_rerun.txt: not read, a name the health check does not know: it reads "
            "osu_bw_node_A_B.txt") in done.stdout
    assert "no result" not in done.stdout
    (tmp_path / "all_reduce_perf.txt").unlink()
    alone = _health(tmp_path)
    assert alone.returncode == 2 and "(it holds osu_bw_node_0_1_rerun.txt): the health check reads" in alone.stderr


# --- the training command's --resume PATH ---------------------------------------------------------------------------

@pytest.mark.slow
def test_resume_from_a_fifo_is_refused_by_name_not_waited_on(quick, tmp_path):
    """Before: the training command waited for a writer to the FIFO for ever."""
    from course_utils.training.options import to_flags

    fifo = tmp_path / "last.pt"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "course_utils.train",
                           *to_flags(**{**quick, "max_steps": 2}, resume=str(fifo))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"{fifo} is a FIFO (named pipe), not a checkpoint file: give --resume a checkpoint file" in done.stderr
