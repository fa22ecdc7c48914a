"""Where each rank of a stuck job stands (notebook 12, and :mod:`course_utils.doctor` beside a learner's job).

Three views of a hang, each from a real tool:
- the ranks themselves: a torchrun launcher's pid -> its ranks' pids (the ``RANK`` each carries), or a Slurm
  step's tasks on this node (the ``SLURM_PROCID`` each carries);
- each rank's Python stack, read from outside by py-spy (``py-spy dump --pid``), which needs the right to trace
  the process (ptrace): where it is refused, the reason is said, and the fallback named (``faulthandler``);
- each rank's Flight Recorder: PyTorch records the collectives every rank enqueued (``TORCH_FR_BUFFER_SIZE``
  entries; gloo's too since PyTorch 2.7). A learner's script writes it on failure with :func:`write_flight_record`,
  and :func:`last_collectives` sets the ranks' last collectives side by side: the rank that enqueued fewer is the
  one that never arrived. :func:`analyse_flight_records` runs PyTorch's analyser on them, a rank that died left out.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import psutil

from course_utils.parallel import launched_processes

FLIGHT_RECORD_PREFIX = "rank_"  # the file names torchfrtrace, PyTorch's analyser, expects: rank_0, rank_1...
FLIGHT_RECORD_VARIABLE = "TORCH_FR_BUFFER_SIZE"
FLIGHT_RECORD_ANALYSER = "torch.distributed.flight_recorder.fr_trace"  # PyTorch's analyser, torchfrtrace
ANALYSER_SECONDS = 120.0  # its longest run: it imports torch, then reads every rank's record
STACK_SECONDS = 20.0  # py-spy's longest look at one process
# py-spy colours its dump where the environment asks for colour (a Jupyter kernel sets FORCE_COLOR): the codes
# would sit inside every frame a reader parses.
TERMINAL_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
TORCHRUN = ("torch.distributed.run", "torchrun")


def is_launcher(process: psutil.Process) -> bool:
    """A torchrun launcher (``torchrun`` or ``python -m torch.distributed.run``), not one of its ranks."""
    try:
        command = process.cmdline()
    except psutil.Error:
        return False
    return any(Path(part).name in TORCHRUN for part in command[:3])


def launchers(parent: int | None = None) -> list[psutil.Process]:
    """The torchrun launchers among ``parent``'s descendants (a notebook's kernel), or this user's when None."""
    if parent is not None:
        try:
            candidates = psutil.Process(parent).children(recursive=True)
        except psutil.Error:
            return []
    else:
        candidates = [process for process in psutil.process_iter() if launched_processes.same_user(process)]
    return [process for process in candidates if is_launcher(process)]


def rank_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of the ranks a torchrun launcher started (its DataLoader workers left out)."""
    try:
        processes = psutil.Process(launcher).children(recursive=True)
    except psutil.Error:
        return {}
    return {rank: pid for pid, rank in sorted(launched_processes.ranks(processes, {launcher}).items())}


SLURM_STEP = ("SLURM_JOB_ID", "SLURM_STEP_ID")


def slurm_step_ranks(pid: int) -> dict[int, int]:
    """rank -> pid of the tasks on this node of the Slurm step ``pid`` is a task of (the same job and step ids, a
    ``SLURM_PROCID`` each, their loader workers left out): a job whose ranks srun starts itself, without torchrun."""
    try:
        step = [launched_processes.environment(psutil.Process(pid)).get(name) for name in SLURM_STEP]
    except psutil.Error:
        return {}
    if None in step:
        return {}
    tasks: dict[int, tuple[int, int]] = {}  # pid -> (rank, parent's pid)
    for process in psutil.process_iter():
        env = launched_processes.environment(process) if launched_processes.same_user(process) else {}
        if [env.get(name) for name in SLURM_STEP] == step and env.get("SLURM_PROCID", "").isdigit():
            try:
                tasks[process.pid] = (int(env["SLURM_PROCID"]), process.ppid())
            except psutil.Error:
                continue
    return {rank: task for task, (rank, parent) in sorted(tasks.items()) if parent not in tasks}


def python_stack(pid: int, seconds: float = STACK_SECONDS, with_locals: bool = False) -> str:
    """The Python stack of every thread of ``pid``, as ``py-spy dump`` prints it (``with_locals``: each frame's
    arguments and local variables too, which tell a rank that moves on from one that stands still); else why it
    could not be read."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).is_file():
        return ("py-spy is not installed (pip install py-spy); instead, start the script with "
                "`faulthandler.register(signal.SIGUSR1)` and send `kill -USR1 PID`: the rank prints its stack")
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid), *(["--locals"] if with_locals else [])],
                              capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return f"py-spy did not read pid {pid} within {seconds:g} s"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        reason = said[-1] if said else f"exit code {done.returncode}"
        return (f"py-spy could not read pid {pid}: {reason}. Tracing another process needs ptrace: run as the "
                "process's user, with kernel.yama.ptrace_scope 0 or 1 (or CAP_SYS_PTRACE in a container); "
                "else use faulthandler (kill -USR1 on a script that registered it)")
    return TERMINAL_COLOURS.sub("", done.stdout).strip()


