"""Record the course's reference results on the GPU node this runs on, in at most nine minutes
(``benchmarks/record_reference.sh`` starts it; ``--help`` lists its options).

Three lanes run at once, each on its own share of the cores:

- **data**: the data the measurements need (the ``ci`` data, the full-size CIFAR-100 stand-in, the COCO-format
  stand-in at photo sizes), each left as it is where it is already there and verified;
- **GPU**: the benchmarks, one at a time, in order of value, with the GPU to themselves: the card's ceilings,
  the precision ladders at 224 and 32 px, the monitor's cost, the loaders, compilation;
- **CPU**: meanwhile, the notebooks whose ranks are CPU processes on a one-GPU node, with the GPU hidden.

When the GPU lane is done, the notebooks that train on the GPU run two at a time, lowest value last. Every
benchmark records each result the moment it exists, into a folder of its own; a result reaches
``benchmarks/results/`` only if no other process used the GPU while it was measured (NVML counts them),
so that a contended timing is never recorded as a GPU figure. New work stops at ``--budget`` less 15 s and
whatever still runs at ``--budget`` is ended (what it recorded so far is kept). The summary, one screen, gives
each figure against its goal and names what was not done.

``--dry-run`` runs the same plan at the ``ci`` size on the CPU, with tiny settings and the GPU hidden, and
records into the run folder only: the test suite runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from course_utils.parallel.launched_processes import Launch  # every process a task started, found and ended

ROOT = Path(__file__).resolve().parents[1]
HIDDEN_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
GRACE_SECONDS = 15  # no new work this close to the end of the budget


@dataclass
class Task:
    """One piece of the plan: a command, the lane it runs in, and what became of it."""

    name: str
    command: list[str]  # after the Python interpreter
    lane: str  # "data", "gpu", "cpu" (GPU hidden, beside the GPU lane) or "notebooks" (after the GPU lane)
    estimate: float  # seconds, from the H100 figures (GPU-EVIDENCE.md)
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


def plan(dry_run: bool, out: Path, data: Path) -> list[Task]:
    """Every task of the run, in the order of value within each lane."""
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
    ladder = ("--stages", "0,1,2,3,4,5", "--rounds", "5")
    tasks = [
        Task("ci data", ["-m", "data_prep", "--size", "ci"], "data", 4),
        Task("CIFAR-100 stand-in", ["-m", "data_prep.tiny_cifar100", "--root", str(cifar), "--train", "50000",
                                    "--test", "10000"], "data", 14),
        Task("COCO stand-in", ["-m", "data_prep.tiny_coco", "--root", str(coco), "--train", "512", "--val", "64",
                               "--photo-sizes"], "data", 8),
        Task("ceilings", _bench("ceilings.py"), "gpu", 10),
        Task("progression 224 px ResNet-50", _bench("progression.py", "--image-size", "224", "--model", "resnet50",
                                                    "--batch-size", "128", "--steps", "20", *ladder), "gpu", 50),
        Task("progression 224 px ResNet-152", _bench("progression.py", "--image-size", "224", "--model",
                                                     "resnet152", "--batch-size", "128", "--steps", "15",
                                                     "--stages", "1,4", "--rounds", "5"), "gpu", 25),
        Task("progression 32 px batch 128", _bench("progression.py", "--image-size", "32", "--model", "resnet18",
                                                   "--batch-size", "128", "--steps", "50", *ladder), "gpu", 12),
        Task("progression 32 px batch 1024", _bench("progression.py", "--image-size", "32", "--model", "resnet18",
                                                    "--batch-size", "1024", "--steps", "20", *ladder), "gpu", 10),
        Task("monitor cost", _bench("monitor_cost.py", "--steps", "150", "--rounds", "5"), "gpu", 23),
        Task("loaders", _bench("loaders.py", "--steps", "150", "--rounds", "3"), "gpu", 50,
             needs=("CIFAR-100 stand-in",)),
        Task("progression 32 px compiled", _bench("progression.py", "--image-size", "32", "--model", "resnet18",
                                                  "--batch-size", "128", "--steps", "50", "--stages", "6,7",
                                                  "--rounds", "5"), "gpu", 90),
        Task("memory ladder, one GPU", _bench("memory_ladder.py", "--one-gpu"), "gpu", 15, workshop),
        Task("detector s/it, one GPU", _bench("detection.py", "--one-gpu", "--steps", "100"), "gpu", 45, workshop,
             ("COCO stand-in",)),
    ]
    tasks += [Task(f"notebook {n} (ci, CPU ranks)", _notebook(n, out), "cpu", 50, {**ci, **HIDDEN_GPU},
                   ("ci data",)) for n in ("11", "09", "08", "07")]
    tasks += [Task(f"notebook {n} (workshop)", _notebook(n, out), "notebooks", estimate, workshop,
                   ("CIFAR-100 stand-in", "COCO stand-in"))
              for n, estimate in (("00", 10), ("01", 40), ("03", 40), ("06", 40), ("10", 90))]
    tasks += [Task(f"notebook {n} (ci)", _notebook(n, out), "notebooks", 40, ci, ("ci data",))
              for n in ("05", "02", "04")]
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
        self.log = (out / "log.jsonl").open("a")

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
        staged.mkdir(parents=True, exist_ok=True)
        env = {**self.env, **task.env, **task.launch.marker, "COURSE_RESULTS_DIR": str(staged),
               "COURSE_RUNS_DIR": str(self.out / "runs" / task.slug), "MPLBACKEND": "Agg", "COURSE_INTERACTIVE": "0"}
        cores = self.cores[task.lane]
        log = (self.out / "logs" / f"{task.slug}.log").open("w")
        task.process = subprocess.Popen([self.python, *task.command], cwd=ROOT, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=(lambda: os.sched_setaffinity(0, cores))
                                        if hasattr(os, "sched_setaffinity") else None)
        task.launch.started.append(task.process)
        task.status, task.started = "running", self.elapsed()
        print(f"[{task.started:5.0f} s] start  {task.name} ({task.lane} lane, cores {cores[0]}-{cores[-1]})",
              flush=True)

    def _end(self, task: Task, status: str) -> None:
        task.ended = self.elapsed()
        task.status = status
        self._sort_results(task)
        self.log.write(json.dumps({"task": task.name, "lane": task.lane, "status": task.status,
                                   "seconds": task.seconds, "results": [str(p) for p in task.results],
                                   "note": task.note}) + "\n")
        self.log.flush()
        print(f"[{task.ended:5.0f} s] {task.status:>6} {task.name} ({task.seconds:.0f} s)"
              + (f": {task.note}" if task.note else ""), flush=True)

    def _sort_results(self, task: Task) -> None:
        """Move what the task recorded where it belongs: its GPU figures to the results folder, unless another
        process shared the GPU while they were measured."""
        staged = sorted((self.out / "staged" / task.slug).glob("*.json"))
        contended = task.lane == "gpu" and task.crowded > 0
        target = self.out / "contended" if contended else self.destination
        if contended:
            task.note = (f"{task.crowded} other process(es) used the GPU while it ran: its timings are kept in "
                         f"{target}, not recorded as GPU figures")
        target.mkdir(parents=True, exist_ok=True)
        for path in staged:
            shutil.move(str(path), target / path.name)
            task.results.append(target / path.name)

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


def summary(tasks: list[Task], device: str, elapsed: float, budget: float, destination: Path, out: Path,
            counted: bool = True) -> str:
    """The run on one screen: each GPU figure against its goal, the notebooks, and what was not done.
    ``counted``: whether the GPU's other processes could be counted (NVML)."""
    lines = [f"Reference run on {device}: {elapsed:.0f} s of {budget:.0f}; results in {destination}, logs and "
             f"executed notebooks in {out}", ""]
    alone = ("with the GPU to itself (no other process on it, counted by NVML)" if counted else
             "with no other task of this run on the GPU (other users' processes cannot be counted here: no NVML)")
    lines.append(f"GPU figures, each measured {alone}:" if device != "CPU" else
                 "Benchmarks on the CPU (a dry run: CPU figures at tiny sizes, not GPU figures; the goals are the "
                 "GPU's):")
    for task in (t for t in tasks if t.lane == "gpu"):
        time_text = f" after {task.seconds:.0f} s" if task.seconds is not None else ""
        lines.append(f"- {task.name}: {task.status}{time_text}" + (f" ({task.note})" if task.note else ""))
        for path in task.results:
            for goal in json.loads(path.read_text()).get("goals", []):
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the ci size on the CPU, GPU hidden; records into "
                                                              "the run folder only")
    parser.add_argument("--budget", type=float, default=None, help="seconds in all (default 540, nine minutes; "
                                                                   "300 for a dry run)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/reference-<time>)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data root (default $COURSE_DATA_DIR, else stand-in/ in the checkout)")
    args = parser.parse_args(argv)
    budget = args.budget or (300 if args.dry_run else 540)
    out = args.out or ROOT / "runs" / f"reference-{datetime.now():%Y%m%d-%H%M%S}"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    data = (args.data_dir or Path(os.environ.get("COURSE_DATA_DIR") or ROOT / "stand-in")).resolve()
    # The GPU lane measures the workshop size whatever the shell exported; the ci tasks say ci themselves.
    env = {**os.environ, "COURSE_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1", "COURSE_SIZE": "workshop"}
    if args.dry_run:
        env.update(HIDDEN_GPU, COURSE_SIZE="ci")
    tasks = plan(args.dry_run, out, data)
    found = probe(sys.executable, env)
    if not args.dry_run and not found["gpu"]:
        print("error: no GPU is visible to PyTorch here; on a GPU node this records its reference results, and "
              "--dry-run tries the plan on the CPU", file=sys.stderr)
        return 2
    for task in tasks:
        if task.lane == "data" and (reason := _already_there(task, data)):
            task.ready, task.status = True, reason
    destination = out / "results" if args.dry_run else ROOT / "benchmarks" / "results"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    pci = found["pci"] if found["gpu"] else ""
    if pci and (others := gpu_processes(pci)):
        print(f"warning: {len(others)} process(es) already use the GPU; what they share it with is not recorded as "
              "a GPU figure", file=sys.stderr)
    print(f"{found['device']}, PyTorch {found['torch']}, {len(cores)} cores; {len(tasks)} tasks, budget "
          f"{budget:.0f} s; "
          f"run folder {out}", flush=True)
    run = Run(tasks, out, budget, sys.executable, env, destination, pci, cores)
    try:
        while run.step():
            time.sleep(0.5)
    except KeyboardInterrupt:
        for task in tasks:
            if task.status == "running":
                task.launch.end()
                run._end(task, "stopped (Ctrl-C)")
    text = summary(tasks, found["device"], run.elapsed(), budget, destination, out,
                   counted=not pci or gpu_processes(pci) is not None)
    (out / "summary.txt").write_text(text + "\n")
    print("\n" + text)
    return 0 if all(t.ready or t.status == "done" for t in tasks) else 1


if __name__ == "__main__":
    sys.exit(main())
