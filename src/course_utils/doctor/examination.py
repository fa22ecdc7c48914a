"""Notebook 12: the doctor beside a stuck or slow torchrun job or Slurm step, on one screen (a second terminal).

    python -m course_utils.doctor                  # this user's torchrun job (when there is one)
    python -m course_utils.doctor --pid 4242       # the job whose torchrun (or one of whose ranks) has pid 4242
    srun --overlap --jobid JOB --pty python -m course_utils.doctor --pid 4242   # a Slurm step's task 4242
    python -m course_utils.doctor --pid 4242 --log run.log   # and the communication log's verdict

It reads each rank's Python stack (py-spy) and how busy its process is, the devices' utilization and power
(notebook 02's monitor), and, given the job's output with ``NCCL_DEBUG=INFO``, the communication library's
failure (:mod:`course_utils.doctor.comm_failures`); then it says what to try next. It only reads: it never
stops or signals the job.

One look cannot tell a stuck rank from a slow one: a straggler whose loader sleeps most of each step stands at
the same line as a rank that never leaves it. So the doctor looks several times (``--looks``), with each frame's
local variables: a rank whose stack or locals (its step counter) change between looks moves. A loop at a script's
top level (as the course's scripts are written) keeps its counter in the module's globals, which py-spy does not
print; there the doctor reads what the process wrote between its first and last look: a rank that finishes a
collective over gloo writes to its peers' sockets (and a rank that prints writes too), one that stands still
writes nothing. NCCL and RCCL move a collective's data between the GPUs, outside the process's count: on GPUs a
top-level straggler that prints nothing between looks still reads as standing still. A rank that shows neither
stands still. A rank whose process has gone between looks ended: the
doctor says so, and that the job ended when all did.

The doctor ends within ``--within`` seconds whatever it meets: the looks stop at their share of that time, the log
is read for what is left (a log of gigabytes is read in part, and the screen says how much), and a step that
never returns (a GPU or a process that does not answer) makes the doctor give up with a line that says so.

The module reads in the order the doctor works: which job and its ranks, look, read, decide, say; then the
examination that runs those steps, and the command line.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from course_utils import bounded_reading
from course_utils.config import VISIBLE_VARIABLES as VISIBLE_BY_VENDOR
from course_utils.doctor import comm_failures, hangs
from course_utils.observe.monitor.backends import BackendUnavailable, open_backend
from course_utils.observe.monitor.readings import Reading
from course_utils.parallel import launched_processes

COLLECTIVES = {"all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "send",
               "recv", "monitored_barrier", "all_gather_object", "broadcast_object_list", "wait",
               "synchronize"}  # on a GPU a collective returns at once; the host then waits for the device
FRAME = re.compile(r"^ {4}(?P<function>\S+) \((?P<file>[^():]+):(?P<line>\d+)\)")  # deeper: its locals
BUSY_PERCENT = 50.0  # a rank's process above this share of one core is computing (or spinning), not waiting
HUNG_GPU_UTILIZATION = 90.0  # a GPU this busy ...
IDLE_POWER_SHARE = 0.35  # ... that draws less than this share of its power limit spins in a kernel that waits
CPU_SAMPLE_SECONDS = 0.5  # the shortest span a process's CPU share is measured over
LOOKS = 3
LOOK_EVERY_SECONDS = 1.0
WITHIN_SECONDS = 90.0  # the whole run's bound (notebook 12 waits 120 s for the doctor)
LOOK_SHARE = 0.6  # of that bound, the looks' share; the devices and the log have the rest
GIVE_UP_GRACE_SECONDS = 15.0  # past the bound, a step that has not returned is given up
JOB_LINE_CHARACTERS = 100  # of a listed job's command


# --- The job: which one, and its ranks on this node -------------------------------------------------------------------


def _not_yours(process: psutil.Process) -> str | None:
    """The user a process belongs to, where it is not this user's: the doctor reads only its own user's jobs, as
    :func:`launched_processes.same_user` says (and finds their ranks only there)."""
    if launched_processes.same_user(process):
        return None
    try:
        return process.username()
    except psutil.Error:
        return "another user"


def _runs(process: psutil.Process) -> str:
    """What a torchrun job runs, from its launcher's command line: the script (or module) and its arguments."""
    try:
        words = process.cmdline()
    except psutil.Error:
        return "(ended)"
    for index, word in enumerate(words[1:], 1):
        if word.endswith(".py") or (words[index - 1] == "-m" and word not in hangs.TORCHRUN):
            arguments = words[index + 1:]
            shown = " ".join([Path(word).name, *(arguments[1:] if arguments[:1] == ["--"] else arguments)])
            return shown if len(shown) <= JOB_LINE_CHARACTERS else shown[:JOB_LINE_CHARACTERS - 3] + "..."
    return " ".join(words)[:JOB_LINE_CHARACTERS]


