"""The notebooks' times: one measured table (benchmarks/results/notebook_times.csv), read by the README, the
instructor guide and every notebook's "Time" line; the timing run that fills it; the other work it notices."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path

import pytest

from course_utils import config
from course_utils.observe import other_work
from course_utils.tooling import notebook_times, time_lines
from course_utils.tooling.notebook_times import NotebookTime

ROOT = config.checkout_root()


def row(notebook="07_ddp", size="ci", machine="2-core AMD EPYC, no GPU", gpus=0, seconds=780.0, other_load=1.2,
        date="2026-11-27") -> NotebookTime:
    return NotebookTime(notebook=notebook, size=size, machine=machine, gpus=gpus, cpu_cores=2, seconds=seconds,
                        other_load=other_load, busy=notebook_times.busy(other_load), date=date, commit="abc1234",
                        torch="2.14.1", torchvision="0.29.1", python="3.11.2", runtime="", code="c0de")


def test_durations_read_as_people_say_them():
    assert [time_lines.duration(s) for s in (9.7, 59.4, 60, 104, 599, 780, 3600, 3900)] == [
        "10 s", "59 s", "1 min", "1 min 44 s", "9 min 59 s", "13 min", "1 h 0 min", "1 h 5 min"]


def test_a_new_measurement_replaces_its_own_row_and_keeps_the_others(tmp_path):
    table = tmp_path / "notebook_times.csv"
    gpu = row(size="workshop", machine="1 x NVIDIA H100 80GB HBM3, 16-core host", gpus=1, seconds=300, other_load=0.0)
    notebook_times.record([row(), gpu, row(notebook="09_sharding_and_memory")], table)
    notebook_times.record([row(seconds=700.0, other_load=None)], table)
    rows = notebook_times.read(table)
    assert len(rows) == 3 and gpu in rows and row(notebook="09_sharding_and_memory") in rows
    again = next(found for found in rows if found.key == row().key)
    assert (again.seconds, again.other_load, again.busy) == (700.0, None, "unknown")


def test_a_cpu_row_is_never_read_as_a_gpu_row():
    cpu_workshop = row(size="workshop")
    assert notebook_times.measured([cpu_workshop], "07_ddp", "workshop", on_gpus=True) is None
    assert time_lines.readme_cell([cpu_workshop], "07_ddp") == "not yet measured / not yet measured"
    line = time_lines.time_line([cpu_workshop], "07_ddp")
    assert "13 min at the `workshop` size (2-core AMD EPYC, no GPU" in line
    assert "at the `workshop` size on GPUs not yet measured" in line


def test_each_slot_shows_its_newest_row_and_whether_the_machine_was_busy():
    rows = [row(seconds=900, date="2026-11-20"), row(machine="8-core laptop, no GPU", seconds=200, other_load=0.1,
                                                     date="2026-11-27")]
    assert time_lines.readme_cell(rows, "07_ddp") == "3 min 20 s / not yet measured"
    line = time_lines.time_line(rows, "07_ddp")
    assert "15 min at the `ci` size (2-core AMD EPYC, no GPU; busy: other work used 1.2 of its 2 cores)" in line
    assert "3 min 20 s at the `ci` size (8-core laptop, no GPU)" in line
    assert time_lines.readme_cell([row()], "07_ddp") == "13 min (busy) / not yet measured"
    assert [notebook_times.busy(load) for load in (0.49, 0.5, None)] == ["no", "yes", "unknown"]


def test_a_broken_table_names_the_fix(tmp_path):
    table = tmp_path / "notebook_times.csv"
    table.write_text("notebook,size,seconds\n07_ddp,ci,780\n")
    with pytest.raises(ValueError, match="lacks the columns machine, gpus"):
        notebook_times.read(table)
    table.unlink()
    notebook_times.record([row()], table)
    table.write_text(table.read_text().replace("780.0", "thirteen minutes"))
    with pytest.raises(ValueError, match="line 2: .*measure that notebook again"):
        notebook_times.read(table)


def test_the_readme_the_guide_and_every_notebook_say_what_the_table_says(capsys):
    assert time_lines.main(["--check"]) == 0, capsys.readouterr().out  # names each file and the command


def test_the_table_has_a_measured_ci_row_for_every_notebook():
    rows = notebook_times.read()
    for notebook in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert notebook_times.measured(rows, notebook.stem, "ci", on_gpus=False), f"{notebook.stem} has no ci row"


def _copy_of_the_texts(tmp_path: Path) -> Path:
    for name in ("README.md", "docs/instructor.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return tmp_path


def test_a_new_figure_makes_the_texts_disagree_until_they_are_written_again(tmp_path):
    root = _copy_of_the_texts(tmp_path)
    rows = notebook_times.read()
    time_lines.rewrite(root, rows)  # as the checkout should be (the test above checks that it is)
    assert time_lines.disagreeing(root, rows) == []
    code = notebook_times.code_digest(root / "notebooks/07_ddp.ipynb")  # timed on the notebook as it is
    later = (date.fromisoformat(max(measured.date for measured in rows)) + timedelta(days=1)).isoformat()
    changed = notebook_times.merged(rows, [replace(row(seconds=4321.0, date=later), code=code), replace(row(
        size="workshop", machine="2 x AMD Instinct MI250X, 14-core host", gpus=2, seconds=610, other_load=0.0,
        date=later), code=code)])  # measured after every row of the table
    stale = {str(path.relative_to(root)) for path in time_lines.disagreeing(root, changed)}
    assert {"README.md", "docs/instructor.md", "notebooks/07_ddp.ipynb"} <= stale
    before = json.loads((root / "notebooks/07_ddp.ipynb").read_text())
    time_lines.rewrite(root, changed)
    assert time_lines.disagreeing(root, changed) == []
    after = json.loads((root / "notebooks/07_ddp.ipynb").read_text())
    assert after["cells"][1:] == before["cells"][1:]  # only the first cell's Time paragraph changed
    first = " ".join("".join(after["cells"][0]["source"]).split())  # the paragraph is wrapped
    assert "1 h 12 min at the `ci` size" in first and "10 min at the `workshop` size (2 x AMD Instinct" in first
    assert "On one GPU or one LUMI GCD its ranks run as CPU processes" in first  # the note after it stays
    readme = (root / "README.md").read_text()
    assert "| 1 h 12 min (busy) / 10 min |" in readme
    assert "`workshop`, 2 x AMD Instinct MI250X, 14-core host" in (root / "docs/instructor.md").read_text()


def test_rows_of_a_notebook_that_does_not_exist_are_refused(tmp_path):
    root = _copy_of_the_texts(tmp_path)
    with pytest.raises(ValueError, match="rows of 99_no_such_notebook, which notebooks/ does not have"):
        time_lines.written(root, [row(notebook="99_no_such_notebook")])


def test_a_notebook_missing_from_the_readme_table_is_named(tmp_path):
    root = _copy_of_the_texts(tmp_path)
    readme = root / "README.md"
    readme.write_text("\n".join(line for line in readme.read_text().split("\n") if not line.startswith("| 11 |")))
    with pytest.raises(ValueError, match="no row for notebook\\(s\\) 11"):
        time_lines.written(root, [])


def _cpu_seconds_of(pid: int) -> float:
    """utime + stime of a running process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not other_work.PROC_STAT.exists(), reason="reads /proc (Linux)")
