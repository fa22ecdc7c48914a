"""No notebook: what the README's table, the instructor guide and each notebook's "Time" line say about how
long the notebooks take, written from the measured table (:mod:`course_utils.tooling.notebook_times`).

    python -m course_utils.tooling.time_lines            # rewrite the three from the table
    python -m course_utils.tooling.time_lines --check    # name what disagrees with the table; exit 1 if any

``benchmarks/notebook_times.py`` rewrites them after each timing run; a test fails while they disagree.
The README shows each notebook's newest `ci` time on a machine without GPU and its newest `workshop` time on
GPUs; the guide every size and machine measured; a notebook every row of its own. A figure whose row timed other
code cells than the notebook has now is marked "(older code)" (:func:`notebook_times.stale`).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from course_utils import config
from course_utils.atomic_files import write_text_atomic
from course_utils.tooling import notebook_times
from course_utils.tooling.notebook_times import NotebookTime

NOT_MEASURED = "not yet measured"
COMMAND = "python -m course_utils.tooling.time_lines"
BEGIN = f"<!-- written from benchmarks/results/notebook_times.csv by `{COMMAND}`: edit the table, not this -->"
END = "<!-- end of the written times -->"
README_HEADER = "time (`ci` without GPU / `workshop` on GPUs)"
# The two columns every notebook should have: the size CI runs on a machine without GPU, and the workshop's.
WANTED = (("ci", False), ("workshop", True))


def duration(seconds: float) -> str:
    """Seconds as a reader says them: 42 s, 3 min 5 s, 13 min, 1 h 5 min."""
    if seconds < 59.5:
        return f"{round(seconds)} s"
    if seconds < 599.5:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


OLDER_CODE = "older code"  # a figure timed on code cells the notebook has changed since


def figure(row: NotebookTime | None, code_now: dict[str, str] | None = None) -> str:
    if row is None:
        return NOT_MEASURED
    marks = [mark for mark, holds in (("busy", row.busy == "yes"),
                                      (OLDER_CODE, notebook_times.stale(row, code_now or {}))) if holds]
    return duration(row.seconds) + (f" ({', '.join(marks)})" if marks else "")


def readme_cell(rows: list[NotebookTime], notebook: str, code_now: dict[str, str] | None = None) -> str:
    return " / ".join(figure(notebook_times.measured(rows, notebook, size, gpus), code_now) for size, gpus in WANTED)


def _wanted_name(size: str, on_gpus: bool) -> str:
    return f"at the `{size}` size " + ("on GPUs" if on_gpus else "without GPU")


def _load(row: NotebookTime) -> str:
    if row.busy == "yes":
        return f"; busy: other work used {row.other_load:.1f} of its {row.cpu_cores} cores"
    return "; other work on it not measured" if row.busy == "unknown" else ""


def _older(row: NotebookTime, code_now: dict[str, str] | None) -> str:
    return ("; timed before its code cells last changed, measure it again" if notebook_times.stale(row, code_now or {})
            else "")


def time_line(rows: list[NotebookTime], notebook: str, code_now: dict[str, str] | None = None) -> str:
    """The notebook's "**Time**:" paragraph: each of its rows (said when it timed older code), and the wanted
    sizes never measured."""
    own = sorted((row for row in rows if row.notebook == notebook),
                 key=lambda row: (row.size != "ci", row.on_gpus, row.machine))
    parts = [f"{duration(row.seconds)} at the `{row.size}` size ({row.machine}{_load(row)}{_older(row, code_now)})"
             for row in own]
    for size, on_gpus in WANTED:
        if notebook_times.measured(rows, notebook, size, on_gpus) is None:
            parts.append(f"{_wanted_name(size, on_gpus)} {NOT_MEASURED}")
    return ("**Time**: " + "; ".join(parts) + ". Every cell, from the kernel's start to its end, timed by "
            "`benchmarks/notebook_times.py`; the instructor guide lists every machine's times.")


def _title(notebook: Path) -> str:
    """``# 07 · DistributedDataParallel: one process per GPU`` gives "07 DistributedDataParallel"."""
    heading = json.loads(notebook.read_text())["cells"][0]["source"][0]
    name = heading.split("·", 1)[-1].split(":", 1)[0].strip()
    return f"{notebook.stem[:2]} {name}"


def _columns(rows: list[NotebookTime]) -> list[tuple[str, bool, str | None]]:
    """(size, on GPUs, machine) of every measured column, and a machine-less one for each wanted column that
    no row fills."""
    measured = sorted({(row.size, row.on_gpus, row.machine) for row in rows},
                      key=lambda column: (column[0] != "ci", column[1], column[2]))
    missing = [(size, gpus, None) for size, gpus in WANTED if not any(c[:2] == (size, gpus) for c in measured)]
    return sorted(measured + missing, key=lambda column: (column[0] != "ci", column[1]))


def _column_note(rows: list[NotebookTime], size: str, machine: str) -> str:
    mine = [row for row in rows if (row.size, row.machine) == (size, machine)]
    dates = sorted({row.date for row in mine})
    commits = ", ".join(sorted({row.commit for row in mine}))
    kinds = sorted({f"torch {row.torch}, torchvision {row.torchvision}, Python {row.python}"
                    + (f", {row.runtime}" if row.runtime else "") for row in mine})
    loads = [row.other_load for row in mine if row.busy == "yes"]
    busy = (f"; (busy) on {len(loads)} of its {len(mine)} notebooks: other processes used {min(loads):.1f} to "
            f"{max(loads):.1f} of its {mine[0].cpu_cores} cores on average while they ran" if loads else
            "; no other work measured on it" if all(row.busy == "unknown" for row in mine) else "; not busy")
    return (f"- `{size}`, {machine}: {' to '.join([dates[0], dates[-1]] if len(dates) > 1 else dates)}, "
            f"commit {commits}, {'; '.join(kinds)}{busy}.")


