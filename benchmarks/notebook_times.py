"""How long does each notebook take, on this machine, at a given size?

Runs every notebook (or those named) top to bottom in a fresh kernel with nbclient, as the tests' nbval
does (``COURSE_INTERACTIVE=0``: no TensorBoard server or live widget; every cell, solutions included), with
``COURSE_SIZE`` set, and times it from the kernel's start to its end. Meanwhile it measures how much CPU
other processes used: a time taken while other work shared the machine is marked busy. Each notebook's row
goes into ``results/notebook_times.csv`` as soon as it has run (replacing the row of the same notebook, size
and machine, keeping every other), and at the end the README's table, the instructor guide and the
notebooks' "Time" lines are written from the table. A notebook that fails records nothing.

    python benchmarks/notebook_times.py [--size ci|workshop] [--machine LABEL] [07_ddp 09 ...]

``--machine`` names the machine instead of the description made from its CPU and GPUs (e.g.
"LUMI-G, 2 GCDs (Jupyter app)"). Prepare the size's data first (``python -m data_prep --size SIZE``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from course_utils import config
from course_utils.observe.other_work import OtherWork
from course_utils.tooling import notebook_times, time_lines
from course_utils.tooling.notebook_times import NotebookTime


def chosen(names: list[str], folder: Path) -> list[Path]:
    """The notebooks ``names`` designate (a file name, a stem or its number), or every notebook."""
    notebooks = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return notebooks
    found = []
    for name in names:
        matching = [notebook for notebook in notebooks if name in (notebook.name, notebook.stem, notebook.stem[:2])]
        if not matching:
            raise SystemExit(f"no notebook {name!r} in {folder}: give a number (07), a name (07_ddp) or a file name")
        found += matching
    return found


def run(notebook: Path, cell_timeout: float) -> float:
    """Seconds to run ``notebook`` in a new kernel, from its start to its end; raises on a failing cell."""
    client = NotebookClient(nbformat.read(notebook, as_version=4), timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})
    start = time.monotonic()
    client.execute()
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="numbers or names; every notebook when none")
    parser.add_argument("--size", choices=("ci", "workshop"), default=config.active_size_name())
    parser.add_argument("--machine", help="name this machine in the table instead of describing its CPU and GPUs")
    parser.add_argument("--cell-timeout", type=float, default=3600, help="seconds one cell may run")
    args = parser.parse_args(argv)

    root = config.checkout_root()
    table = root / "benchmarks" / "results" / notebook_times.TABLE
    os.environ.update(COURSE_SIZE=args.size, COURSE_INTERACTIVE="0")  # the kernels inherit both
    machine, gpus, cores = notebook_times.this_machine(args.machine)
    commit, versions = notebook_times.course_commit(), notebook_times.versions(gpus)
    failed = []
    for notebook in chosen(args.notebooks, root / "notebooks"):
        print(f"{notebook.stem} at {args.size} on {machine} ...", flush=True)
        watch = OtherWork()
        try:
            seconds = run(notebook, args.cell_timeout)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as error:
            failed.append(notebook.stem)
            print(f"{notebook.stem} FAILED, nothing recorded:\n{str(error)[-3000:]}", flush=True)
            continue
        other = watch.cores()
        notebook_times.record([NotebookTime(
            notebook=notebook.stem, size=args.size, machine=machine, gpus=gpus, cpu_cores=cores, seconds=seconds,
            other_load=other, busy=notebook_times.busy(other), date=notebook_times.today(), commit=commit,
            code=notebook_times.code_digest(notebook), **versions)], table)
        load = "unknown" if other is None else f"{other:.2f} of {cores} cores"
        print(f"{notebook.stem}: {time_lines.duration(seconds)} ({seconds:.1f} s); other work: {load}", flush=True)
    for path in time_lines.rewrite(root):
        print(f"rewrote {path.relative_to(root)}")
    if failed:
        print(f"failed, not recorded: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
