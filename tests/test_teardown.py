"""A rank that has done its work ends cleanly: the SIGABRT at the end of gloo runs, forced, and the way out of it.

The abort ("terminate called without an active exception", a rank killed by SIGABRT after its last line) came
once in several launches of the course's FSDP and tensor-parallel scripts on a busy machine. Its cause, seen in
a debugger's stack of the aborting thread: a gloo worker thread frees a collective's tensor whose Python object
the script already dropped (``TensorImpl::decref_pyobject``), waits for the GIL, and gets it only after the
interpreter began its teardown; CPython then ends the thread (``take_gil`` -> ``PyThread_exit_thread``) and the
unwinding meets a destructor that may not throw: ``std::terminate``. The worker lives that long because
PyTorch itself keeps the group past ``destroy_process_group``. The script below forces that schedule on every
run instead of once in a while: rank 1 joins rank 0's last all-reduce only once rank 0 is in its exit
handlers, and rank 0's last handler holds the GIL (a long sort in C) until the teardown starts.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SCRIPT = textwrap.dedent('''
    import atexit, os, random, sys, time
    from pathlib import Path

    flag = Path(sys.argv[1])
    unsorted = list(range(3_000_000))
    random.Random(0).shuffle(unsorted)
    # Exit handlers run last registered first: these two run last, the flag (rank 1 may now complete the
    # all-reduce), then a long sort in C that holds the GIL until the teardown starts.
    atexit.register(sorted, unsorted)
    atexit.register(flag.touch)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    held = dist.group.WORLD  # what DDP's reducer or DTensor's mesh do: the group outlives destroy_process_group
    rank = dist.get_rank()
    if rank == 1:
        while not flag.exists():  # until rank 0 is in its exit handlers
            time.sleep(0.01)
    work = dist.all_reduce(torch.ones(1 << 16), async_op=True)  # the work holds the tensor's last reference
    if rank == 1:
        work.wait()
        time.sleep(2)  # rank 0's end comes first
        os._exit(0)
    del work


    class SlowTeardown:
        def __del__(self):  # runs in the teardown, and lets another thread take the GIL meanwhile
            time.sleep(0.5)


    slow = SlowTeardown()
    dist.destroy_process_group()
    if sys.argv[2] == "end_process":
        from course_utils.parallel.process_group import end_process
        end_process()
''')


def _rank_zero_of(script: Path, ending: str, tmp_path: Path, port: int) -> subprocess.CompletedProcess:
    """Launch two ranks; return rank 0's process (rank 1 only serves the all-reduce)."""
    flag = tmp_path / f"{ending}-rank0-exiting"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(script), str(flag), ending], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    return subprocess.CompletedProcess(ranks[0].args, ranks[0].returncode, f"{outputs[0]}\n-- rank 1:\n{outputs[1]}")


def test_the_forced_schedule_aborts_a_rank_that_ends_through_the_interpreters_teardown(tmp_path, free_port):
    """The cause reproduced: without end_process, rank 0 dies of SIGABRT after its work, every time."""
    script = tmp_path / "late_collective.py"
    script.write_text(SCRIPT)
    rank0 = _rank_zero_of(script, "teardown", tmp_path, free_port)
    assert rank0.returncode == -signal.SIGABRT, rank0.stdout
    assert "terminate called without an active exception" in rank0.stdout


@pytest.mark.oldest
def test_end_process_ends_the_same_rank_cleanly(tmp_path, free_port):
    """The fix: the exit handlers run (the flag appears, so rank 1 completes), and no thread is stopped half-way."""
    script = tmp_path / "late_collective.py"
    script.write_text(SCRIPT)
    rank0 = _rank_zero_of(script, "end_process", tmp_path, free_port)
    assert rank0.returncode == 0, rank0.stdout
    assert (tmp_path / "end_process-rank0-exiting").exists()


POOL_SCRIPT = textwrap.dedent('''
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from course_utils.parallel.process_group import end_process

    folder = Path(sys.argv[1])
    pool = ThreadPoolExecutor(2)  # idle workers once their work is done, as torch.compile's compile workers are
    assert pool.submit(sum, [1, 2]).result() == 3

    def late_work():  # a thread still working at the end: Python waits for it, and so must end_process
        time.sleep(1)
        (folder / "late-work-done").touch()

    threading.Thread(target=late_work).start()
    atexit.register(lambda: (folder / "exit-handler-ran").touch())
    print("work done", flush=True)
    end_process(3)
''')


def test_end_process_does_not_wait_for_idle_pool_workers(tmp_path):
    """An idle thread pool's workers leave only when the interpreter's shutdown tells their pool to stop: joining
    them first (the earlier end_process) waited for ever, after the command's last line. Ended as Python does,
    the process exits with its code, after the working thread finished and the exit handlers ran."""
    script = tmp_path / "pool.py"
    script.write_text(POOL_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "work done\n"
        seconds = time.monotonic()
        code = process.wait(timeout=60)
        seconds = time.monotonic() - seconds
    finally:
        process.kill()
    assert code == 3
    assert seconds < 20, f"{seconds:.1f} s from its last line to its exit"
    assert (tmp_path / "late-work-done").exists() and (tmp_path / "exit-handler-ran").exists()
