"""Notebook 08: strong and weak scaling (the same training at 1..N ranks, with speed-up and efficiency), the
large-batch learning rate, the all-reduce's bandwidth, their answers and plots.

Strong scaling keeps the global batch and splits it over more ranks (each does less work per
step); weak scaling keeps the batch per rank (the global batch grows with the ranks). Ideal is a
speed-up equal to the rank count; efficiency is the measured speed-up divided by it.

    python -m course_utils.lessons.scaling --ranks 1 2 4 8 --mode weak -- --model resnet50
    python -m course_utils.lessons.scaling --collect runs/slurm/1234 runs/slurm/1240   # jobs on 1, 2, ... nodes

The first form starts torchrun on this machine for each rank count; the second reads the
``summary.json`` of runs made elsewhere, e.g. the same job script submitted with ``--nodes`` 1, 2, 4.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from course_utils import config
from course_utils.atomic_files import write_text_atomic
from course_utils.experiments.runs import SCRATCH, measured_rate, run_ranks
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import DISTURBED, compare
from course_utils.run_folder import RunFolder
from course_utils.tooling.exercises import Check
from course_utils.train import train
from course_utils.training.options import changed_options
from course_utils.training.resume import NonFiniteLossError

STUDIES = ("strong", "weak")
SCALING_RANKS = {"ci": (1, 2), "workshop": (1, 2, 4, 8)}  # process counts of a study (capped by the devices)
# Each case of the learning-rate study: its epochs and training images (None: the size's own).
LR_STUDY = {"ci": {"epochs": 1, "train_samples": 1280}, "workshop": {"epochs": 5, "train_samples": None}}


def scaling_ranks(size: str | None = None) -> tuple[int, ...]:
    """The process counts of a scaling study at ``size`` (the active size by default)."""
    return SCALING_RANKS[config.get_size(size).name]


def per_rank_batch(mode: str, batch_size: int, ranks: int) -> int:
    """The batch each rank runs: ``batch_size`` is the global batch in strong scaling, the per-rank
    batch in weak scaling."""
    if mode == "weak":
        return batch_size
    if mode != "strong":
        raise ValueError(f"unknown scaling mode {mode!r}; choose one of: {', '.join(STUDIES)}")
    if batch_size % ranks:
        raise ValueError(f"strong scaling splits the global batch {batch_size} over {ranks} ranks: "
                         f"choose a batch size divisible by every rank count")
    return batch_size // ranks


def table(summaries: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per run, ordered by rank count, with speed-up and efficiency against the smallest run."""
    rows = pd.DataFrame([{
        "ranks": s["world_size"],
        "batch_per_rank": s["config"]["batch_size"],
        "global_batch": s["global_batch_size"],
        "images_per_second": s["images_per_second"],
        "steady_iteration_seconds": max(r["steady_iteration_seconds"] for r in s["per_rank"]),
        "wall_seconds": sum(s["epoch_seconds"]),
        "steps": s["steps"],
        "mean_iteration_seconds": sum(s["epoch_seconds"]) / s["steps"],  # as Detectron2 reports s/it: a mean
        "device": s["device"],
        "measured": measured_rate(s),  # iteration by iteration, for the answers' verdicts
        **({"box_ap": s["box_ap"]} if "box_ap" in s else {}),  # a detector's runs: what the speed cost in accuracy
    } for s in summaries]).sort_values("ranks").reset_index(drop=True)
    base = rows.iloc[0]
    rows["speedup"] = rows["images_per_second"] / base["images_per_second"]
    rows["ideal"] = rows["ranks"] / base["ranks"]
    rows["efficiency"] = rows["speedup"] / rows["ideal"]
    return rows


