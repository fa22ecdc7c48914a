"""A gloo rank for tests/test_launch.py, started by torchrun: it takes the position its scenario names, writes its
pid to READY_DIR/<rank>, and stays there until the launcher ends it.

    ranks_that_hang.py SCENARIO READY_DIR

Every rank records SIGTERM as the training command does (to stop after its step) and stops when it can read it;
the scenario makes one rank unable to:
- ``ignores-sigterm``: rank 1 ignores SIGTERM, as some libraries' processes do;
- ``stopped``: rank 1 stops itself with SIGSTOP (as Ctrl-Z in a terminal, or a debugger);
- ``collective``: rank 0 reads a batch through DataLoader workers (the training command's, which leave a stop
  signal to their trainer) and blocks in a barrier that rank 1, busy in a step that never ends, never joins.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

from course_utils.data.worker_signals import leave_stop_signals_to_the_trainer

scenario, ready = sys.argv[1], Path(sys.argv[2])
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
received: list[int] = []
signal.signal(signal.SIGTERM, lambda number, frame: received.append(number))


def in_position(where: str) -> None:
    print(f"rank {rank}: {where}", flush=True)
    (ready / str(rank)).write_text(str(os.getpid()))


if scenario == "ignores-sigterm" and rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    in_position("ignoring SIGTERM")
    while True:
        time.sleep(1)
elif scenario == "stopped" and rank == 1:
    in_position("stopping itself")
    os.kill(os.getpid(), signal.SIGSTOP)
elif scenario == "collective" and rank == 0:
    loader = DataLoader(range(64), batch_size=4, num_workers=2, persistent_workers=True,
                        worker_init_fn=leave_stop_signals_to_the_trainer)
    next(iter(loader))
    in_position("in a barrier, its loader workers started")
    dist.barrier()
elif scenario == "collective":
    in_position("in a step that never ends")
    while True:
        time.sleep(1)
else:
    in_position("training")
while not received:  # a step loop that stops at the end of a step when asked
    time.sleep(0.1)
sys.exit(0)