def not_one_job(found: list[psutil.Process]) -> str:
    """Why the doctor needs ``--pid``: no torchrun job of this user's on this node (where a cluster's job is not:
    its ranks run on the job's compute nodes), or several, each listed with what it runs."""
    if not found:
        return (f"doctor: no torchrun job of yours runs on this node ({socket.gethostname()}). A cluster's job runs "
                "on its compute nodes: run the doctor there, beside the job (srun --overlap --jobid JOB --pty python "
                "-m course_utils.doctor); a job started by srun without torchrun: name a task's pid with --pid")
    listed = "\n".join(f"  torchrun pid {process.pid}: {_runs(process)}" for process in found)
    return (f"doctor: {len(found)} torchrun jobs of yours run on this node; name one with --pid (torchrun's, or any "
            f"rank's):\n{listed}")


def find_job(pid: int | None) -> int:
    """The pid that stands for the job to examine: a torchrun launcher (``pid`` itself, or the one above a rank's
    ``pid``, or this user's only torchrun job), or a task of a Slurm step (``pid``, started by srun without
    torchrun). A clear error names what to pass otherwise."""
    if pid is None:
        found = hangs.launchers()
        if len(found) != 1:
            raise SystemExit(not_one_job(found))
        return found[0].pid
    try:
        process = psutil.Process(pid)
        owner = _not_yours(process)
    except psutil.Error:
        raise SystemExit(f"doctor: no process has pid {pid}; `ps -ef | grep torch.distributed.run` lists the "
                         "torchrun jobs") from None
    if owner is not None:
        raise SystemExit(f"doctor: pid {pid} belongs to user {owner}, not to you ({psutil.Process().username()}): "
                         "the job is not yours, and the doctor reads only your own jobs (py-spy reads a process's "
                         "stack only as the same user or as root, and another user's ranks are not looked for); run "
                         f"it as {owner}: sudo -u {owner} python -m course_utils.doctor --pid {pid}")
    for candidate in [process, *process.parents()]:
        if hangs.is_launcher(candidate):
            return candidate.pid
    if hangs.slurm_step_ranks(pid):
        return pid
    raise SystemExit(f"doctor: pid {pid} is neither a torchrun launcher, nor one of its ranks, nor a Slurm step's task")


def _job(launcher: int) -> tuple[str, dict[int, int]]:
    """The job's name and its ranks (rank -> pid) on this node."""
    if hangs.is_launcher(psutil.Process(launcher)):
        return f"torchrun pid {launcher}", hangs.rank_pids(launcher)
    env = psutil.Process(launcher).environ()
    return f"Slurm step {env.get('SLURM_JOB_ID')}.{env.get('SLURM_STEP_ID')}", hangs.slurm_step_ranks(launcher)


# --- Look: the ranks' stacks and processes, the devices ---------------------------------------------------------------


def _processes(pids: list[int]) -> dict[int, psutil.Process]:
    """The ranks' processes, their CPU counters started."""
    processes = {}
    for pid in pids:
        try:
            processes[pid] = psutil.Process(pid)
            processes[pid].cpu_percent(None)
        except psutil.Error:
            continue
    return processes