def collect(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """The scaling table of runs already made (each folder holds a ``summary.json``)."""
    return table([RunFolder(folder).read_summary() for folder in run_dirs])


def study(ranks: Sequence[int], mode: str = "weak", out: str | Path | None = None, echo: bool = False,
          reuse: dict[int, str | Path] | None = None, **train_options: Any) -> pd.DataFrame:
    """Train at each rank count with torchrun on this machine and tabulate the throughput.

    ``train_options`` are the training command's options (``batch_size`` is global in strong
    scaling, per rank in weak scaling; it defaults to the course size's batch). ``reuse`` maps a
    rank count to a finished run with the same settings (one rank of a weak study at batch B is the
    one-rank point of a strong study at global batch B), which is read instead of run again.
    """
    batch = train_options.pop("batch_size", None) or config.get_size(train_options.get("size")).batch_size
    out = Path(out or config.runs_dir() / f"scaling-{mode}")
    summaries = []
    for count in tqdm(ranks, desc=f"{mode} scaling", unit="run"):
        if reuse and count in reuse:
            summaries.append(RunFolder(reuse[count]).read_summary())
            continue
        summaries.append(run_ranks(count, out / f"ranks-{count}", echo=echo, **train_options,
                                 batch_size=per_rank_batch(mode, batch, count)).summary)
    return table(summaries)


def lr_scaling(factor: int = 4, out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """The same epochs at the base batch and at ``factor`` times it: with the base learning rate,
    with the rate scaled linearly, and with the scaled rate after a warm-up.

    One process trains the large batch; notebook 07 showed that this is the training DDP does
    with ``factor`` ranks.
    """
    size = config.get_size(options.get("size"))
    batch = options.pop("batch_size", None) or size.batch_size
    lr = options.pop("lr", None) or size.lr
    study = LR_STUDY[size.name]
    epochs = options.setdefault("epochs", study["epochs"])
    options.setdefault("train_samples", study["train_samples"])
    warmup = min(1.0, epochs / 2)  # one epoch, or half of a shorter run
    out = Path(out or config.runs_dir() / "lr-scaling")
    cases = [("base batch", batch, lr, 0.0),
             (f"{factor}x batch, same lr", batch * factor, lr, 0.0),
             (f"{factor}x batch, {factor}x lr", batch * factor, lr * factor, 0.0),
             (f"{factor}x batch, {factor}x lr, {warmup:g} epoch warm-up", batch * factor, lr * factor, warmup)]
    rows = []
    for index, (name, case_batch, case_lr, warmup) in enumerate(tqdm(cases, desc="cases", unit="run")):
        row = {"case": name, "batch": case_batch, "lr": case_lr, "warmup_epochs": warmup, "run": out / f"case-{index}"}
        try:
            summary = train(**{**SCRATCH, **options}, batch_size=case_batch, lr=case_lr,
                            warmup_epochs=warmup, out=row["run"])
        except NonFiniteLossError as error:  # a diverged run is a result of this experiment, not a failure
            rows.append({**row, "status": f"diverged: {error}".split(";")[0]})
            continue
        rows.append({**row, "status": "ok", "steps": summary["steps"], "final_train_loss": summary["final_train_loss"],
                     "test_top1": summary["test_top1"], "test_top5": summary["test_top5"]})
    return pd.DataFrame(rows)


def scaling_answer(tables: dict[str, pd.DataFrame]) -> str:
    """Markdown: how well each study scaled, at its largest rank count."""
    lines = []
    for name, table in tables.items():
        first, last = table.iloc[0], table.iloc[-1]
        speedup = compare(last["measured"], first["measured"], bound=(0, last["ideal"]),
                          why=f"{int(last['ranks'])} ranks do at most {last['ideal']:g}x the work of "
                              f"{int(first['ranks'])}")
        efficiency = ("" if speedup.verdict == DISTURBED else
                      f" ({last['efficiency']:.0%} efficiency, the speed-up over the ideal)")
        lines.append(f"- **{name}**: {int(last['ranks'])} ranks against {int(first['ranks'])}, global batch "
                     f"{int(last['global_batch'])}: {speedup.sentence()}{efficiency}")
    lines.append("- Strong scaling shrinks each rank's batch, so compute per step falls while the all-reduce stays the "
                 "same size: efficiency drops first there. Weak scaling keeps each rank busy and is limited by the "
                 "all-reduce and by stragglers; on CPU processes that share cores it also shows the cores running out.")
    return "\n".join(lines)


def lr_answer(table: pd.DataFrame) -> str:
    """Markdown: what a larger global batch needs from the learning rate, from the cases just trained."""
    base = table.iloc[0]
    lines = []
    for row in table.itertuples():
        if row.status != "ok":
            lines.append(f"- **{row.case}**: {row.status}.")
            continue
        lines.append(f"- **{row.case}**: {row.steps:.0f} steps, final training loss {row.final_train_loss:.3f}, "
                     f"test top-1 {row.test_top1:.1f} % (base batch: {base['test_top1']:.1f} %).")
    factor = int(table.iloc[1]["batch"] // base["batch"])
    lines.append(f"- With {factor}x the batch an epoch has {factor}x fewer steps: at the same learning rate the model "
                 "moves less per epoch. Scaling the rate with the batch (the linear rule) restores the distance "
                 "travelled; the warm-up avoids the large early steps that can throw a freshly initialised network "
                 "off course, which is where an unwarmed large rate loses accuracy or diverges.")
    return "\n".join(lines)


def allreduce_answer(table: pd.DataFrame) -> str:
    """Markdown: latency and bandwidth of the all-reduce just measured."""
    small, large = table.iloc[0], table.iloc[-1]
    return "\n".join([
        f"- {int(large['world_size'])} ranks over **{large['backend']}**: the smallest message "
        f"({int(small['bytes'])} B) "
        f"took **{small['seconds'] * 1e6:.0f} µs**, almost all latency; the largest ({int(large['bytes']) / 2**20:.0f} "
        f"MiB) reached a bus bandwidth of **{large['bus_gb_per_s']:.2f} GB/s**.",
        "- Compare the large-message bus bandwidth with the link: NVLink 3/4 carries a few hundred GB/s per "
        "direction, Infinity Fabric between MI250X GCDs 50-200 GB/s, a Slingshot-11 port 25 GB/s. Far below "
        "the link means the transport is not the one you think (NCCL_DEBUG=INFO tells).",
    ])


def plot_scaling(tables: dict[str, pd.DataFrame]) -> Figure:
    """Speed-up against the ideal line, and parallel efficiency, for each study (e.g. strong, weak)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    most = max(int(t["ideal"].max()) for t in tables.values())
    left.plot([1, most], [1, most], "k--", lw=1, label="ideal")
    for name, table in tables.items():
        left.plot(table["ideal"], table["speedup"], "o-", label=name)
        right.plot(table["ranks"], 100 * table["efficiency"], "o-", label=name)
    left.set(xlabel="ranks (relative to the first run)", ylabel="speed-up", title="Speed-up")
    right.axhline(100, color="k", ls="--", lw=1)
    right.axhline(90, color="0.6", ls=":", lw=1, label="90 %")
    right.set(xlabel="ranks", ylabel="efficiency (%)", title="Parallel efficiency", ylim=(0, 110))
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_allreduce(table: pd.DataFrame) -> Figure:
    """Bus bandwidth and time per all-reduce against message size, log-log."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.loglog(table["bytes"], table["seconds"] * 1e6, "o-")
    left.set(xlabel="message size (bytes)", ylabel="time per all-reduce (µs)", title="Latency, then bandwidth")
    right.semilogx(table["bytes"], table["bus_gb_per_s"], "o-", label="bus bandwidth")
    right.semilogx(table["bytes"], table["algorithm_gb_per_s"], ".:", label="algorithm bandwidth")
    right.set(xlabel="message size (bytes)", ylabel="GB/s", title="Bandwidth")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_lr(table: pd.DataFrame) -> Figure:
    """Training loss of each learning-rate case that finished against the epochs seen, overlaid: an epoch of
    a larger batch has fewer steps, so the x axis is in epochs."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for row in table[table["status"] == "ok"].itertuples():
        steps = load_run(row.run).steps
        ax.plot(steps["step"] / steps["step"].max() * steps["epoch"].max(), steps["loss"], label=row.case, alpha=0.85)
    ax.set(xlabel="epochs", ylabel="training loss", title="Large batch: learning rate and warm-up")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.lessons.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", help="process counts to run on this machine")
    parser.add_argument("--mode", choices=STUDIES, default="weak", help="weak (default) or strong scaling")
    parser.add_argument("--collect", nargs="+", metavar="RUN_DIR", help="tabulate finished runs instead")
    parser.add_argument("--csv", help="also write the table to this CSV file")
    args, train_flags = parser.parse_known_args(argv)
    train_flags = [flag for flag in train_flags if flag != "--"]
    if args.collect:
        result = collect(args.collect)
    elif args.ranks:
        result = study(args.ranks, args.mode, echo=True, **changed_options(train_flags))
    else:
        parser.error("give --ranks to run a study here, or --collect with finished runs")
    print(result.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.csv:
        write_text_atomic(Path(args.csv), result.to_csv(index=False))
    return 0


def _bus_hint(factor: float, ranks: int) -> str:
    """What a learner's bus bandwidth did, from its factor to the algorithm bandwidth on ``ranks`` ranks."""
    ring = 2 * (ranks - 1) / ranks
    if math.isclose(factor, 1, rel_tol=1e-6):
        return "yours is the algorithm bandwidth, bytes over time, unchanged"
    if math.isclose(factor, ring / 2, rel_tol=1e-6):
        return (f"yours multiplies it by (n-1)/n = {ring / 2:.3g}: a ring all-reduce passes the message around twice, "
                "once to add the pieces up and once to share the sums")
    if math.isclose(factor * 2**30 / 1e9, ring, rel_tol=1e-6):
        return "yours counts GiB (2**30 bytes); the course's GB/s are 1e9 bytes"
    return f"yours is {factor:.4g} times the algorithm bandwidth on {ranks} ranks"


def check_bus_bandwidth(bus_bandwidth: Callable[[float, float, int], float], measured: pd.DataFrame,
                        ranks: tuple[int, ...] = (2, 4, 8)) -> Check:
    """The check of notebook 08's exercise: does the learner's ``bus_bandwidth(bytes, seconds, ranks)`` give
    what the all-reduce measurement computed, on the ranks it ran and on more (where the two bandwidths part)?"""
    for row in measured.itertuples():
        for count in sorted({int(row.world_size), *ranks}):
            expected = row.algorithm_gb_per_s * 2 * (count - 1) / count
            mine = bus_bandwidth(row.bytes, row.seconds, count)
            if not math.isclose(mine, expected, rel_tol=1e-6, abs_tol=1e-12):
                return Check(False, f"for {int(row.bytes)} bytes on {count} ranks the bus bandwidth is "
                                    f"{expected:.4g} GB/s and your function gives {mine:.4g}: "
                                    f"{_bus_hint(mine / row.algorithm_gb_per_s, count)}. Each link of a ring carries "
                                    f"2(n-1)/n of the message: {2 * (count - 1) / count:.3g} on {count} ranks.")
    return Check(True, f"your bus bandwidth matches all {len(measured)} measured sizes, on "
                       f"{measured['world_size'].iloc[0]} ranks and on {', '.join(map(str, ranks))}.")


if __name__ == "__main__":
    sys.exit(main())
