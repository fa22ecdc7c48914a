"""Notebook 10: the capstone, a cluster team's Detectron2 study of Faster R-CNN R50-FPN on COCO, redone with
the course's tools, and their numbers beside the learner's.

The team trained the 1x schedule (90,000 iterations of 16 images) on an HGX A100 node with 1, 2 and
4 GPUs, the global batch fixed (16/N images per GPU), and asked: what do the GPU usage curves show,
is NVLink used, how much is communication, what does AMP give, and what do 2 nodes give? Each
function here answers one of those with runs of the one training command (``--data coco``): strong
scaling at a fixed global batch, a traced DDP run with NCCL's own report, and AMP against fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from course_utils import config
from course_utils.data import coco, generated_coco
from course_utils.doctor import transport
from course_utils.experiments.machine_shape import parallel_shape
from course_utils.experiments.runs import SCRATCH, measured_rate, measured_steps, traced_ranks
from course_utils.lessons import scaling
from course_utils.observe.noise import DISTURBED, compare
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training.detection_models import DETECTION_RECIPES
from course_utils.training.resume import NonFiniteLossError

# The team's runs (Detectron2, Faster R-CNN R50-FPN, COCO 2017, 1x schedule, HGX A100 node); the model
# zoo's reference is 37.9 AP at 0.210 s/it on 8 V100 with NVLink. Their s/it is Detectron2's "overall training
# speed": the whole training time over the 90,000 iterations (15:07:58 is 54,478 s, / 90,000 = 0.6053), a mean
# with warm-up and data waits in it. The PCIe A100s differ from the HGX's SXM4 ones in more than the link: their
# power limit is 250 W (40 GB) or 300 W (80 GB) against 400 W, so they also clock lower under load.
TEAM = pd.DataFrame(
    [(1, "NVLink (HGX)", 38.34, "15:07:58", 0.6053), (2, "NVLink (HGX)", 37.88, "7:21:13", 0.2942),
     (4, "NVLink (HGX)", 37.94, "4:05:27", 0.1636), (2, "PCIe", 37.92, "9:46:32", 0.3910)],
    columns=["gpus", "interconnect", "box_ap", "wall_time", "seconds_per_iteration"])


def team_table() -> pd.DataFrame:
    """The team's table with the speed-up and efficiency of each run against their one GPU."""
    table = TEAM.copy()
    one = table.loc[table["gpus"] == 1, "seconds_per_iteration"].iloc[0]
    table["speedup"] = one / table["seconds_per_iteration"]
    table["efficiency"] = table["speedup"] / table["gpus"]
    return table


# Detectron2's 1x recipe: lr 0.02 for a global batch of 16 images, raised linearly over the first 1,000 iterations.
REFERENCE_BATCH, REFERENCE_WARMUP = 16, 1000
STAND_IN = (512, 64)  # training and validation images of the COCO-format stand-in at photo sizes


