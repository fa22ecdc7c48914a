"""Notebook 09: what the memory ladder (:mod:`course_utils.experiments.ladder`) measured, the rule of thumb
beside it, what the learner's FSDP2 script held on each rank, and the answer and figure that read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_utils.experiments.ladder import MIB
from course_utils.lessons.script_record import read_record
from course_utils.observe.noise import compare
from course_utils.parallel.launch import launch
from course_utils.parallel.layout import mode_of
from course_utils.tooling.exercises import Check, judge_launch

SHARD_SLACK = 1.05  # a rank's shard of a parameter may be padded: dim 0 split into equal parts


# Bytes per parameter of the state that stays between steps: parameter, gradient, optimizer state.
STATE_BYTES = {
    "fp32, SGD with momentum": (4, 4, 4),
    "fp32, AdamW": (4, 4, 8),
    # As the ZeRO paper counts it: bf16 parameters and gradients; an fp32 master copy and AdamW's two moments.
    "bf16 mixed precision, AdamW": (2, 2, 4 + 8),
}


def bytes_per_parameter(recipe: str, ranks: int = 1, sharded: bool = False) -> float:
    """The rule of thumb: bytes each rank keeps per parameter of the model, activations left out."""
    total = sum(STATE_BYTES[recipe])
    return total / ranks if sharded else total


def largest_models(memory_gib: dict[str, float], ranks: int = 8, headroom: float = 0.8) -> pd.DataFrame:
    """The most parameters (in billions) whose state fits in ``headroom`` of each device's memory, per recipe,
    with DDP (every rank the whole state) and FSDP over ``ranks`` ranks. Activations need the rest."""
    rows = []
    for recipe in STATE_BYTES:
        for strategy, sharded in (("DDP", False), (f"FSDP over {ranks}", True)):
            per_parameter = bytes_per_parameter(recipe, ranks, sharded)
            rows.append({"recipe": recipe, "strategy": strategy, "bytes_per_parameter": per_parameter,
                         **{name: gib * 2**30 * headroom / per_parameter / 1e9 for name, gib in memory_gib.items()}})
    return pd.DataFrame(rows)


def rule_against_measurement(ladder: pd.DataFrame) -> pd.DataFrame:
    """Parameters, gradients and optimizer state per rank, measured, against the rule of thumb (fp32 SGD
    with momentum: 12 bytes per parameter, divided by the ranks under FSDP)."""
    rows = []
    for _, row in ladder.dropna(subset=["parameters"]).iterrows():
        measured = (row["parameters_mib"] + row["gradients_mib"] + row["optimizer_state_mib"]) * MIB
        rule = (bytes_per_parameter("fp32, SGD with momentum", int(row["ranks"]), mode_of(row["distributed"]).sharded)
                * row["parameters"])
        rows.append({"rung": row["rung"], "measured_mib": measured / MIB, "rule_mib": rule / MIB,
                     "measured_over_rule": measured / rule})
    return pd.DataFrame(rows)


def _ranks_table(record: dict[str, Any]) -> pd.DataFrame:
    table = pd.DataFrame(record["ranks"])
    table.insert(0, "rank", range(len(table)))
    table["largest_group_mib"] = max(record["groups_mib"], default=0.0)  # gathered whole while it runs
    table["model_mib"] = record["model_mib"]
    return table


def read_script_record(path: str | Path) -> pd.DataFrame:
    """What every rank of the notebook's FSDP2 script held after its steps, one row per rank, with the
    whole model's size beside it. A missing file says which cell writes it."""
    return _ranks_table(read_record(path))


def script_answer(held: pd.DataFrame) -> str:
    """Markdown: what each rank of the FSDP2 script kept, against the whole model."""
    ranks, whole = len(held), held["model_mib"].iloc[0]
    per_rank = ", ".join(f"rank {row.rank} {row.parameters_mib:.2f}" for row in held.itertuples())
    state = held[["parameters_mib", "gradients_mib", "optimizer_state_mib"]].sum(axis=1).iloc[0]
    return "\n".join([
        f"- The model has **{whole:.2f} MiB** of fp32 parameters; each of the {ranks} ranks keeps "
        f"**{held['parameters_mib'].mean():.2f} MiB** of them ({per_rank} MiB), about 1/{ranks}.",
        f"- With its gradients and AdamW's two moments, a rank keeps **{state:.2f} MiB** between steps, where DDP "
        f"would keep {4 * whole:.2f} MiB (parameters, gradients, two moments: 16 bytes per parameter) on every rank.",
        "- While a group runs, a rank also holds that group whole: the largest is "
        f"**{held['largest_group_mib'].max():.2f} MiB** here.",
    ])