def write_flight_record(folder: str | os.PathLike, rank: int) -> Path | None:
    """Write this rank's Flight Recorder (the collectives it enqueued, with the Python stack of each) to
    ``folder/rank_<rank>``, the dump torchfrtrace reads; None when recording is off (no TORCH_FR_BUFFER_SIZE)."""
    if int(os.environ.get(FLIGHT_RECORD_VARIABLE, "0") or 0) <= 0:
        return None
    import torch.distributed as dist  # noqa: F401 (loads the c10d extension the recorder lives in)
    from torch._C._distributed_c10d import _dump_fr_trace

    path = Path(folder) / f"{FLIGHT_RECORD_PREFIX}{rank}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_dump_fr_trace(True, True, False))
    return path


def keep_flight_record(folder: str | os.PathLike, rank: int) -> None:
    """Write this rank's Flight Recorder when the script fails: on an uncaught error (the process group's timeout)
    and on SIGTERM, which torchrun sends to the other ranks once one has failed (a rank outside a collective acts
    on it at once; one inside acts on it when its own timeout returns it to Python)."""
    raised = sys.excepthook

    def on_error(kind, error, traceback) -> None:
        write_flight_record(folder, rank)
        raised(kind, error, traceback)

    def on_sigterm(number, frame) -> None:
        write_flight_record(folder, rank)
        sys.exit(128 + number)

    sys.excepthook = on_error
    signal.signal(signal.SIGTERM, on_sigterm)


def _caller(frames: list[dict]) -> str:
    """The learner's line that called the collective: the first frame outside PyTorch."""
    for frame in frames:
        if f"{os.sep}torch{os.sep}" not in frame.get("filename", ""):
            return f"{Path(frame['filename']).name}:{frame['line']} in {frame['name']}"
    return ""


def last_collectives(folder: str | os.PathLike) -> pd.DataFrame:
    """One row per rank from the dumps of :func:`write_flight_record`: how many collectives it enqueued, its last
    one (operation, shapes) and the line that called it. The rank with fewer enqueued never reached the collective
    the others wait in; equal counts with different operations or shapes are a mismatch. The dumps are this
    course's own scripts' files (pickles: never read one from elsewhere)."""
    rows = []
    for path in sorted(Path(folder).glob(f"{FLIGHT_RECORD_PREFIX}*")):
        if not path.name.removeprefix(FLIGHT_RECORD_PREFIX).isdigit():
            continue
        with open(path, "rb") as stream:
            dump = pickle.load(stream)
        status = next(iter(dump.get("pg_status", {}).values()), {})
        last = dump["entries"][-1] if dump.get("entries") else {}
        rows.append({"rank": int(path.name.removeprefix(FLIGHT_RECORD_PREFIX)),
                     "collectives enqueued": status.get("last_enqueued_collective"),
                     "last collective": last.get("profiling_name", ""),
                     "its shapes": str(last.get("input_sizes", "")),
                     "called at": _caller(last.get("frames", []))})
    return pd.DataFrame(rows).set_index("rank") if rows else pd.DataFrame()


def analyser_command(folder: str | os.PathLike) -> list[str]:
    """PyTorch's analyser on the records in ``folder``, matching the ranks that wrote one: a rank that died (SIGKILL,
    a lost node) wrote none, and without ``--allow-incomplete-ranks`` the analyser stops at "Missing dump files from
    ranks ..." instead of reading the others (the flag is in every PyTorch the course supports, 2.10 on)."""
    return [sys.executable, "-m", FLIGHT_RECORD_ANALYSER, str(folder), "--prefix", FLIGHT_RECORD_PREFIX,
            "--allow-incomplete-ranks"]


def analyse_flight_records(folder: str | os.PathLike, seconds: float = ANALYSER_SECONDS) -> str:
    """What PyTorch's analyser makes of the records in ``folder`` (the first collective the ranks disagree on, the
    ranks missing from it), or where it stopped. It reads NCCL's records; on gloo's, PyTorch 2.14's analyser stops
    with a KeyError (gloo names the process group differently in two places of its record), which is why
    :func:`last_collectives` reads the records itself."""
    try:
        done = subprocess.run(analyser_command(folder), capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return f"PyTorch's analyser did not finish within {seconds:g} s"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return f"PyTorch's analyser stopped: {said[-1] if said else f'exit code {done.returncode}'}"
    return done.stdout.strip()


@dataclass
class Looked:
    """What a look beside a running launch found, and how the launch ended."""

    found: object  # what ``look`` returned
    launcher: int | None  # torchrun's pid
    outcome: object  # the launch's result, or the exception it raised


def beside(start: Callable[[], object], look: Callable[[int], object], ready: Callable[[], bool]) -> Looked:
    """Run ``start`` (a blocking torchrun launch with its own time limit) in a thread; once ``ready()`` says the
    ranks stand where the lesson wants them, call ``look`` with the launcher's pid, as a learner runs a tool in a
    second terminal; then wait for the launch to end, by itself or by its limit. A launch that ends before it is
    ready is not looked at: its ranks were still starting (a busy machine) or had failed, not where the lesson
    wants them, and only the launch's limit bounds how long a start-up may take."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(start())
        except Exception as error:  # the launch's own error (its time limit) is part of what the lesson shows
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    before = {process.pid for process in launchers(os.getpid())}
    thread.start()
    while thread.is_alive() and not ready():
        time.sleep(0.2)
    ours = [process.pid for process in launchers(os.getpid()) if process.pid not in before]
    found = look(ours[0]) if ours and thread.is_alive() else None
    thread.join()
    return Looked(found, ours[0] if ours else None, outcome[0] if outcome else None)