def workshop_recipe(global_batch: int, steps: int) -> dict[str, Any]:
    """The R50-FPN's learning rate scaled to ``global_batch`` (the linear rule Detectron2 follows: 0.02 is for
    16 images, so one GPU with 2 takes 0.0025) and a linear warm-up over Detectron2's 1,000 iterations, or the
    first fifth of a shorter run: a detector trained from scratch at 8x its rate and no warm-up diverges."""
    rate = DETECTION_RECIPES["workshop"].lr * global_batch / REFERENCE_BATCH
    return {"lr": rate, "warmup_steps": max(1, min(REFERENCE_WARMUP, steps // 5))}


def detection_data(size: str) -> tuple[Path, str]:
    """Where the detector's data is at ``size``, and a sentence that says what it is: COCO 2017 where it is
    prepared; at the workshop size without it (19 GB that a one-GCD attendee rarely has), the COCO-format
    stand-in at photo sizes, generated here the first time (seconds): its seconds per iteration compare, its box
    AP says nothing about COCO."""
    root = config.data_dir(config.get_size(size), "coco")
    if size != "workshop" or not _absent(root):  # what is there is checked whole by the run that reads it
        return root, coco.describe(root)
    stand_in = root.parent / "coco-stand-in"
    if _absent(stand_in):
        generated_coco.generate(stand_in, *STAND_IN, photo_sizes=True)
    return stand_in, (f"COCO 2017 is not prepared in {root} (about 19 GB: python -m data_prep --size workshop "
                      f"--coco); these runs use {coco.describe(stand_in)} instead, at COCO's photo sizes: their "
                      "seconds per iteration compare with COCO's, their box AP says nothing about it")


def _absent(root: Path) -> list[str]:
    """What of a COCO-format tree is not there at all (a split's images or annotations): cheap, where reading
    COCO's 448 MB of training annotations to check them would take a minute."""
    return [name for split in coco.SPLITS for name in coco.missing(root, split)]


def _options(options: dict[str, Any], global_batch: int | None = None) -> dict[str, Any]:
    """The training options of the lesson's runs: COCO-format data (the stand-in where COCO is missing), and at
    the workshop size the recipe scaled to ``global_batch`` (the recipe's batch on one process by default)."""
    shape, size = parallel_shape(), config.get_size(options.get("size")).name
    steps = options.get("max_steps") or measured_steps(size)
    defaults = {"data": "coco", "device": shape.device, "max_steps": steps, "data_dir": detection_data(size)[0],
                **SCRATCH}
    if size == "workshop" and "lr" not in options:
        defaults.update(workshop_recipe(global_batch or DETECTION_RECIPES[size].batch_size, steps))
    return {**defaults, **options}


def fixed_global_batch(ranks: list[int] | None = None, global_batch: int | None = None,
                       out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """Strong scaling as the team ran it: the same global batch split over 1, 2, ... ranks; seconds per
    iteration, wall time, speed-up, efficiency and box AP of each run (monitored)."""
    size, shape = config.get_size(options.get("size")), parallel_shape()
    ranks = ranks or [count for count in scaling.scaling_ranks(size.name) if count <= shape.ranks]
    global_batch = global_batch or DETECTION_RECIPES[size.name].batch_size * max(ranks)
    return scaling.study(ranks, "strong", out=out or config.runs_dir() / "detection-scaling",
                         batch_size=global_batch, monitor="auto", **_options(options, global_batch))


def communication_and_transport(ranks: int | None = None, out: str | Path | None = None,
                                **options: Any) -> tuple[pd.DataFrame, transport.Transport]:
    """One traced DDP run of the detector with ``NCCL_DEBUG=INFO``: each step's communication and what of
    it hid behind computation (rank 0's trace), and which transport NCCL chose (none under gloo)."""
    folder = Path(out or config.runs_dir() / "detection-profile")
    ranks = ranks or parallel_shape().ranks
    recipe = DETECTION_RECIPES[config.get_size(options.get("size")).name]
    steps, result = traced_ranks(ranks, folder, env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"},
                                 **_options(options, recipe.batch_size * ranks))
    return steps, transport.read(result.lines)  # NCCL's report


def amp_effect(precisions: tuple[str, ...] = ("off", "bf16"), out: str | Path | None = None,
               **options: Any) -> pd.DataFrame:
    """The same short run in fp32 and with autocast: seconds per iteration and box AP of each, one process. A run
    whose loss stops being finite is a row that says so, not a failed cell."""
    out = Path(out or config.runs_dir() / "detection-amp")
    rows = []
    for amp in tqdm(precisions, desc="precisions", unit="run"):
        try:
            summary = train(**_options({"device": "auto", **options}), amp=amp, out=out / amp)
        except NonFiniteLossError as error:
            rows.append({"amp": amp, "status": f"diverged: {error}".split(";")[0]})
            continue
        rows.append({"amp": amp, "status": "ok", "seconds_per_iteration": summary["seconds_per_iteration"],
                     "images_per_second": summary["images_per_second"], "box_ap": summary["box_ap"],
                     "device": summary["device"], "measured": measured_rate(summary)})
    table = pd.DataFrame(rows)
    if "seconds_per_iteration" in table:
        table["speedup"] = table["seconds_per_iteration"].iloc[0] / table["seconds_per_iteration"]
    return table


def monitor_frame(run: str | Path) -> pd.DataFrame:
    """The device samples of a monitored run, for :func:`course_utils.observe.monitor.views.timeline`."""
    return pd.read_csv(RunFolder(run).monitor)


def answer(scaled: pd.DataFrame, steps: pd.DataFrame, found: transport.Transport, amp: pd.DataFrame,
           where: str, on_gpus: bool) -> str:
    """Markdown: the team's questions answered from the runs just made."""
    first, last = scaled.iloc[0], scaled.iloc[-1]
    speedup = compare(last["measured"], first["measured"], bound=(0, last["ranks"] / first["ranks"]),
                      why=f"{int(last['ranks'])} ranks do at most {last['ranks'] / first['ranks']:g}x the work of "
                          f"{int(first['ranks'])}")
    efficiency = "" if speedup.verdict == DISTURBED else f", efficiency **{last['efficiency']:.0%}**"
    team = team_table().set_index(["gpus", "interconnect"])
    team_two = team.loc[(2, "NVLink (HGX)")]
    hidden = steps["hidden_ms"].sum() / steps["communication_ms"].sum() if steps["communication_ms"].sum() else 0.0
    return "\n".join([
        f"- Where the ranks ran: {where}." + ("" if on_gpus else " These are CPU processes: their speeds show the "
                                               "mechanics, vary with what else the machine runs, and are not GPU "
                                               "figures; the team's table is."),
        f"- **Scaling at a fixed global batch of {int(last['global_batch'])}**, in the team's measure (training time "
        f"over iterations, a mean): {int(last['ranks'])} ranks ran at **{last['mean_iteration_seconds']:.3f} s/it** "
        f"against **{first['mean_iteration_seconds']:.3f}** on {int(first['ranks'])}; their steady iterations' "
        f"speed-up (medians): {speedup.sentence()}{efficiency}. "
        f"The team measured {team_two['speedup']:.2f}x on 2 A100s with NVLink ({team_two['efficiency']:.0%}) and "
        f"{team.loc[(2, 'PCIe'), 'speedup']:.2f}x on 2 PCIe A100s. That gap is not the interconnect alone: the PCIe "
        "cards also run at a lower power limit (250-300 W against 400 W), so they compute more slowly too.",
        f"- **Box AP** after these short runs: {', '.join(f'{ap:.1f}' for ap in scaled['box_ap'])} (by ranks). The "
        "team's full schedule gave 37.9-38.3 at every GPU count: the global batch was the same, and Detectron2's "
        "backbone uses frozen BatchNorm (fixed statistics), so how the batch is split over GPUs does not change the "
        "training. torchvision's detector without pretrained weights, as here, trains ordinary BatchNorm, whose "
        "statistics do depend on the images per GPU.",
        f"- **Communication**: {steps['communication_percent'].median():.1f} % of a median step of "
        f"{steps['step_ms'].median():.0f} ms, {hidden:.0%} of it hidden behind computation. That share attributes "
        "this run's exposed all-reduce time on this machine's link; it cannot say how much of the team's SXM-PCIe "
        "gap is the link (their clocks differ too), nor what another link would cost, without measuring there.",
        f"- **Transport**: {found.verdict().removeprefix('transport: ')}.",
        _amp_line(amp),
    ])


def _amp_line(amp: pd.DataFrame) -> str:
    """The AMP run against fp32, or which of them diverged (a result of the run, with its fix)."""
    diverged = amp[amp["status"] != "ok"] if "status" in amp else amp.iloc[:0]  # tables of older runs: all ran
    if len(diverged):
        return (f"- **AMP**: not compared: {'; '.join(f'{row.amp}: {row.status}' for row in diverged.itertuples())}. "
                "A detector trained from scratch needs a learning rate scaled to its batch and a warm-up (the "
                "workshop recipe here: lr 0.02 x batch / 16, warmed up over up to 1,000 iterations); lower it "
                "further with lr=... if it still diverges.")
    return (f"- **AMP**: {amp.iloc[-1]['amp']} ran at **{amp.iloc[-1]['seconds_per_iteration']:.3f} s/it** against "
            f"**{amp.iloc[0]['seconds_per_iteration']:.3f}** in fp32; its steady iterations against fp32's: "
            f"{compare(amp.iloc[-1]['measured'], amp.iloc[0]['measured']).sentence()} Box AP "
            f"{amp.iloc[-1]['box_ap']:.1f} against {amp.iloc[0]['box_ap']:.1f}.{_amp_note(amp)}")


def _amp_note(amp: pd.DataFrame) -> str:
    if amp.iloc[-1]["speedup"] >= 1 or amp.iloc[-1]["device"] != "CPU":
        return ""
    return (" Slower here: a CPU without bf16 arithmetic units converts to and from it; on GPUs the tensor cores "
            "make it the fast path.")
