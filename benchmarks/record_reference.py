"""Record the course's reference results on the GPU node this runs on, in two runs of at most nine minutes each
(``benchmarks/record_reference.sh`` starts it; ``--help`` lists its options): the benchmarks first, then, with
``--notebooks``, the notebooks that use the GPU.

In the first run three lanes run at once, each on its own share of the cores:

- **data**: the data the measurements need (the ``ci`` data, the full-size CIFAR-100 stand-in, the COCO-format
  stand-in at photo sizes), each left as it is where it is already there and verified;
- **GPU**: the benchmarks, one at a time, in order of value, with the GPU to themselves: the card's ceilings,
  the precision ladders at 224 and 32 px, the monitor's cost, the loaders, compilation;
- **CPU**: meanwhile, the notebooks whose every training runs on CPU ranks on a one-GPU node, with the GPU hidden.

With ``--notebooks``, the other notebooks run in the learner's one-GPU shape (the GPU visible: their single-process
cells train on it, their ranks are CPU processes), two at a time, lowest value last. Every benchmark records
each result the moment it exists, into a folder of its own; a result reaches
``benchmarks/results/`` only if no other process used the GPU while it was measured (NVML counts them),
so that a contended timing is never recorded as a GPU figure. New work stops at ``--budget`` less 15 s and
whatever still runs at ``--budget`` is ended (what it recorded so far is kept). The summary, one screen, gives
each figure against its goal and names what was not done.

Each run has a folder of its own (``--out``, else ``runs/reference-<time>`` in ``$COURSE_RUNS_DIR`` or the
checkout, created with a ``-2``, ``-3``... suffix when a copy started in the same second holds that name), and
refuses an ``--out`` that already holds a run. SIGTERM (a Slurm job's time limit, ``scancel``, ``kill``), SIGHUP
(the terminal or the SSH session closed) and SIGINT (Ctrl-C) end the running tasks, every process of each, and the
summary says which tasks were done, which one was interrupted and which never started. A folder that cannot be
written (read-only, a full disk) stops nothing else: what could not be written is named in the summary, a result
that could not reach its folder is kept where its task wrote it, and the summary is printed where its file cannot
be written.

``--dry-run`` runs the same plan at the ``ci`` size on the CPU, with tiny settings and the GPU hidden, and
records into the run folder only: the test suite runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from course_utils import config
from course_utils.atomic_files import write_atomic, write_text_atomic
from course_utils.parallel.launched_processes import Launch  # every process a task started, found and ended
from course_utils.shared_folders import new_folder

ROOT = Path(__file__).resolve().parents[1]
HIDDEN_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
GRACE_SECONDS = 15  # no new work this close to the end of the budget
# The signals that stop a run, and who sends them.
STOP_SIGNALS = {signal.SIGTERM: "a Slurm job's time limit, scancel or kill", signal.SIGHUP:
                "the terminal or the SSH session closed", signal.SIGINT: "Ctrl-C"}


def say(text: str, stream=None) -> None:
    """Print, where printing is still possible: after SIGHUP the terminal may be gone, and the run goes on."""
    try:
        print(text, file=stream or sys.stdout, flush=True)
    except (OSError, ValueError):  # EIO from a closed terminal, a broken pipe, a closed stream
        pass


class Stop:
    """The first stop signal that reached the recorder. Its handler only notes it; the main loop then ends the
    running tasks (which run in sessions of their own, out of reach of a signal to this process's group) and
    writes the summary, and the recorder ends by the same signal. A signal ignored when the recorder started
    (``nohup``'s SIGHUP, a background job's SIGINT) stays ignored."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None

    def install(self) -> None:
        for number in STOP_SIGNALS:
            if signal.getsignal(number) is not signal.SIG_IGN:
                signal.signal(number, self._note)

    def _note(self, number: int, frame: object) -> None:
        self.signal = self.signal or signal.Signals(number)  # a second signal changes nothing: the tasks end anyway

    @property
    def name(self) -> str:
        return self.signal.name if self.signal else ""

    def end_by_it(self) -> None:
        """End this process by the signal that stopped it, as its sender expects (exit status 128 + N)."""
        if self.signal is not None:
            signal.signal(self.signal, signal.SIG_DFL)
            os.kill(os.getpid(), self.signal)


class RunFolderTaken(Exception):
    """``--out`` names a folder that already holds a run."""


def claim_run_folder(out: Path | None) -> Path:
    """A run folder no other copy of the recorder uses: ``out``, unless it already holds a run (its
    ``log.jsonl``, created here with O_EXCL, so two copies given one ``--out`` cannot both claim it); else
    ``reference-<time>`` in the course's runs folder, created with mkdir, which fails where it exists, then
    ``-2``, ``-3``... (two copies started in the same second)."""
    if out is None:
        out = new_folder(config.runs_dir() / f"reference-{datetime.now():%Y%m%d-%H%M%S}")
    out = out.absolute()  # the tasks run in other folders (a notebook's kernel in notebooks/)
    out.mkdir(parents=True, exist_ok=True)
    try:
        (out / "log.jsonl").open("x").close()
    except FileExistsError:
        raise RunFolderTaken(f"{out} already holds a run (its log.jsonl): give --out a new folder, or leave --out "
                             "out for a folder of this run's own under runs/") from None
    (out / "logs").mkdir(exist_ok=True)
    return out


def place(path: Path, target: Path) -> Path:
    """Move the file ``path`` to ``target`` whole: renamed on one file system, else copied under a temporary name
    and renamed, so that a full disk leaves no truncated result under its name; ``path`` is removed only then."""
    try:
        os.replace(path, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        write_atomic(target, lambda stream: stream.write(path.read_bytes()))
        with contextlib.suppress(OSError):  # placed whole; a copy left in the run folder does no harm
            path.unlink()
    return target


@dataclass
class Task:
    """One piece of the plan: a command, the lane it runs in, and what became of it."""

    name: str
    command: list[str]  # after the Python interpreter
    lane: str  # "data", "gpu", "cpu" (GPU hidden, beside the GPU lane) or "notebooks" (after the GPU lane)
    estimate: float  # seconds on an H200 (the reference run of 2026-11-29); a task may take three times as long
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # tasks that must have finished first
    ready: bool = False  # nothing to do (the data is there already)
    status: str = "planned"  # planned, running, done, failed (exit N), cut at the budget, not started, ...
    started: float | None = None
    ended: float | None = None
    process: subprocess.Popen | None = None
    launch: Launch = field(default_factory=Launch)  # marks the task's processes (kernels, ranks) to end them all
    crowded: int = 0  # the most other processes seen on the GPU while it ran (NVML; 0 where not counted)
    results: list[Path] = field(default_factory=list)
    note: str = ""

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.name).strip("-")

    @property
    def seconds(self) -> float | None:
        return None if self.started is None or self.ended is None else self.ended - self.started


def _bench(script: str, *args: str) -> list[str]:
    return [str(ROOT / "benchmarks" / script), *args]


def _notebook(number: str, out: Path) -> list[str]:
    path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    return ["-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--ExecutePreprocessor.timeout=-1",
            "--output-dir", str(out / "notebooks"), "--output", path.stem, str(path)]


def plan(dry_run: bool, out: Path, data: Path, notebooks: bool = False) -> list[Task]:
    """Every task of the run, in the order of value within each lane: the benchmarks with the notebooks whose ranks
    are CPU processes beside them, or (``notebooks``) the notebooks that use the GPU, two at a time. Each part
    fits nine minutes on an H200; both together do not."""
    cifar, coco = data / "cifar100", data / "coco"
    workshop = {"COURSE_SIZE": "workshop"}
    if dry_run:  # the ci size on the CPU: the same lanes and benchmarks, each as small as still tells something
        return [
            Task("ci data", ["-m", "data_prep", "--size", "ci"], "data", 5),
            Task("ceilings", _bench("ceilings.py", "--side", "128", "--repeats", "3"), "gpu", 10),
            Task("progression 224 px", _bench("progression.py", "--image-size", "224", "--batch-size", "2",
                                              "--steps", "1", "--rounds", "3", "--warmup", "1", "--stages", "0,1,2"),
                 "gpu", 20),
            Task("progression 32 px", _bench("progression.py", "--image-size", "32", "--batch-size", "16", "--steps",
                                             "2", "--rounds", "3", "--warmup", "1", "--stages", "0,1,2"), "gpu", 20),
            Task("monitor cost", _bench("monitor_cost.py", "--batch-size", "16", "--steps", "3", "--rounds", "3"),
                 "gpu", 20),
            Task("loaders", _bench("loaders.py", "--steps", "2", "--warmup", "1", "--rounds", "3"), "gpu", 40,
                 needs=("ci data",)),
            Task("notebook 00 (ci)", _notebook("00", out), "notebooks", 30, needs=("ci data",)),
        ]
    ci = {"COURSE_SIZE": "ci"}
    tasks = [
        Task("ci data", ["-m", "data_prep", "--size", "ci"], "data", 10),
        Task("CIFAR-100 stand-in", ["-m", "data_prep.tiny_cifar100", "--root", str(cifar), "--train", "50000",
                                    "--test", "10000"], "data", 17),
        Task("COCO stand-in", ["-m", "data_prep.tiny_coco", "--root", str(coco), "--train", "512", "--val", "64",
                               "--photo-sizes"], "data", 5),
    ]
    if notebooks:  # in the learner's one-GPU shape: the GPU visible, its single-process cells train on it
        tasks += [Task(f"notebook {n} ({size})", _notebook(n, out), "notebooks", estimate, {"COURSE_SIZE": size},
                       ("ci data",) if size == "ci" else ("CIFAR-100 stand-in", "COCO stand-in"))
                  for n, size, estimate in (("07", "ci", 170), ("08", "ci", 150), ("12", "ci", 90),
                                            ("01", "workshop", 100), ("10", "workshop", 90), ("06", "workshop", 40),
                                            ("05", "ci", 60), ("03", "workshop", 40), ("00", "workshop", 20),
                                            ("02", "ci", 40), ("04", "ci", 40))]
        return tasks
    ladder = ("--stages", "0,1,2,3,4,5", "--rounds", "5")
    tasks += [
        Task("ceilings", _bench("ceilings.py"), "gpu", 12),
        Task("progression 224 px ResNet-50", _bench("progression.py", "--image-size", "224", "--model", "resnet50",
                                                    "--batch-size", "128", "--steps", "20", *ladder), "gpu", 106),
        Task("progression 224 px ResNet-152", _bench("progression.py", "--image-size", "224", "--model",
                                                     "resnet152", "--batch-size", "128", "--steps", "15",
                                                     "--stages", "1,4", "--rounds", "5"), "gpu", 34),
        Task("progression 32 px batch 128", _bench("progression.py", "--image-size", "32", "--model", "resnet18",
                                                   "--batch-size", "128", "--steps", "50", *ladder), "gpu", 37),
        Task("progression 32 px batch 1024", _bench("progression.py", "--image-size", "32", "--model", "resnet18",
                                                    "--batch-size", "1024", "--steps", "20", *ladder), "gpu", 50),
        Task("monitor cost", _bench("monitor_cost.py", "--steps", "150", "--rounds", "5"), "gpu", 30),
        Task("loaders", _bench("loaders.py", "--steps", "150", "--rounds", "3"), "gpu", 85,
             needs=("CIFAR-100 stand-in",)),
        Task("progression 32 px compiled", _bench("progression.py", "--image-size", "32", "--model", "resnet18",
                                                  "--batch-size", "128", "--steps", "50", "--stages", "6,7",
                                                  "--rounds", "5"), "gpu", 70),
        Task("memory ladder, one GPU", _bench("memory_ladder.py", "--one-gpu"), "gpu", 25, workshop),
        Task("detector s/it, one GPU", _bench("detection.py", "--one-gpu", "--steps", "100"), "gpu", 31, workshop,
             ("COCO stand-in",)),
    ]
    # Beside the GPU lane, the GPU hidden: the notebooks whose every training runs on CPU ranks in a one-GPU shape.
    tasks += [Task(f"notebook {n} (ci, CPU ranks)", _notebook(n, out), "cpu", estimate, {**ci, **HIDDEN_GPU},
                   ("ci data",)) for n, estimate in (("11", 120), ("09", 100))]
    return tasks


def _already_there(task: Task, data: Path) -> str:
    """Why a data task has nothing to do (its data is there and verified), or an empty string."""
    sys.path.insert(0, str(ROOT))
    from course_utils.data import coco
    from data_prep.__main__ import verified

    if task.name == "CIFAR-100 stand-in" and verified(data / "cifar100"):
        return "verified, kept"
    if task.name == "COCO stand-in" and not coco.problems(data / "coco"):
        return "verified, kept"
    return ""


def gpu_processes(pci_address: str) -> set[int] | None:
    """The processes that hold a context on the GPU at ``pci_address`` (NVML), or None where they cannot be
    listed (no NVIDIA driver library, an AMD GPU): the check that nothing else ran on it."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_address)
            return {process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver, an address NVML does not know: not listed
        return None


def others_on_the_gpu(found: set[int] | None, task_pid: int) -> int:
    """How many of the GPU's processes are not the task's own (its process or any child of it). Inside a
    container NVML may report the host's process ids, which match none of ours: then all but one are others."""
    if not found:
        return 0
    import psutil

    try:
        ours = {task_pid} | {child.pid for child in psutil.Process(task_pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        ours = {task_pid}
    return len(found - ours) if found & ours else max(0, len(found) - 1)


def probe(python: str, env: dict[str, str]) -> dict:
    """The GPU this run measures (its name and PCI address), asked of a child process so that this one never
    holds a context on it."""
    code = ("import json, torch\nfrom course_utils import devices\nd = devices.default_device()\n"
            "print(json.dumps({'device': devices.device_name(d), 'gpu': d.type == 'cuda', "
            "'pci': devices.pci_address(d), 'torch': torch.__version__}))")
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


class Run:
    """The lanes, their cores and the clock: starts what may start, ends what ran out of time, sorts results."""

    def __init__(self, tasks: list[Task], out: Path, budget: float, python: str, env: dict[str, str],
                 destination: Path, pci: str, cores: list[int]) -> None:
        self.tasks, self.out, self.budget, self.python, self.env = tasks, out, budget, python, env
        self.destination, self.pci = destination, pci
        half = max(1, len(cores) // 2)
        self.cores = {"gpu": cores[:half], "data": cores[half:] or cores, "cpu": cores[half:] or cores,
                      "notebooks": cores}
        self.start = time.monotonic()
        self.unwritten: list[str] = []  # what could not be written (a read-only folder, a full disk), for the summary
        self.unlogged: list[str] = []  # tasks whose line in log.jsonl could not be written
        self.log_error = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def _done(self, name: str) -> bool:
        return any(t.name == name and (t.ready or t.status == "done") for t in self.tasks)

    def _blocked(self, task: Task) -> bool:
        failed = [t for t in self.tasks if t.name in task.needs and t.status not in ("planned", "running", "done")
                  and not t.ready]
        if failed:
            task.status = f"not started: {failed[0].name} {failed[0].status}"
        return not all(self._done(name) for name in task.needs)

    def _may_start(self, task: Task) -> bool:
        running = [t for t in self.tasks if t.status == "running"]
        lanes = [t.lane for t in running]
        if task.lane == "gpu":
            return "gpu" not in lanes and "notebooks" not in lanes
        if task.lane == "notebooks":  # after the GPU lane, two at a time
            gpu_left = any(t.lane == "gpu" and t.status in ("planned", "running") for t in self.tasks)
            return not gpu_left and lanes.count("notebooks") < 2
        return task.lane not in lanes

    def _launch(self, task: Task) -> None:
        staged = self.out / "staged" / task.slug
        try:
            staged.mkdir(parents=True, exist_ok=True)
            log = (self.out / "logs" / f"{task.slug}.log").open("w")
        except OSError as error:
            task.status = f"not started: its results folder or log could not be created ({error.strerror})"
            self.unwritten.append(f"{error.filename}: {error.strerror}; {task.name} was not started")
            say(f"[{self.elapsed():5.0f} s] {task.status}: {task.name}")
            return
        env = {**self.env, **task.env, **task.launch.marker, "COURSE_RESULTS_DIR": str(staged),
               "COURSE_RUNS_DIR": str(self.out / "runs" / task.slug), "MPLBACKEND": "Agg", "COURSE_INTERACTIVE": "0"}
        cores = self.cores[task.lane]
        with log:  # the task holds its own copy of the file
            task.process = subprocess.Popen([self.python, *task.command], cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=(lambda: os.sched_setaffinity(0, cores))
                                            if hasattr(os, "sched_setaffinity") else None)
        task.launch.started.append(task.process)
        task.status, task.started = "running", self.elapsed()
        say(f"[{task.started:5.0f} s] start  {task.name} ({task.lane} lane, cores {cores[0]}-{cores[-1]})")

    def _end(self, task: Task, status: str) -> None:
        task.ended = self.elapsed()
        task.status = status
        self._sort_results(task)
        line = json.dumps({"task": task.name, "lane": task.lane, "status": task.status, "seconds": task.seconds,
                           "results": [str(p) for p in task.results], "note": task.note}) + "\n"
        try:
            with (self.out / "log.jsonl").open("a") as log:  # opened for each line: a full disk may free up
                log.write(line)
        except OSError as error:
            self.unlogged.append(task.name)
            self.log_error = self.log_error or error.strerror
        say(f"[{task.ended:5.0f} s] {task.status:>6} {task.name} ({task.seconds:.0f} s)"
            + (f": {task.note}" if task.note else ""))

    def _sort_results(self, task: Task) -> None:
        """Move what the task recorded where it belongs: its GPU figures to the results folder, unless another
        process shared the GPU while they were measured."""
        staged = sorted((self.out / "staged" / task.slug).glob("*.json"))
        contended = task.lane == "gpu" and task.crowded > 0
        target = self.out / "contended" if contended else self.destination
        if contended:
            task.note = (f"{task.crowded} other process(es) used the GPU while it ran: its timings are kept in "
                         f"{target}, not recorded as GPU figures")
        for path in staged:
            try:
                target.mkdir(parents=True, exist_ok=True)
                task.results.append(place(path, target / path.name))
            except OSError as error:  # a read-only results folder, a full disk: the result stays where it is
                task.results.append(path)
                self.unwritten.append(f"{target / path.name}: {error.strerror}; kept in {path}")

    def step(self) -> bool:
        """One look at every task; False once nothing runs and nothing more can start."""
        now = self.elapsed()
        for task in self.tasks:
            if task.status == "running":
                if task.lane == "gpu" and self.pci:
                    task.crowded = max(task.crowded, others_on_the_gpu(gpu_processes(self.pci), task.process.pid))
                code = task.process.poll()
                if code is not None:
                    self._end(task, "done" if code == 0 else f"failed (exit {code})")
                elif now >= self.budget or now - task.started > self.limit(task):
                    task.launch.end()
                    self._end(task, "cut at the budget" if now >= self.budget else "cut at its time limit")
        for task in self.tasks:
            if task.status != "planned" or task.ready:
                continue
            if now >= self.budget - GRACE_SECONDS:
                task.status = "not started: out of time"
            elif not self._blocked(task) and task.status == "planned" and self._may_start(task):
                self._launch(task)
        return any(t.status in ("running", "planned") and not t.ready for t in self.tasks)

    def limit(self, task: Task) -> float:
        """How long a task may run: three times its estimate, at least a minute more than it."""
        return max(3 * task.estimate, task.estimate + 60)

    def stop(self, reason: str) -> None:
        """End every running task, all of its processes (SIGTERM to each and to its process group, SIGKILL
        after a grace time), keeping what it recorded; what was planned is not started."""
        for task in self.tasks:
            if task.status == "running":
                code = task.process.poll()
                task.launch.end()
                self._end(task, "done" if code == 0 else f"interrupted by {reason}")
            elif task.status == "planned" and not task.ready:
                task.status = f"not started: stopped by {reason}"


def summary(tasks: list[Task], device: str, elapsed: float, budget: float, destination: Path, out: Path,
            counted: bool = True, stopped: str = "", unwritten: list[str] | tuple[str, ...] = ()) -> str:
    """The run on one screen: each GPU figure against its goal, the notebooks, and what was not done.
    ``counted``: whether the GPU's other processes could be counted (NVML); ``stopped``: the signal that stopped
    the run, if one did; ``unwritten``: what could not be written, and where it was kept instead."""
    lines = [f"Reference run on {device}: {elapsed:.0f} s of {budget:.0f}; results in {destination}, logs and "
             f"executed notebooks in {out}", ""]
    if stopped:
        done = [t.name for t in tasks if t.ready or t.status == "done"]
        cut = [t.name for t in tasks if t.status.startswith("interrupted")]
        never = [t.name for t in tasks if not t.ready and t.status.startswith("not started")]
        cause = STOP_SIGNALS.get(getattr(signal, stopped, None), "")
        lines += [f"STOPPED by {stopped}" + (f" ({cause})" if cause else "") + f" after {elapsed:.0f} s: its running "
                  "tasks were ended, every process of each; what they recorded is kept.",
                  "  done: " + (", ".join(done) or "nothing"), "  interrupted: " + (", ".join(cut) or "nothing"),
                  "  never started: " + (", ".join(never) or "nothing"), ""]
    alone = ("with the GPU to itself (no other process on it, counted by NVML)" if counted else
             "with no other task of this run on the GPU (other users' processes cannot be counted here: no NVML)")
    benchmarks = [t for t in tasks if t.lane == "gpu"]  # none in the notebooks' run
    if benchmarks:
        lines.append(f"GPU figures, each measured {alone}:" if device != "CPU" else
                     "Benchmarks on the CPU (a dry run: CPU figures at tiny sizes, not GPU figures; the goals are the "
                     "GPU's):")
    for task in benchmarks:
        time_text = f" after {task.seconds:.0f} s" if task.seconds is not None else ""
        lines.append(f"- {task.name}: {task.status}{time_text}" + (f" ({task.note})" if task.note else ""))
        for path in task.results:
            try:
                goals = json.loads(path.read_text()).get("goals", [])
            except (OSError, ValueError) as error:
                lines.append(f"    {path}: unreadable ({error})")
                continue
            for goal in goals:
                verdict = {True: "met", False: "NOT met", None: "not judged"}[goal["met"]]
                value = "not measured" if goal["value"] is None else f"{goal['value']:.3g}"
                lines.append(f"    {goal['figure']}: {value} (goal {goal['goal']}): {verdict}")
    lines += ["", "Notebooks (timed beside other work: they show that the notebooks run, not how long they take):"]
    for task in (t for t in tasks if t.lane in ("cpu", "notebooks")):
        time_text = f" in {task.seconds:.0f} s" if task.seconds is not None else ""
        lines.append(f"- {task.name}: {task.status}{time_text}")
    data = [f"{t.name}: {'verified, kept' if t.ready else t.status}" for t in tasks if t.lane == "data"]
    lines += ["", "Data: " + "; ".join(data)]
    missing = [t.name for t in tasks if not t.ready and t.status != "done"]
    lines.append("Not done: " + (", ".join(missing) if missing else "nothing"))
    kept: dict[Path, list[str]] = {}
    for path in (path for task in tasks for path in task.results):
        kept.setdefault(path.parent, []).append(path.name)
    lines.append("Results kept: " + ("; ".join(f"{', '.join(names)} in {folder}" for folder, names in kept.items())
                                     or "none"))
    if unwritten:
        lines += ["Could not be written (the run went on without it):", *(f"- {text}" for text in unwritten)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the ci size on the CPU, GPU hidden; records into "
                                                              "the run folder only")
    parser.add_argument("--notebooks", action="store_true", help="the second run: the notebooks that use the GPU, "
                                                                 "two at a time (the first records the benchmarks)")
    parser.add_argument("--budget", type=float, default=None, help="seconds in all (default 540, nine minutes; "
                                                                   "300 for a dry run)")
    parser.add_argument("--out", type=Path, default=None,
                        help="run folder, new or holding no run yet (default reference-<time> in $COURSE_RUNS_DIR, "
                             "else in runs/ of the checkout, with a -2, -3... suffix when that name is taken)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data root (default $COURSE_DATA_DIR, else stand-in/ in the checkout)")
    args = parser.parse_args(argv)
    if args.dry_run and args.notebooks:  # plan() has one dry plan, the benchmarks': the flag would go unread
        parser.error("--notebooks has no dry run: on the CPU every notebook already runs at the ci size in "
                     "`make test` (nbval); run --dry-run alone to try the benchmarks' plan")
    stop = Stop()
    stop.install()
    budget = args.budget or (300 if args.dry_run else 540)
    try:
        out = claim_run_folder(args.out)
    except RunFolderTaken as error:
        say(f"error: {error}; nothing was run", sys.stderr)
        return 2
    except OSError as error:
        say(f"error: the run folder cannot be written ({error.filename}: {error.strerror}); nothing was run and "
            "nothing written. Give --out a folder on a writable file system with free space", sys.stderr)
        return 2
    say(f"run folder {out}")
    data = (args.data_dir or Path(os.environ.get("COURSE_DATA_DIR") or ROOT / "stand-in")).resolve()
    # The GPU lane measures the workshop size whatever the shell exported; the ci tasks say ci themselves.
    env = {**os.environ, "COURSE_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1", "COURSE_SIZE": "workshop"}
    if args.dry_run:
        env.update(HIDDEN_GPU, COURSE_SIZE="ci")
    tasks = plan(args.dry_run, out, data, args.notebooks)
    try:
        found = probe(sys.executable, env)
    except subprocess.CalledProcessError as error:
        if not stop.signal:  # Ctrl-C reaches the probe too (it shares the terminal's process group)
            say(f"error: {sys.executable} could not say which device is here (exit {error.returncode}):\n"
                f"{(error.stderr or '')[-2000:]}", sys.stderr)
            return 2
        found = {"device": "CPU" if args.dry_run else "this node's GPU (not asked: stopped first)", "gpu": False,
                 "pci": "", "torch": "(not asked)"}
    if not args.dry_run and not found["gpu"] and not stop.signal:
        say("error: no GPU is visible to PyTorch here; on a GPU node this records its reference results, and "
            "--dry-run tries the plan on the CPU", sys.stderr)
        return 2
    for task in tasks:
        if task.lane == "data" and (reason := _already_there(task, data)):
            task.ready, task.status = True, reason
    destination = out / "results" if args.dry_run else ROOT / "benchmarks" / "results"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    pci = found["pci"] if found["gpu"] else ""
    if pci and (others := gpu_processes(pci)):
        say(f"warning: {len(others)} process(es) already use the GPU; what they share it with is not recorded as "
            "a GPU figure", sys.stderr)
    say(f"{found['device']}, PyTorch {found['torch']}, {len(cores)} cores; {len(tasks)} tasks, budget {budget:.0f} s; "
        f"run folder {out}")
    run = Run(tasks, out, budget, sys.executable, env, destination, pci, cores)
    while not stop.signal and run.step():
        time.sleep(0.5)
    if stop.signal:
        say(f"{stop.name} received: ending the running tasks (every process of each), then the summary",
            sys.stderr)
        run.stop(stop.name)
    if run.unlogged:
        run.unwritten.append(f"{out / 'log.jsonl'}: {run.log_error}; the lines of {', '.join(run.unlogged)} are "
                             "missing from it (this summary has their outcome)")
    text = summary(tasks, found["device"], run.elapsed(), budget, destination, out,
                   counted=not pci or gpu_processes(pci) is not None, stopped=stop.name, unwritten=run.unwritten)
    try:
        write_text_atomic(out / "summary.txt", text + "\n")
        written = f"(also in {out / 'summary.txt'})"
    except OSError as error:
        written = (f"summary.txt could not be written ({error.filename}: {error.strerror}): this screen is the "
                   "only copy of the summary")
    say("\n" + text + "\n" + written)
    if not written.startswith("(also"):
        say(f"warning: {written}", sys.stderr)
    if stop.signal:
        stop.end_by_it()
    return 0 if all(t.ready or t.status == "done" for t in tasks) else 1


if __name__ == "__main__":
    sys.exit(main())
