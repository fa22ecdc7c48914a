"""Joining and leaving the process group, from torchrun's or Slurm's environment; rank-aware printing
(notebooks 06-09 and 11, and the learner's scripts).

torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK`` (the node), ``MASTER_ADDR`` and
``MASTER_PORT``. Under ``srun`` without torchrun, Slurm sets ``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NTASKS``, ``SLURM_NODEID`` and ``SLURM_JOB_NODELIST``, whose first host becomes the rendezvous
address. Each process uses the GPU of its local rank; the backend comes from :mod:`course_utils.devices`
(NCCL, which is RCCL on ROCm, on GPUs; gloo on CPUs).

    torchrun --standalone --nproc-per-node 2 -m course_utils.parallel.process_group   # a self-check
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from course_utils import devices

DEFAULT_PORT = 29500
_store: dist.Store | None = None  # the rendezvous store of this process's group, kept past the group's end


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    source: str = "single"  # "torchrun", "slurm" or "single"
    node_rank: int = 0  # which node of the job, 0 for the one rank 0 runs on

    @property
    def is_node_main(self) -> bool:
        """The first process of its node: the one that samples the node's devices."""
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``nid[005001-005004,005010]`` -> ``nid005001``."""
    first = re.match(r"([^,\[]+)(\[([^\]]+)\])?([^,]*)", nodelist.strip())
    if first is None:
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, _, ranges, suffix = first.groups()
    if ranges is None:
        return prefix + suffix
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def placement(env: Mapping[str, str] = os.environ) -> Placement:
    """This process's place, from torchrun's variables, else Slurm's, else a single process."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return Placement(int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"]),
                         env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", DEFAULT_PORT)), "torchrun",
                         int(env.get("GROUP_RANK", 0)))
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        job = int(env.get("SLURM_JOB_ID", "0"))
        return Placement(int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"]),
                         env.get("MASTER_ADDR") or first_host(env["SLURM_JOB_NODELIST"]),
                         int(env.get("MASTER_PORT", DEFAULT_PORT + job % 1000)), "slurm",
                         int(env.get("SLURM_NODEID", 0)))
    return Placement()