def _gone(process: psutil.Process) -> bool:
    """Whether a process has ended (an exited one its parent has not reaped yet has ended too)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _written(processes: dict[int, psutil.Process]) -> dict[int, int]:
    """Bytes each process has written so far (to files, pipes and sockets: ``/proc/PID/io``'s wchar); a process
    whose counters cannot be read is left out."""
    found = {}
    for pid, process in processes.items():
        try:
            found[pid] = process.io_counters().write_chars
        except (psutil.Error, AttributeError):  # gone, not readable, or a system without the counters
            continue
    return found


def _cpu_percents(processes: dict[int, psutil.Process]) -> dict[int, float | None]:
    """Each process's share of one core since :func:`_processes` (None: it has gone)."""
    found: dict[int, float | None] = {}
    for pid, process in processes.items():
        try:
            found[pid] = process.cpu_percent(None)
        except psutil.Error:
            found[pid] = None
    return found


def _look(pids: dict[int, int], processes: dict[int, psutil.Process], looks: int, every_seconds: float,
          stack_seconds: float, until: float) -> tuple[dict[int, list[str]], set[int], int, dict[int, int]]:
    """Read each rank's stack ``looks`` times, ``every_seconds`` apart, before ``until`` (a time.monotonic()); a
    rank whose process has gone is not read again. The stacks, the pids gone, how many looks were made, and the
    bytes each process wrote from the first look to the last."""
    stacks: dict[int, list[str]] = {rank: [] for rank in pids}
    first = _written(processes)
    gone = {pid for pid in pids.values() if pid not in processes}
    made = 0
    for look in range(looks):
        if look:
            time.sleep(every_seconds)
        if time.monotonic() >= until or set(pids.values()) <= gone:
            break
        for rank, pid in pids.items():
            if pid not in gone and (left := until - time.monotonic()) > 0:
                stacks[rank].append(hangs.python_stack(pid, min(stack_seconds, left), with_locals=looks > 1))
        gone |= {pid for pid, process in processes.items() if _gone(process)}
        made += 1
    last = _written(processes)
    return stacks, gone, made, {pid: last[pid] - first[pid] for pid in first.keys() & last.keys()}


# Where a job's GPUs are named: ROCm's physical indices first (HIP's count within them), then CUDA's.
VISIBLE_VARIABLES = tuple(name for names in VISIBLE_BY_VENDOR.values() for name in names)


def job_gpus(environments: list[dict[str, str]]) -> tuple[set[int], str] | None:
    """The node's GPU indices the job's ranks were given, and the variable that gave them; None when a rank sees
    every GPU (no variable) or names its GPUs otherwise (UUIDs): then all of the node's are shown."""
    found: set[int] = set()
    named = ""
    for env in environments:
        named = next((name for name in VISIBLE_VARIABLES if name in env), "")
        given = [part.strip() for part in env.get(named, "").split(",") if part.strip()]
        if not given or not all(part.isdigit() for part in given):
            return None
        found |= {int(part) for part in given}
    return (found, named) if environments else None


def the_jobs(readings: list[Reading], gpus: tuple[set[int], str] | None) -> tuple[list[Reading], str]:
    """The readings of the job's own GPUs (a shared node holds other people's), and a line saying which."""
    if gpus is None or not readings:
        return readings, ""
    indices, variable = gpus
    own = [reading for reading in readings if reading.index in indices]
    listed = ", ".join(map(str, sorted(indices)))
    if not own:
        return readings, (f"devices: the ranks' {variable} names GPU(s) {listed}, which the monitor does not list; "
                          "all of the node's are shown")
    return own, f"devices: the job's GPU(s) {listed} (its ranks' {variable}), of the node's {len(readings)}"


def _devices() -> tuple[list[Reading], str]:
    try:
        backend = open_backend("auto")
    except BackendUnavailable:
        return [], ""
    try:
        return backend.read(), backend.name
    finally:
        backend.close()


# --- Read: where each rank stands, what the communication log says ----------------------------------------------------


def _main_thread(stack: str) -> list[str]:
    """The lines of the thread that runs the script's ``<module>`` (else the first thread): frames and locals."""
    threads: list[list[str]] = []
    for line in stack.splitlines():
        if line.startswith("Thread "):
            threads.append([])
        elif threads and line.startswith("    "):
            threads[-1].append(line)

    def runs_the_script(thread: list[str]) -> bool:
        return any((match := FRAME.match(line)) and match["function"] == "<module>" for line in thread)

    return next((thread for thread in threads if runs_the_script(thread)), threads[0] if threads else [])


def _frames(stack: str) -> list[tuple[str, str]]:
    """(function, file:line) of the main thread's frames, innermost first."""
    return [(match["function"], f"{match['file']}:{match['line']}")
            for line in _main_thread(stack) if (match := FRAME.match(line))]


def _in_torch(place: str) -> bool:
    return place.startswith(("torch/", "distributed_c10d.py", "c10d_logger.py")) or "/torch/" in place


@dataclass
class RankLook:
    """One rank: its process, how busy it is, and where its Python stands."""

    rank: int
    pid: int
    cpu_percent: float | None
    stack: str
    collective: str = ""  # the collective its main thread is in, if any
    script_line: str = ""  # the innermost frame outside PyTorch: the learner's own line
    looks: int = 1  # how many of its stacks were read
    places: int = 1  # how many of them differ (frames and locals): more than one, it moves
    wrote: int | None = None  # bytes its process wrote between its first and last look (None: not read)
    ended: bool = False  # its process had gone by the last look

    @property
    def read(self) -> bool:
        """Whether py-spy's dump held frames: else ``stack`` says why it could not be read."""
        return bool(_frames(self.stack))

    @property
    def moving(self) -> bool:
        return (self.places > 1 or bool(self.wrote)) and not self.ended

    def line(self) -> str:
        busy = "?" if self.cpu_percent is None else f"{self.cpu_percent:.0f}%"
        where = (f"in {self.collective}" if self.collective else "in no collective" if self.read
                 else f"stack not read ({self.stack.splitlines()[0] if self.stack else 'py-spy printed nothing'})")
        at = f", at {self.script_line}" if self.script_line else ""
        if self.ended:
            last = f"; last seen {where}{at}" if self.read else ""
            return f"rank {self.rank} (pid {self.pid}): ended while the doctor looked{last}"
        stacks = f"{self.places} different stacks" if self.places > 1 else "the same stack"
        stacks += f" in {self.looks} looks"
        wrote = f", {self.wrote:,} bytes written between them" if self.wrote else ""
        seen = ("" if self.looks < 2 or not self.read else f"; moving ({stacks}{wrote})" if self.moving
                else f"; still (the same stack at all {self.looks} looks, nothing written)")
        return f"rank {self.rank} (pid {self.pid}, CPU {busy}): {where}{at}{seen}"


def read_stack(rank: int, pid: int, stack: str, cpu_percent: float | None) -> RankLook:
    """Where one rank stands, from its py-spy dump: the collective it is in and the script's line."""
    frames = _frames(stack)
    collective = next((name for name, place in frames if name in COLLECTIVES and _in_torch(place)), "")
    script = next((f"{place} in {name}" for name, place in frames if not _in_torch(place)), "")
    return RankLook(rank, pid, cpu_percent, stack, collective, script)


def read_looks(rank: int, pid: int, stacks: list[str], cpu_percent: float | None, ended: bool = False,
               wrote: int | None = None) -> RankLook:
    """Where one rank stands over several looks: the collective it was in at most of them (a rank caught on its
    way into a collective is still waiting there), and whether it moved between them (its stacks differ, or its
    process ``wrote`` bytes between the first and last look); ``ended``: its process had gone by the last look."""
    readable = [stack for stack in stacks if _frames(stack)]
    if not readable:
        look = read_stack(rank, pid, stacks[-1] if stacks else "", cpu_percent)
        look.ended = ended
        return look
    looks = [read_stack(rank, pid, stack, cpu_percent) for stack in readable]
    collective, count = Counter(look.collective for look in looks).most_common(1)[0]
    if collective and 2 * count <= len(looks):
        collective = ""  # in a collective at half the looks or fewer: it does not wait there
    shown = next(look for look in reversed(looks) if bool(look.collective) == bool(collective))
    places = len({tuple(_main_thread(stack)) for stack in readable})
    return RankLook(rank, pid, cpu_percent, shown.stack, shown.collective, shown.script_line, len(readable), places,
                    wrote if len(readable) > 1 else None, ended)


def _diagnosis(log: Path | None, seconds: float) -> tuple[comm_failures.Diagnosis | None, str]:
    """The log's diagnosis, read for at most ``seconds``, and its sentence (or why it could not be read)."""
    if log is None:
        return None, ""
    try:
        diagnosis = comm_failures.read_log(log, seconds=max(seconds, 1.0))
    except bounded_reading.NotReadable as error:
        return None, f"communication log: not read: {error}"
    except OSError as error:
        return None, f"communication log: not read: {log} ({error.strerror})"
    return diagnosis, diagnosis.sentence()


# --- Decide: what to try next -----------------------------------------------------------------------------------------


def spinning_gpus(readings: list[Reading]) -> list[int]:
    """GPUs that report near-full utilization while drawing near-idle power: a kernel that waits (a collective
    whose peer never came), not one that computes. Utilization counts time a kernel runs; power counts work."""
    return [reading.index for reading in readings
            if reading.utilization_percent is not None and reading.utilization_percent >= HUNG_GPU_UTILIZATION
            and reading.power_watts is not None and reading.power_limit_watts
            and reading.power_watts < IDLE_POWER_SHARE * reading.power_limit_watts]


def advise(ranks: list[RankLook], spinning: list[int], diagnosis: comm_failures.Diagnosis | None) -> list[str]:
    """What to try next, from where the ranks stand, the devices and the log."""
    advice: list[str] = []
    ended = [look for look in ranks if look.ended]
    if not ranks:
        advice.append("no rank of the job was found on this node: its ranks have not started yet, or have ended; "
                      "run the doctor again, or name a rank's pid with --pid")
    elif len(ended) == len(ranks):
        advice.append("the job ended while the doctor looked: read how in its output (the exit status, each rank's "
                      "last lines; with NCCL_DEBUG=INFO, --log names a communication failure)")
    elif ended:
        advice.append(f"rank(s) {_names(ended)} ended while the others ran: the others wait in their next collective "
                      "until the process group's timeout; read the ended rank's error in the job's output")
    ranks = [look for look in ranks if not look.ended]
    unread = [look for look in ranks if not look.read]
    ranks = [look for look in ranks if look.read]  # a stack py-spy could not read says nothing about its rank
    if unread:
        advice.append(f"rank(s) {', '.join(str(look.rank) for look in unread)}: the stack was not read (the reason "
                      "is above); run the doctor again, or `py-spy dump --pid PID` by hand")
    waiting = [look for look in ranks if look.collective]
    absent = [look for look in ranks if not look.collective]
    if diagnosis is not None and diagnosis.cause is not None:
        named = ("is consistent with a known report (not certain)" if diagnosis.cause.condition
                 else "names a known failure")
        advice.append(f"the log {named}: {diagnosis.cause.title}; its fix is above")
    if waiting and absent:
        advice += _absent_advice(absent, waiting[0].collective)
    elif waiting and len({(look.collective, look.script_line) for look in waiting}) > 1:
        advice.append("the ranks wait in different collectives (or at different lines): a mismatch; rerun with "
                      "TORCH_DISTRIBUTED_DEBUG=DETAIL to have PyTorch name both sides")
    elif waiting and all(look.moving for look in waiting):
        advice.append("every rank is in the same collective at most looks but moves between them: slow "
                      "communication, not a hang; time the all-reduce against the step (notebook 07)")
    elif waiting:
        advice.append("every rank waits in the same collective at the same line: the data never arrives; read the "
                      "communication log (rerun with NCCL_DEBUG=INFO and give it with --log), check the network "
                      "and that every node's ranks started")
    elif ranks and all(look.moving for look in ranks):
        advice.append("every rank moves outside collectives: slow, not stuck; profile a step (notebook 03)")
    elif ranks and all(look.cpu_percent is not None and look.cpu_percent >= BUSY_PERCENT for look in ranks):
        advice.append("every rank computes outside collectives: slow, not stuck; profile a step (notebook 03)")
    elif ranks:
        advice.append("no rank is in a collective: they wait elsewhere (data loading, a file, a lock); read the "
                      "script lines above")
    if spinning:
        advice.append(f"GPU(s) {', '.join(map(str, spinning))} show high utilization at near-idle power: a "
                      "collective kernel spinning while it waits for a peer (notebook 02: power does not lie)")
    if any(not look.moving for look in ranks):  # something stands still: a hang, or one look only
        advice.append("make the next hang fail by itself: a short process-group timeout "
                      "(init_process_group(timeout=timedelta(seconds=...))), and TORCH_FR_BUFFER_SIZE=2000 to keep "
                      "each rank's last collectives (Flight Recorder)")
    return advice


def _absent_advice(absent: list[RankLook], collective: str) -> list[str]:
    """The ranks outside the collective the others wait in: still ones never reached it, moving ones are late."""
    still, moving = [look for look in absent if not look.moving], [look for look in absent if look.moving]
    advice = []
    if still:
        looked = (f" and stood still at all {min(look.looks for look in still)} looks" if still[0].looks > 1
                  else " (one look only: look again, or use --looks 3, to tell a stuck rank from a slow one)")
        advice.append(f"rank(s) {_names(still)} never reached the {collective} the others wait in{looked}: read "
                      "where they stand (`--full` prints each stack); a condition that only some ranks meet (a "
                      "skipped batch, a rank-0-only branch) is the usual cause")
    if moving:
        advice.append(f"rank(s) {_names(moving)} move between looks while the others wait in {collective}: late, "
                      "not lost, a straggler that every step waits for; compare each rank's step times (notebook "
                      "12, section 4) and what slows it: its loader, its CPU cores, its device")
    return advice


def _names(looks: list[RankLook]) -> str:
    return ", ".join(str(look.rank) for look in looks)


# --- Say: the screen --------------------------------------------------------------------------------------------------


def _device_line(reading: Reading, kind: str) -> str:
    if kind == "cpu":
        return "devices: no GPU here (the ranks run on CPU cores; their CPU use is above)"
    power = "power ?" if reading.power_watts is None else f"{reading.power_watts:.0f} W"
    if reading.power_limit_watts:
        power += f" of {reading.power_limit_watts:.0f} W"
    utilization = "?" if reading.utilization_percent is None else f"{reading.utilization_percent:.0f}%"
    return f"device {reading.index} ({reading.name}): utilization {utilization}, {power}"


@dataclass
class Examination:
    """What the doctor found beside one job."""

    job: str  # "torchrun pid N" or "Slurm step J.S"
    ranks: list[RankLook]
    devices: list[Reading] = field(default_factory=list)
    device_kind: str = ""
    devices_shown: str = ""  # which of the node's GPUs are the job's
    log_verdict: str = ""
    advice: list[str] = field(default_factory=list)
    bound: str = ""  # what the doctor's time bound cut short

    @property
    def over(self) -> bool:
        """No rank of the job runs (all ended while the doctor looked, or none was found)."""
        return all(look.ended for look in self.ranks)

    def screen(self, full: bool = False) -> str:
        ended = ": the job ended while the doctor looked" if self.ranks and self.over else ""
        lines = [f"doctor: {self.job}, {len(self.ranks)} rank(s) on this node{ended}"]
        lines += [look.line() for look in self.ranks]
        lines += [self.bound] if self.bound else []
        lines += [self.devices_shown] if self.devices_shown else []
        lines += [_device_line(reading, self.device_kind) for reading in self.devices]
        if self.log_verdict:
            lines.append(self.log_verdict)
        lines += ["what to try next:"] + [f"  - {advice}" for advice in self.advice]
        if full:
            for look in self.ranks:
                lines += [f"--- rank {look.rank}: its Python stack (py-spy dump) ---", look.stack]
        return "\n".join(lines)


# --- The examination, from the command line ---------------------------------------------------------------------------


def examine(launcher: int, log: Path | None = None, stack_seconds: float = hangs.STACK_SECONDS, looks: int = LOOKS,
            every_seconds: float = LOOK_EVERY_SECONDS, within: float = WITHIN_SECONDS) -> Examination:
    """Look ``looks`` times, ``every_seconds`` apart, at every rank of the job ``launcher`` belongs to (a torchrun
    launcher, or a Slurm step's task); read ``log`` if given; all within about ``within`` seconds."""
    began = time.monotonic()
    job, pids = _job(launcher)
    processes = _processes(list(pids.values()))
    stacks, gone, made, wrote = _look(pids, processes, looks, every_seconds, stack_seconds,
                                      began + LOOK_SHARE * within)
    time.sleep(max(0.0, CPU_SAMPLE_SECONDS - (time.monotonic() - began)))
    cpu = _cpu_percents(processes)
    gone |= {pid for pid, process in processes.items() if _gone(process)}
    ranks = [read_looks(rank, pid, stacks[rank], cpu.get(pid), pid in gone, wrote.get(pid))
             for rank, pid in pids.items()]
    bound = (f"looks: {made} of {looks}, cut short by the doctor's bound (--within {within:g} s)"
             if made < looks and not set(pids.values()) <= gone else "")
    devices, kind = _devices()
    which = ""
    if kind != "cpu":
        environments = [launched_processes.environment(process) for process in processes.values()]
        devices, which = the_jobs(devices, job_gpus(environments))
    diagnosis, verdict = _diagnosis(log, began + within - time.monotonic())
    return Examination(job, ranks, devices, kind, which, verdict,
                       advise(ranks, spinning_gpus(devices) if kind != "cpu" else [], diagnosis), bound)


def _seconds(text: str) -> float:
    """A number of seconds for argparse: finite and not negative."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (a finite number, 0 or more)")
    return seconds


def _give_up_after(seconds: float) -> None:
    """End this process after ``seconds``, whatever it waits for (a GPU or a process that does not answer)."""
    def give_up() -> None:
        print(f"doctor: gave up after {seconds:g} s: a look at the job or its devices did not return (a process or a "
              "GPU that does not answer); read one rank by hand with `py-spy dump --pid PID`", file=sys.stderr,
              flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, help="torchrun's pid, or any rank's (default: your only torchrun job)")
    parser.add_argument("--log", type=Path, help="the job's output, NCCL_DEBUG=INFO or WARN, all ranks together")
    parser.add_argument("--full", action="store_true", help="print each rank's whole Python stack too")
    parser.add_argument("--looks", type=int, default=LOOKS,
                        help=f"how many times to read each rank's stack, to tell stuck from slow (default {LOOKS})")
    parser.add_argument("--every", type=_seconds, default=LOOK_EVERY_SECONDS,
                        help=f"seconds between looks (default {LOOK_EVERY_SECONDS:g})")
    parser.add_argument("--within", type=_seconds, default=WITHIN_SECONDS,
                        help=f"seconds the whole examination may take (default {WITHIN_SECONDS:g}); the looks have "
                             f"{LOOK_SHARE:g} of them")
    args = parser.parse_args(argv)
    if args.looks < 1 or args.within <= 0:
        parser.error("--looks is a count (1 or more), --within a number of seconds above 0")
    if (args.looks - 1) * args.every > LOOK_SHARE * args.within:
        parser.error(f"--looks {args.looks} --every {args.every:g} waits {(args.looks - 1) * args.every:g} s, more "
                     f"than the looks' share of --within {args.within:g} s ({LOOK_SHARE * args.within:g} s): fewer "
                     "looks, a shorter --every, or a longer --within")
    if args.log is not None:
        try:
            bounded_reading.Lines(args.log).close()  # said now, not after the looks
        except bounded_reading.NotReadable as error:
            print(f"doctor: --log {error}", file=sys.stderr)
            return 2
    _give_up_after(args.within + GIVE_UP_GRACE_SECONDS)
    job = find_job(args.pid)
    try:
        examination = examine(job, args.log, looks=args.looks, every_seconds=args.every, within=args.within)
    except psutil.NoSuchProcess:
        print(f"doctor: the job (pid {job}) ended before the doctor could look", file=sys.stderr)
        return 1
    print(examination.screen(args.full))
    return 1 if examination.over else 0