def guide_section(rows: list[NotebookTime], notebooks: list[Path], code_now: dict[str, str] | None = None) -> str:
    """The instructor guide's table of every notebook in every measured size and machine, with its notes; a
    figure timed on older code cells than the notebook's now is marked so."""
    columns = _columns(rows)
    header = ["notebook"] + [f"`{size}`, {machine}" if machine else f"`{size}` {'on GPUs' if gpus else 'without GPU'}"
                             for size, gpus, machine in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for notebook in notebooks:
        cells = [_title(notebook)]
        for size, _gpus, machine in columns:
            found = [row for row in rows if (row.notebook, row.size, row.machine) == (notebook.stem, size, machine)]
            cells.append(figure(found[0] if found else None, code_now))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [_column_note(rows, size, machine) for size, _gpus, machine in columns if machine]
    return "\n".join([BEGIN, "", *lines, "", *(notes + [""] if notes else []), END])


def _readme(text: str, rows: list[NotebookTime], notebooks: list[Path], code_now: dict[str, str]) -> str:
    """The README's notebook table (its header starts ``| # | notebook |``) with each row's last cell written."""
    stems = {notebook.stem[:2]: notebook.stem for notebook in notebooks}
    lines = text.split("\n")
    header = next((index for index, line in enumerate(lines) if line.startswith("| # | notebook |")), None)
    if header is None:
        raise ValueError("the README has no notebook table (a header that starts with '| # | notebook |')")
    lines[header] = f"{lines[header][:-1].rstrip().rpartition('|')[0]}| {README_HEADER} |"
    seen, index = set(), header + 2
    while index < len(lines) and lines[index].startswith("| "):
        number = lines[index][2:4]
        if number in stems:
            seen.add(number)
            cell = readme_cell(rows, stems[number], code_now)
            lines[index] = f"{lines[index][:-1].rstrip().rpartition('|')[0]}| {cell} |"
        index += 1
    unlisted = sorted(set(stems) - seen)
    if unlisted:
        raise ValueError(f"the README's notebook table has no row for notebook(s) {', '.join(unlisted)}: add one")
    return "\n".join(lines)


def _guide(text: str, rows: list[NotebookTime], notebooks: list[Path], code_now: dict[str, str]) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"docs/instructor.md lacks the lines that frame the written times: {BEGIN} ... {END}")
    return text[:start] + guide_section(rows, notebooks, code_now) + text[end + len(END):]


def _notebook(text: str, rows: list[NotebookTime], stem: str, code_now: dict[str, str]) -> str:
    notebook = json.loads(text)
    cell = notebook["cells"][0]
    paragraphs = "".join(cell["source"]).split("\n\n")
    found = [index for index, paragraph in enumerate(paragraphs) if paragraph.startswith("**Time**:")]
    if cell["cell_type"] != "markdown" or len(found) != 1:
        raise ValueError(f"notebooks/{stem}.ipynb: its first cell needs one paragraph that starts with **Time**:")
    paragraphs[found[0]] = textwrap.fill(time_line(rows, stem, code_now), width=110, break_long_words=False,
                                         break_on_hyphens=False)
    cell["source"] = "\n\n".join(paragraphs).splitlines(keepends=True)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def written(root: Path | None = None, rows: list[NotebookTime] | None = None) -> dict[Path, str]:
    """Each file that states the times, with the text the table gives it."""
    root = root or config.checkout_root()
    rows = notebook_times.read(root / "benchmarks" / "results" / notebook_times.TABLE) if rows is None else rows
    notebooks = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    unknown = sorted({row.notebook for row in rows} - {notebook.stem for notebook in notebooks})
    if unknown:
        raise ValueError(f"{notebook_times.TABLE} has rows of {', '.join(unknown)}, which notebooks/ does not "
                         "have: remove those rows")
    code_now = {notebook.stem: notebook_times.code_digest(notebook) for notebook in notebooks}
    texts = {root / "README.md": _readme((root / "README.md").read_text(), rows, notebooks, code_now),
             root / "docs" / "instructor.md": _guide((root / "docs" / "instructor.md").read_text(), rows, notebooks,
                                                     code_now)}
    for notebook in notebooks:
        texts[notebook] = _notebook(notebook.read_text(), rows, notebook.stem, code_now)
    return texts


def disagreeing(root: Path | None = None, rows: list[NotebookTime] | None = None) -> list[Path]:
    """The files whose times differ from the table's."""
    return [path for path, text in written(root, rows).items() if path.read_text() != text]


def rewrite(root: Path | None = None, rows: list[NotebookTime] | None = None) -> list[Path]:
    """Write the table's times into every file that states them; return the files changed."""
    changed = []
    for path, text in written(root, rows).items():
        if path.read_text() != text:
            write_text_atomic(path, text)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file disagrees")
    args = parser.parse_args(argv)
    root = config.checkout_root()
    if args.check:
        stale = disagreeing(root)
        for path in stale:
            print(f"{path.relative_to(root)} disagrees with benchmarks/results/{notebook_times.TABLE}: run {COMMAND}")
        return 1 if stale else 0
    for path in rewrite(root):
        print(f"rewrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