def _listed(mib: Sequence[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in mib) + " MiB"


def judge_fewer_groups(record: dict[str, Any]) -> Check:
    """With only the first block in a group of its own, the script's groups must be exactly two: that block,
    and the root's with every other layer; and each rank must still keep 1/N of the parameters (the root's
    ``fully_shard`` shards what the blocks left). Other groups name what the script that ran did instead."""
    groups, world, whole = sorted(record["groups_mib"]), record["world_size"], record["model_mib"]
    layers = [*record["blocks_mib"], whole - sum(record["blocks_mib"])]  # the model's blocks, then the rest
    held = _ranks_table(record)
    kept = held[["parameters_mib", "gradients_mib", "optimizer_state_mib"]].sum(axis=1).max()
    asked = sorted([layers[0], sum(layers[1:])])
    per_block = sorted(layers)  # every block in a group of its own, the rest in the root's

    def same(a: Sequence[float], b: Sequence[float]) -> bool:
        return len(a) == len(b) and all(abs(x - y) <= 1e-3 * max(1.0, y) for x, y in zip(a, b))

    if (held["optimizer_state_mib"] < held["parameters_mib"]).any():
        return Check(False, f"a rank keeps {held['optimizer_state_mib'].min():.2f} MiB of optimizer state for its "
                            f"{held['parameters_mib'].min():.2f} MiB of parameters, where AdamW keeps two moments "
                            "per parameter (twice as much): the optimizer holds other tensors than the model's. Built "
                            "before `fully_shard`, it keeps the parameters that sharding replaced, which get no "
                            "gradients, and the model never trains. Build the optimizer after the last "
                            "`fully_shard(model)`.")
    if held["parameters_mib"].max() > whole / world * SHARD_SLACK:
        return Check(False, f"a rank keeps {held['parameters_mib'].max():.2f} MiB of the model's {whole:.2f} MiB "
                            f"of parameters, more than 1/{world}: some layers are in no group and stay whole on every "
                            "rank. Keep the last `fully_shard(model)`: it shards what the blocks leave.")
    if same(groups, asked):
        return Check(True, f"your script's groups are the first block ({layers[0]:.2f} MiB) and the root's "
                           f"({sum(layers[1:]):.2f} MiB: every other layer). Each rank still keeps {kept:.2f} MiB of "
                           f"parameters, gradients and optimizer state between steps, 1/{world} of the whole, since "
                           "the root's `fully_shard` shards what the blocks left; but the largest group, gathered "
                           f"whole while it runs, grew from {max(per_block):.2f} to {max(asked):.2f} MiB: that is "
                           "what a rank's peak pays.")
    if same(groups, per_block):
        return Check(False, f"every block is still a group of its own (groups of {_listed(groups)}), as in the run "
                            "above: the script that ran puts every block in `blocks_to_shard`. If you changed that "
                            "line, write the script again (run its `%%writefile` cell) before this cell.")
    if len(groups) == 1:
        return Check(False, f"one group holds the whole model ({groups[0]:.2f} MiB), gathered at once: no block is "
                            "in a group of its own. The exercise keeps the first block alone: "
                            "`blocks_to_shard = models.blocks(model)[:1]`.")
    return Check(False, f"your script's groups hold {_listed(groups)}; the exercise asks for two: the first block "
                        f"alone ({layers[0]:.2f} MiB) and the root's with every other layer ({sum(layers[1:]):.2f} "
                        "MiB). Put only the first block in `blocks_to_shard`.")


def check_fewer_groups(script: str | Path, ranks: int, flags: Sequence[str], timeout_seconds: float = 600) -> Check:
    """The check of notebook 09's exercise: launch the learner's FSDP2 ``script`` on ``ranks`` ranks with
    ``flags`` and judge its groups and what each rank kept, from the record this launch wrote; a record an
    earlier attempt left is removed first, and a failed launch is never judged."""
    script = Path(script)
    record = script.with_name(f"{script.stem}-check.json")
    return judge_launch(record, lambda: launch(ranks, str(script), *flags, "--out", str(record),
                                               timeout_seconds=timeout_seconds),
                        lambda path: judge_fewer_groups(read_record(path)))


def memory_ladder_answer(ladder: pd.DataFrame, where: str) -> str:
    """Markdown: what sharding saved per rank and what activation checkpointing traded, from the ladder."""
    rows = ladder.set_index("rung")
    ddp, fsdp, recomputed = (rows.loc[name] for name in ("DDP", "FSDP", "FSDP + activation checkpointing"))
    state = ["parameters_mib", "gradients_mib", "optimizer_state_mib"]
    ddp_state, fsdp_state = ddp[state].sum(), fsdp[state].sum()
    recompute = compare(recomputed["measured"], fsdp["measured"], bound=(0, 1),
                        why="recomputing every block's forward pass adds work and removes none")
    sharding = compare(fsdp["measured"], ddp["measured"])
    lines = [
        f"- Where the ranks ran: {where}.",
        f"- DDP keeps the whole model's state on every rank: **{ddp_state:.1f} MiB** of parameters, gradients and "
        f"optimizer state. FSDP over {int(fsdp['ranks'])} ranks keeps **{fsdp_state:.1f} MiB** per rank "
        f"({fsdp_state / ddp_state:.0%} of it): each rank holds its shard, and the whole of a block only while "
        "that block runs.",
        f"- The saved activations did not shrink with sharding (**{ddp['activations_mib']:.1f}** MiB under DDP, "
        f"**{fsdp['activations_mib']:.1f}** under FSDP): each rank still trains its whole batch through the whole "
        "model. Activation checkpointing cut them to "
        f"**{recomputed['activations_mib']:.1f} MiB** ({recomputed['activations_mib'] / fsdp['activations_mib']:.0%}) "
        "by running every block's forward pass again in the backward pass, about a third more compute: "
        f"**{recomputed['measured'].median:.0f}** images/s against **{fsdp['measured'].median:.0f}** (median steps): "
        f"{recompute.sentence()}",
        f"- FSDP ran at **{fsdp['measured'].median:.0f}** images/s against DDP's **{ddp['measured'].median:.0f}** "
        "(median steps): "
        f"{sharding.sentence()} Per step it all-gathers every block's parameters twice (forward and backward) and "
        "reduce-scatters the gradients, about 1.5 times the bytes of DDP's all-reduce; what that costs depends on "
        "how much of it hides behind the computation, which GPUs show (the table of GPU rows below, once recorded).",
    ]
    if "skipped" in rows and rows["skipped"].notna().any():
        skipped = rows[rows["skipped"].notna()]
        lines.append("- Not measured here: " + "; ".join(f"{name} ({why})" for name, why in skipped["skipped"].items()))
    return "\n".join(lines)


def plot(table: pd.DataFrame) -> Figure:
    """Memory per rank by kind, stacked, for each rung of the ladder; its speed beside it."""
    measured = table.dropna(subset=["total_mib"]) if "total_mib" in table else table.iloc[:0]
    kinds = [("parameters_mib", "parameters"), ("gradients_mib", "gradients"),
             ("optimizer_state_mib", "optimizer state"), ("activations_mib", "saved activations")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    start = pd.Series(0.0, index=measured.index)
    for column, label in kinds:
        left.barh(measured["rung"], measured[column], left=start, label=label)
        start += measured[column]
    peaks = measured.dropna(subset=["peak_allocated_mib"])
    if len(peaks):
        left.scatter(peaks["peak_allocated_mib"], peaks["rung"], marker="|", s=300, color="black",
                     label="allocator's peak", zorder=3)
    left.invert_yaxis()
    left.set(xlabel="MiB per rank", title="Memory of one training step, per rank")
    left.legend(fontsize=7, loc="lower right")
    right.barh(measured["rung"], measured["images_per_second"], color="tab:gray")
    right.invert_yaxis()
    right.set(xlabel="images per second (all ranks)", title="Speed", yticklabels=[])
    fig.tight_layout()
    return fig