def node_name() -> str:
    """This node's name: Slurm's where it runs the process (virtual nodes share a host name), else the host's."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def free_port() -> int:
    """A TCP port nobody listens on right now, for a process group of one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def join(timeout_seconds: float = 600, backend: str | None = None, alone: bool = False) -> Placement:
    """Join the process group (when there is more than one process) and pick this rank's device.

    A rank that waits longer than ``timeout_seconds`` for the others fails with an error instead of
    hanging forever. ``alone`` makes a group of one when no launcher started this process, so that
    DDP's own cost can be measured on a single device.
    """
    where = placement()
    if not where.distributed and not alone:
        return where
    backend = backend or devices.distributed_backend()
    if backend == "nccl":  # NCCL/RCCL: one GPU per rank; two ranks on one GPU are refused ("Duplicate GPU")
        torch.cuda.set_device(where.local_rank % torch.cuda.device_count())
    global _store
    timeout = timedelta(seconds=timeout_seconds)
    if where.source == "torchrun":
        address = "env://"
    elif where.source == "slurm":
        address = f"tcp://{where.master_addr}:{where.master_port}"  # rank 0 opens the store
    else:
        address = f"tcp://127.0.0.1:{free_port()}"
    store, _, _ = next(dist.rendezvous(address, where.rank, where.world_size, timeout=timeout))
    # The store of torchrun's agent outlives a restart (--max-restarts): without a prefix of its own, a
    # restarted rank can read the address a dead rank of the previous attempt left there.
    _store = dist.PrefixStore(f"course/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    dist.init_process_group(backend, store=_store, rank=where.rank, world_size=where.world_size, timeout=timeout)
    return where


def join_with_device(device_kind: str) -> tuple[int, int, torch.device]:
    """The one line with which the learner's torchrun scripts join (notebooks 07, 09 and 11): the group of
    :func:`join`, even a group of one, over NCCL (RCCL on ROCm) between GPUs or gloo between CPU processes,
    whatever else the machine has; and this rank's rank, the world size and its device (``cuda``: the GPU of
    its local rank)."""
    on_gpu = device_kind == "cuda"
    where = join(backend="nccl" if on_gpu else "gloo", alone=True)
    return where.rank, where.world_size, devices.default_device() if on_gpu else torch.device("cpu")


def stop_with_the_others(timeout_seconds: float = 10.0) -> None:
    """After an error this rank has reported: wait, at most ``timeout_seconds``, until every rank has stopped
    too. torchrun ends all ranks the moment one exits with an error, so without the wait a rank that met the
    same error a moment later (a folder in use, a full disk during a collective save) is killed before it says
    so. A rank that failed alone waits the whole time and then leaves; the store outlives the process group.
    """
    ranks = placement().world_size
    if _store is None or ranks < 2:
        return
    deadline = time.monotonic() + timeout_seconds
    try:
        _store.add("stopped", 1)
        while _store.add("stopped", 0) < ranks and time.monotonic() < deadline:
            time.sleep(0.05)
    except (RuntimeError, OSError):  # rank 0, whose process held the store, has left already
        return


def leave(together: bool = False) -> None:
    """Leave the process group. ``together``: every rank leaves at this point of the run (the end, or a stop they
    agreed on), and they wait for each other first; without it (an error) this rank leaves at once, without
    waiting for ranks that may never come.

    Why the wait. gloo runs each collective on a worker thread of its own, which frees the collective's tensors
    after the caller has moved on; on PyTorch 2.10 and 2.11, freeing a tensor whose Python object is already gone
    takes Python's GIL. The group's destructor joins those threads while the caller holds the GIL: if it came
    right after a collective (the summary's all-gather ends every run), the worker waited for the GIL and the
    destructor for the worker, and the rank never exited. ``barrier`` waits without the GIL, until every rank
    has finished every collective and the worker threads have freed what they held; then the group goes here,
    not later wherever DDP's reducer (which holds the group too) happens to be freed: drop the DDP wrapper before.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if together and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def end_process(code: int = 0) -> NoReturn:
    """End this process as Python would, minus the interpreter's teardown: Python's own first step of shutting
    down runs (thread pools are told to stop, then the other threads are joined), the exit handlers run and the
    output is flushed, then the process ends with ``code``. Only for the end of a script or command, never inside
    a notebook's kernel.

    Why. ``destroy_process_group`` does not end gloo's worker threads while something still holds the group,
    and PyTorch does: DDP's reducer, DTensor's device mesh (cached by DTensor itself), FSDP. A worker that has
    just finished a collective frees its tensors, and freeing one whose Python object the script already let
    go takes Python's GIL. If it is waiting for the GIL when the interpreter starts tearing itself down,
    Python ends that thread with ``pthread_exit``; the unwinding meets a C++ destructor that may not throw,
    and the rank dies of SIGABRT with "terminate called without an active exception", after its work was
    done. Without the teardown no thread is stopped half-way: the operating system ends them all at once.

    The threads are joined the way the interpreter joins them (``threading._shutdown``), not one by one: the
    idle workers of a thread pool (torch.compile's, an executor's) leave only when the shutdown tells their pool
    to stop, and joining them before that would wait for ever.
    """
    threading._shutdown()  # what Python runs first at its exit: the pools' stop, then every non-daemon thread joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def rank_print(*values: object, everyone: bool = False) -> None:
    """Print with a ``[rank r/w]`` prefix; only rank 0 prints unless ``everyone``."""
    where = placement()
    if everyone or where.is_main:
        print(f"[rank {where.rank}/{where.world_size}]", *values, flush=True)


def main() -> int:
    """Self-check: every rank contributes its rank to an all-reduce and checks the sum."""
    where = join(timeout_seconds=120)
    try:
        device = devices.default_device()
        value = torch.tensor([float(where.rank)], device=device)
        if where.distributed:
            dist.all_reduce(value)
        expected = where.world_size * (where.world_size - 1) / 2
        ok = value.item() == expected
        rank_print(f"{where.source}: all-reduce of the ranks gave {value.item():g}, expected {expected:g}: "
                   f"{'ok' if ok else 'WRONG'} (backend {dist.get_backend() if where.distributed else 'none'}, "
                   f"master {where.master_addr}:{where.master_port})", everyone=True)
    except BaseException:
        leave()
        raise
    leave(together=True)
    return 0 if ok else 1


if __name__ == "__main__":
    end_process(main())
