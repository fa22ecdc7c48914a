"""Notebook 12: the hangs launched for real (a late rank, mismatched collectives), what each rank said and where it
stood, a straggler made on purpose and each rank's step drawn by its parts, and the check of the exercise's fixed
script.

Each launch is bounded twice: the script's process-group timeout turns the hang into an error, and the launch's
own limit ends every process should the script not stop by itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure

from course_utils.doctor import hangs
from course_utils.doctor.stragglers import WARMUP_STEPS
from course_utils.doctor.timed_ranks import PARTS, RECORD
from course_utils.parallel.launch import LaunchResult, last_lines, launch
from course_utils.tooling.exercises import Check, judge_launch

RANKS = 2
FLIGHT_RECORD_ENTRIES = "200"
LAUNCH_MARGIN_SECONDS = 90.0  # the launch's limit beyond the script's own timeout: start-up on a busy machine
ERROR_LINE = re.compile(r"(?:\w+Error|what\(\)):\s*(?P<text>.+)")
# DETAIL's fingerprints spell out every tensor option; what tells the mismatch is the operation and the shape
TENSOR_OPTIONS = re.compile(r", TensorDeviceTypes=TensorOptions\(.*?memory_format=\([^)]*\)\)")
SAID_CHARACTERS = 400
DOCTOR_SECONDS = 120.0
STANDING = "standing:"  # what a rank of the lesson's scripts prints just before its fault
SETTLE_SECONDS = 1.0
@dataclass
class Hang:
    """One launch of a hanging script: how long it took, how it ended, what each rank said, and what a look at
    its ranks found while they stood at their fault."""

    seconds: float
    result: LaunchResult | None
    limit_error: str = ""  # the launch's own time limit, when the script did not end by itself
    looked: object = None  # what the look returned (None: no look, or the ranks were gone before it)
    flight_record: pd.DataFrame = field(default_factory=pd.DataFrame)

    def said(self) -> pd.DataFrame:
        """Rank -> the first error line it printed (gloo's, or PyTorch's), and where its traceback ended."""
        rows = []
        for rank, text in sorted((self.result.rank_logs if self.result else {}).items()):
            errors = [TENSOR_OPTIONS.sub("", match["text"]).strip() for line in text.splitlines()
                      if (match := ERROR_LINE.search(line))]
            calls = re.findall(r'File "[^"]*?([^/"]+\.py)", line (\d+), in <module>\n\S*\s+(.+)', text)
            rows.append({"rank": rank, "its error": errors[0][:SAID_CHARACTERS] if errors else "(none)",
                         "its script's line": f"{calls[-1][0]}:{calls[-1][1]}  {calls[-1][2].strip()}" if calls
                         else ""})
        return pd.DataFrame(rows).set_index("rank") if rows else pd.DataFrame()


def _standing(log_dir: Path) -> Callable[[], bool]:
    """Whether every rank printed "standing:" at least :data:`SETTLE_SECONDS` ago: each then stands in its fault
    (one that had just printed may not have entered its collective yet), as when a learner looks."""
    first_seen: list[float] = []

    def ready() -> bool:
        if sum(STANDING in line for line in last_lines(log_dir).values()) < RANKS:
            return False
        first_seen[:] = first_seen or [time.monotonic()]
        return time.monotonic() - first_seen[0] >= SETTLE_SECONDS
    return ready


def stacks(launcher: int) -> dict[int, str]:
    """Rank -> its Python stack, read by py-spy from outside, as a learner does in a second terminal."""
    return {rank: hangs.python_stack(pid) for rank, pid in hangs.rank_pids(launcher).items()}


def doctor_command(log: Path | None = None, looks: int | None = None) -> Callable[[int], str]:
    """A look that runs ``python -m course_utils.doctor --pid LAUNCHER [--log LOG] [--looks N]`` and returns its
    screen."""
    def run(launcher: int) -> str:
        flags = (["--log", str(log)] if log else []) + (["--looks", str(looks)] if looks else [])
        done = subprocess.run([sys.executable, "-m", "course_utils.doctor", "--pid", str(launcher), *flags],
                              capture_output=True, text=True, timeout=DOCTOR_SECONDS)
        return f"$ python -m course_utils.doctor --pid {launcher} {' '.join(flags)}".rstrip() + "\n" + (
            done.stdout + done.stderr).strip()
    return run


def launch_hang(script: Path, *args: str, folder: Path, timeout_seconds: float, detail: bool = False,
                look: Callable[[int], object] | None = None) -> Hang:
    """Launch ``script *args RECORDS TIMEOUT`` on two gloo ranks with Flight Recorder on, each rank writing its
    record under ``folder/flight_record`` (and ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` when ``detail``); with ``look``,
    call it with torchrun's pid while every rank stands at its fault (it printed "standing:")."""
    folder = Path(folder)
    records, log_dir = folder / "flight_record", folder / "logs"
    for old in records.glob(f"{hangs.FLIGHT_RECORD_PREFIX}*"):
        old.unlink()
    env = {hangs.FLIGHT_RECORD_VARIABLE: FLIGHT_RECORD_ENTRIES,
           "TORCH_DISTRIBUTED_DEBUG": "DETAIL" if detail else "OFF"}

    def start() -> LaunchResult:
        return launch(RANKS, str(script), *args, str(records), str(timeout_seconds), log_dir=log_dir, echo=False,
                      env=env, timeout_seconds=timeout_seconds + LAUNCH_MARGIN_SECONDS)

    began = time.perf_counter()
    looked = hangs.beside(start, look or (lambda launcher: None), _standing(log_dir))
    outcome = looked.outcome
    return Hang(time.perf_counter() - began, outcome if isinstance(outcome, LaunchResult) else None,
                "" if isinstance(outcome, LaunchResult) else str(outcome), looked.found,
                hangs.last_collectives(records))


# The exercise: a script that leaves out a bad batch on the rank that drew it, and so hangs.
LOSS_LIMIT = 10.0


def judge_skipped_batches(folder: Path) -> Check:
    """Done when every rank wrote its result, they left out the same steps, those are exactly the steps where some
    rank's loss was over the limit (none left out is not a fix: the corrupt batch was trained on), and their weights
    are the same."""
    files = sorted(Path(folder).glob("rank*.pt"))
    if len(files) < RANKS:
        return Check(False, f"{len(files)} of {RANKS} ranks wrote their result: did the script's last lines change?")
    results = [torch.load(path, weights_only=True) for path in files]
    bad = sorted({step for result in results for step, loss in enumerate(result["losses"]) if loss > LOSS_LIMIT})
    skipped = [list(result["skipped"]) for result in results]
    weights = [result["weights"] for result in results]
    same_weights = all(torch.equal(one[name], weights[0][name]) for one in weights[1:] for name in one)
    if any(steps != skipped[0] for steps in skipped) and same_weights:
        return Check(False, f"the ranks left out different steps ({'; '.join(map(str, skipped))}) yet ended with the "
                            "same weights: their collectives stayed in step, but a rank that did not mark the bad "
                            "step trained on its batch of it (a zeroed gradient still averages the others' in, at "
                            "half the weight). Leave a bad batch out on every rank together: agree on the decision "
                            "first.")
    if any(steps != skipped[0] for steps in skipped):
        return Check(False, f"the ranks left out different steps ({'; '.join(map(str, skipped))}): each still decides "
                            "alone. The ranks must agree on the decision before any of them acts on it.")
    if skipped[0] != bad:
        return Check(False, f"the ranks left out steps {skipped[0]}, but some rank's loss was over {LOSS_LIMIT:g} at "
                            f"steps {bad}: keep leaving out a bad batch, on every rank together.")
    if not same_weights:
        return Check(False, "the ranks agree on the steps left out, but their weights differ: each rank must average "
                            "the same gradients every step it trains.")
    return Check(True, f"both ranks left out step(s) {bad}, where a rank's loss was over {LOSS_LIMIT:g}, and ended "
                       "with the same weights. The hang came from a decision one rank took alone: it left out its "
                       "all-reduces, so the others waited in theirs. Agreeing first (an all-reduce of the flag with "
                       "MAX) keeps every rank's collectives in step.")


BAD_RANKS = (1, 0)  # the check's two launches: the corrupt sample on rank 1 (as the lesson runs it), then on rank 0


def _check_one(script: Path, folder: Path, bad_rank: int, timeout_seconds: float) -> Check:
    """One launch of the learner's ``script`` with the corrupt sample on ``bad_rank``, into ``folder``, judged."""
    folder.mkdir(parents=True, exist_ok=True)
    records = folder / "flight_record"

    def start() -> LaunchResult:
        try:
            return launch(RANKS, str(script), str(folder), str(records), str(timeout_seconds), str(bad_rank),
                          log_dir=folder.parent / f"logs-bad-on-rank-{bad_rank}",
                          env={hangs.FLIGHT_RECORD_VARIABLE: FLIGHT_RECORD_ENTRIES},
                          timeout_seconds=timeout_seconds + LAUNCH_MARGIN_SECONDS)
        except TimeoutError as error:
            print(error)
            return LaunchResult(returncode=-1)

    check = judge_launch(folder, start, judge_skipped_batches)
    recorded = hangs.last_collectives(records)
    if not check.done and not recorded.empty:
        print(f"each rank's Flight Recorder:\n{recorded.to_string()}\n")
    return check


def check_skipped_batches(script: Path, folder: Path, timeout_seconds: float = 10.0) -> Check:
    """The exercise's check: launch the learner's ``script`` twice, the corrupt sample on rank 1 and then on rank 0
    (a fix that lets the rank that drew it decide for all passes the first only), each into a folder of ``folder``
    (an earlier attempt's results and records removed first) with a short process-group timeout and Flight
    Recorder on, and judge the results only when every rank ended cleanly; after a failed launch, show each rank's
    last collectives, the evidence to read."""
    for bad_rank in BAD_RANKS:
        check = _check_one(Path(script), Path(folder) / f"bad-on-rank-{bad_rank}", bad_rank, timeout_seconds)
        if not check.done:
            return Check(False, f"with the corrupt sample on rank {bad_rank}: {check.text}")
    return Check(True, f"with the corrupt sample on rank 1, then on rank 0: {check.text}")


def launch_straggler(ranks: int, out: Path, slow_rank: int | None = None, delay_ms: float = 80.0, steps: int = 20,
                     alike_steps: int = 0, timeout_seconds: float = 180) -> LaunchResult:
    """Launch :mod:`course_utils.doctor.timed_ranks` on ``ranks`` ranks for ``alike_steps`` steps alike, then
    ``steps`` with ``slow_rank``'s loader slowed by ``delay_ms`` per batch, within ``timeout_seconds``; records a
    previous launch left in ``out`` are removed first, and a failed launch raises with the end of its output."""
    out = Path(out)
    for old in out.glob(RECORD.format(rank="*")):
        old.unlink()
    flags = ["--steps", str(alike_steps + steps), "--slow-from", str(alike_steps), "--delay-ms", str(delay_ms),
             "--out", str(out)]
    if slow_rank is not None:
        flags += ["--slow-rank", str(slow_rank)]
    result = launch(ranks, "course_utils.doctor.timed_ranks", *flags, log_dir=out.parent / f"{out.name}-logs",
                    echo=False, timeout_seconds=timeout_seconds, env={"OMP_NUM_THREADS": "1"})
    if not result.ok:
        raise RuntimeError(f"the timed ranks failed (exit {result.returncode}):\n" + "\n".join(result.lines[-15:]))
    return result


def plot_rank_steps(table: pd.DataFrame, title: str, warmup: int = WARMUP_STEPS) -> Figure:
    """Each rank's median step, split into data, compute and the all-reduce (where the early ranks wait)."""
    medians = table[table["step"] >= warmup].groupby("rank")[list(PARTS)].median() * 1000
    fig, axis = plt.subplots(figsize=(9, 0.9 + 0.4 * len(medians)))
    start = pd.Series(0.0, index=medians.index)
    for part, label, color in zip(PARTS, ("waiting for data", "computing", "in the all-reduce (waiting, then "
                                                                         "moving bytes)"),
                                  ("#dd8452", "#4c72b0", "#c44e52")):
        axis.barh([f"rank {rank}" for rank in medians.index], medians[part], left=start, label=label, color=color)
        start += medians[part]
    axis.invert_yaxis()
    axis.set(xlabel="milliseconds per step (median)", title=title)
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return fig
