"""Notebook 10: the capstone, a cluster team's Detectron2 study of Faster R-CNN R50-FPN on COCO, redone with
the course's tools (:mod:`course_utils.experiments.detection_runs`), and their numbers beside the learner's.

The team trained the 1x schedule (90,000 iterations of 16 images) on an HGX A100 node with 1, 2 and
4 GPUs, the global batch fixed (16/N images per GPU), and asked: what do the GPU usage curves show,
is NVLink used, how much is communication, what does AMP give, and what do 2 nodes give? The answer here
reads the course's runs against each of those questions.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from course_utils.doctor import transport
from course_utils.observe.noise import DISTURBED, compare
from course_utils.run_folder import RunFolder

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