def test_a_process_beside_the_measured_work_counts_as_other_work():
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        before = _cpu_seconds_of(loop.pid)
        watch = other_work.OtherWork()
        time.sleep(2)
        used = _cpu_seconds_of(loop.pid) - before
        other = watch.cpu_seconds()
    finally:
        loop.kill()
        loop.wait()
    assert used > 0.2, "the busy loop barely ran: the test measured nothing"
    assert other >= used - 0.1, f"a loop that used {used:.2f} s of CPU beside the work, but only {other:.2f} s counted"


@pytest.mark.skipif(not other_work.PROC_STAT.exists(), reason="reads /proc (Linux)")
def test_the_work_of_ended_children_and_grandchildren_is_the_measured_work():
    # As a notebook's kernel starts torchrun, which starts the ranks: the grandchild burns CPU and reports it.
    grandchild = ("import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
                  "print(time.process_time())")
    child = f"import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', {grandchild!r}], " \
            "capture_output=True, text=True, check=True).stdout)"
    own_before = other_work._own_seconds()
    burned = float(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
    assert other_work._own_seconds() - own_before >= burned - 0.02


def _timing_script():
    spec = importlib.util.spec_from_file_location("notebook_times_script", ROOT / "benchmarks" / "notebook_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _notebook(path: Path, title: str, code: str) -> None:
    path.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "id": "title", "metadata": {},
         "source": [f"# {title}\n", "\n", "**Time**: to be measured"]},
        {"cell_type": "code", "id": "work", "metadata": {}, "execution_count": None, "outputs": [], "source": [code]}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n")


@pytest.mark.slow
def test_the_timing_run_records_what_ran_and_nothing_of_what_failed(tmp_path, monkeypatch, capsys):
    (tmp_path / "notebooks").mkdir()
    _notebook(tmp_path / "notebooks/00_quick.ipynb", "00 · Quick: one second", "import time\ntime.sleep(1)")
    _notebook(tmp_path / "notebooks/01_broken.ipynb", "01 · Broken: a typo", "import tiime")
    (tmp_path / "README.md").write_text("| # | notebook | time |\n| --- | --- | --- |\n| 00 | quick | ? |\n"
                                        "| 01 | broken | ? |\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/instructor.md").write_text(f"# Guide\n\n{time_lines.BEGIN}\n{time_lines.END}\n")
    monkeypatch.setattr(config, "checkout_root", lambda: tmp_path)
    monkeypatch.setenv("COURSE_SIZE", "ci")

    assert _timing_script().main(["--size", "ci", "--machine", "test machine"]) == 1
    assert "01_broken FAILED, nothing recorded" in capsys.readouterr().out
    rows = notebook_times.read(tmp_path / "benchmarks/results/notebook_times.csv")
    assert [(found.notebook, found.size, found.machine) for found in rows] == [("00_quick", "ci", "test machine")]
    assert rows[0].seconds >= 1 and rows[0].busy in ("yes", "no")
    assert time_lines.disagreeing(tmp_path) == []
    readme = (tmp_path / "README.md").read_text()
    assert "| 00 | quick | " in readme and "| 01 | broken | not yet measured / not yet measured |" in readme


def test_a_row_timed_on_older_code_cells_says_so_in_every_text_and_prose_alone_changes_nothing(tmp_path):
    """The table's rows were measured many commits before 01, 07, 09 and 11 were rewritten, and nothing said so:
    each row keeps the digest of the code cells it timed, and a figure whose notebook's code changed since is
    marked, in the README, the guide and the notebook's own Time line."""
    notebook = tmp_path / "07_ddp.ipynb"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# 07 · DDP\n", "\n", "**Time**: x"]},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": ["print(1)\n"]}]
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    timed = replace(row(seconds=200.0, other_load=0.0), code=notebook_times.code_digest(notebook))
    now = {"07_ddp": notebook_times.code_digest(notebook)}
    assert time_lines.readme_cell([timed], "07_ddp", now) == "3 min 20 s / not yet measured"
    cells[0]["source"][-1] = "**Time**: rewritten, and a new paragraph"  # prose: the same code
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert notebook_times.code_digest(notebook) == now["07_ddp"]
    cells[1]["source"] = ["print(2)\n"]  # the code the figure timed is gone
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    now = {"07_ddp": notebook_times.code_digest(notebook)}
    assert time_lines.readme_cell([timed], "07_ddp", now) == "3 min 20 s (older code) / not yet measured"
    assert "timed before its code cells last changed, measure it again" in time_lines.time_line([timed], "07_ddp", now)
    assert "3 min 20 s (older code)" in time_lines.guide_section([timed], [notebook], now)
