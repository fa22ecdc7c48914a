"""Notebook 11: the checks of the learner's split layers, the pipeline's bubble, and the parallel modes compared.

The notebook's scripts (written from its cells and started with torchrun) save what each rank computed;
the checks here rebuild the unsplit layer from the same weights and input and compare outputs and
gradients. The mode comparison runs the training command in each ``--distributed`` mode at the same
global batch and reads memory by kind and speed from the runs' summaries.

Where the ranks run is :func:`course_utils.experiments.machine_shape.parallel_shape`'s answer: one GPU per rank
(NCCL/RCCL) on a machine with two or more, else CPU processes (gloo) at the ``ci`` size.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from course_utils import config
from course_utils.experiments.machine_shape import ParallelShape
from course_utils.experiments.runs import Variant, refuse_options, run_ranks, run_variants
from course_utils.lessons.script_record import read_record, steps_losses
from course_utils.observe.communication import collective_bytes
from course_utils.observe.metrics import read_records
from course_utils.observe.noise import ALIKE, MIN_SAMPLES, SLOWER, UNKNOWN, Measurement, compare
from course_utils.observe.profiling import TRACE_FILE
from course_utils.parallel.launch import LaunchResult, launch
from course_utils.parallel.layout import MODES, Layout
from course_utils.run_folder import RunFolder
from course_utils.tooling.exercises import Check, judge_launch
from course_utils.training.vision_transformer import MLP, Block, ViTShape

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # float32 sums in another order (the split adds partial sums)
# The comparison's vision transformer and steps by course size: seconds on CPU processes at ci; ViT-S at
# 224 px on GPUs at workshop, 64 images a step (16 a GPU under DDP on 4: the small per-GPU batch TP is for).
COMPARISON = {
    "ci": dict(model="vit_tiny", image_size=32, batch_size=16, max_steps=6, train_samples=128, test_samples=32),
    "workshop": dict(model="vit_small", image_size=224, batch_size=64, max_steps=30, train_samples=64 * 32,
                     test_samples=256),
}


def start_script(ranks: int, script: Path, *args: str, timeout_seconds: float = 120,
                 outputs: Sequence[str | Path] = ()) -> LaunchResult:
    """``torchrun --nproc-per-node ranks script args`` from a notebook, ended after ``timeout_seconds``, the
    ``outputs`` an earlier run wrote removed first; every rank's output is shown, and the tail of each rank's log on
    failure."""
    script = Path(script).resolve()
    return launch(ranks, script.stem, *args, log_dir=script.parent / f"{script.stem}-logs",
                  timeout_seconds=timeout_seconds, env=script_environment(script), outputs=outputs)


def script_environment(script: Path, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The ranks' ``PYTHONPATH``: the script's folder (torchrun starts it as a module), then the notebook's own
    entries, which a module system or a container may use to reach PyTorch or the course's package."""
    return {"PYTHONPATH": os.pathsep.join([str(Path(script).parent), *filter(None, [environ.get("PYTHONPATH")])])}


def run_script(ranks: int, script: Path, *args: str, timeout_seconds: float = 120,
               outputs: Sequence[str | Path] = ()) -> LaunchResult:
    """:func:`start_script`, and an error naming the script when a rank failed."""
    result = start_script(ranks, script, *args, timeout_seconds=timeout_seconds, outputs=outputs)
    if not result.ok:
        raise RuntimeError(f"{Path(script).name} failed on {ranks} rank{'s' if ranks != 1 else ''} (exit code "
                           f"{result.returncode}); see the ranks' output above")
    return result


def _rank_files(folder: Path) -> list[dict[str, Any]]:
    files = sorted(Path(folder).glob("rank*.pt"), key=lambda path: int(path.stem.removeprefix("rank")))
    if not files:
        raise FileNotFoundError(f"no rank*.pt in {folder}: run the script's cell first")
    return [torch.load(path, weights_only=True) for path in files]


def _whole_gradients(module: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The unsplit module's output, input gradient and weight gradients for the loss the scripts use."""
    tokens = tokens.clone().requires_grad_()
    out = module(tokens)
    out.square().mean().backward()
    return out.detach(), tokens.grad, {name: p.grad for name, p in module.named_parameters()}


def _compare(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> pd.DataFrame:
    rows = []
    for name, (split, whole) in pairs.items():
        difference = (split - whole).abs().max().item() if split.shape == whole.shape else float("inf")
        rows.append({"tensor": name, "shape": tuple(whole.shape), "largest difference": difference,
                     "same": split.shape == whole.shape and torch.allclose(split, whole, **TOLERANCE)})
    return pd.DataFrame(rows)


def check_mlp_split(folder: Path) -> pd.DataFrame:
    """The hand-split MLP against the whole one: output and input gradient of every rank, and each weight's
    gradient put together from the ranks' pieces (``up`` column-wise: rows of its weight; ``down`` row-wise:
    columns of its weight)."""
    ranks = _rank_files(folder)
    first = ranks[0]
    whole = MLP(first["up.weight"].shape[1], first["up.weight"].shape[0])
    whole.load_state_dict({name: first[name] for name in whole.state_dict()})
    out, tokens_grad, grads = _whole_gradients(whole, first["tokens"])
    pairs = {f"rank {r} output": (rank["out"], out) for r, rank in enumerate(ranks)}
    pairs |= {f"rank {r} input gradient": (rank["tokens_grad"], tokens_grad) for r, rank in enumerate(ranks)}
    pairs["up.weight gradient"] = (torch.cat([rank["up_weight_grad"] for rank in ranks], dim=0), grads["up.weight"])
    pairs["up.bias gradient"] = (torch.cat([rank["up_bias_grad"] for rank in ranks]), grads["up.bias"])
    pairs["down.weight gradient"] = (torch.cat([rank["down_weight_grad"] for rank in ranks], dim=1),
                                     grads["down.weight"])
    pairs["down.bias gradient"] = (first["down_bias_grad"], grads["down.bias"])
    return _compare(pairs)


def check_block_split(folder: Path, heads: int) -> pd.DataFrame:
    """The DTensor-split transformer block against the whole one: each rank's share of the tokens (sequence
    parallel) put together again, and every weight's whole gradient (``full_tensor()`` on each rank)."""
    ranks = _rank_files(folder)
    first = ranks[0]
    dim = first["state"]["attention.query.weight"].shape[0]
    whole = Block(ViTShape(dim=dim, depth=1, heads=heads))
    whole.load_state_dict(first["state"])
    out, tokens_grad, grads = _whole_gradients(whole, first["tokens"])
    pairs = {"output": (torch.cat([rank["out"] for rank in ranks], dim=1), out),
             "input gradient": (torch.cat([rank["tokens_grad"] for rank in ranks], dim=1), tokens_grad)}
    pairs |= {f"{name} gradient": (first["grads"][name], grad) for name, grad in grads.items()}
    return _compare(pairs)


def split_training(script: Path, ranks: int, flags: Sequence[str], timeout_seconds: float = 600) -> pd.DataFrame:
    """The learner's tensor-parallel training script launched on one rank (nothing split) and on ``ranks``: per
    run, each step's loss and what rank 0 kept. Each run's record is removed before its launch, so only what
    this launch wrote is read; a failed launch raises, naming the script."""
    rows = []
    for count in (1, ranks):
        record = Path(script).with_name(f"{Path(script).stem}-{count}-ranks.json")
        run_script(count, script, *flags, "--out", str(record), timeout_seconds=timeout_seconds, outputs=[record])
        if not record.is_file():
            raise FileNotFoundError(f"{Path(script).name} ran on {count} rank(s) but wrote no {record.name}: "
                                    "keep its last line before leaving the group, `record.write(model, optimizer)`")
        saved = read_record(record)
        rows.append({"ranks": count, "losses": steps_losses(saved), "model_mib": saved["model_mib"],
                     "blocks_mib": sum(saved["blocks_mib"]), **saved["ranks"][0]})
    return pd.DataFrame(rows)


def split_training_answer(table: pd.DataFrame) -> str:
    """Markdown: whether the split trained exactly what one rank trains, and what each rank kept."""
    one, split = table.iloc[0], table.iloc[-1]
    steps = min(len(one.losses), len(split.losses))
    if not steps:
        return (f"- A run recorded no step's loss ({len(one.losses)} on one rank, {len(split.losses)} on "
                f"{split.ranks}): nothing to compare. Does the script still append each step's loss to `losses`, "
                "and pass them to `record.epoch`?")
    apart = max(abs(a - b) / abs(b) for a, b in zip(split.losses[:steps], one.losses[:steps]))
    same = steps == len(one.losses) == len(split.losses) and torch.allclose(
        torch.tensor(split.losses), torch.tensor(one.losses), **TOLERANCE)
    verdict = (f"- Every one of the {steps} steps' losses on {split.ranks} ranks is the loss on one rank, at most "
               f"{apart:.1e} apart, relative (float sums in another order): the split trains the same model."
               if same else
               f"- The losses on {split.ranks} ranks and on one rank part (up to {apart:.1e} apart over {steps} "
               "steps, relative; beyond float rounding): the split no longer computes what the whole model computes.")
    if split.parameters_mib >= 0.99 * one.parameters_mib:
        return "\n".join([verdict, f"- Each of the {split.ranks} ranks keeps all {split.parameters_mib:.2f} MiB of "
                           "the parameters, as one rank alone does: nothing was split. Does the script still call "
                           "`parallelize`?"])
    return "\n".join([verdict,
        f"- Each of the {split.ranks} ranks keeps **{split.parameters_mib:.2f} MiB** of parameters (one rank alone: "
        f"{one.parameters_mib:.2f} MiB): the blocks' {one.blocks_mib:.2f} MiB split {split.ranks} ways, except their "
        f"norms and the row-wise layers' biases, and the embedding and head ({one.model_mib - one.blocks_mib:.2f} MiB) "
        "whole on every rank. "
        f"Gradients and AdamW's state follow: {split.gradients_mib:.2f} and {split.optimizer_state_mib:.2f} MiB.",
        "- Unlike FSDP (09), no rank gathers a layer whole, and the activations inside a block are split too; but "
        "every rank reads the whole batch, and every block waits for collectives in its forward and backward pass."])


def gpipe_bubble(stages: int, microbatches: int) -> float:
    """The share of a GPipe step each stage waits, with equal stages and free communication: a step lasts
    microbatches + stages - 1 micro-batch slots, of which each stage works microbatches."""
    return (stages - 1) / (microbatches + stages - 1)


def bubble_table(folder: Path, formula: Callable[[int, int], float]) -> pd.DataFrame:
    """Each micro-batch count's measured bubble (the share of the step a stage did not compute: 1 - its busy
    time / the step's time; the median over the repeats and the interval of their middle 80 %)
    beside ``formula(stages, microbatches)``, the learner's."""
    ranks = _rank_files(folder)
    stages = len(ranks)
    rows = []
    for microbatches in sorted(ranks[0]["steps"]):
        idle = Measurement.of(1 - rank["busy"] / step for rank in ranks for step in rank["steps"][microbatches])
        rows.append({"micro-batches": microbatches, "measured bubble": idle.median, "low": idle.low,
                     "high": idle.high, "formula": formula(stages, microbatches)})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class ParallelismPlan:
    """The runs of the notebook's comparison on this machine: a :class:`Variant` per run, named by its
    ``--distributed`` mode, with its ``ranks`` (read by :func:`compare_parallelisms`, not a training option); the
    training options every run shares (the global batch in ``batch_size``); and what this machine cannot show."""

    runs: list[Variant]
    options: dict[str, Any]
    missing: str


def _runs(ranks: dict[str, int]) -> list[Variant]:
    return [Variant(mode, distributed=mode, ranks=count) for mode, count in ranks.items()]


def parallelism_plan(shape: ParallelShape, size: config.Size) -> ParallelismPlan:
    """Every mode of :data:`course_utils.parallel.layout.MODES` that runs one process per device (DDP, FSDP, TP
    and FSDP x TP) on ``shape``'s ranks at ``size``: 2 CPU processes (4 for a 2-D mesh) without two GPUs; on GPUs
    4 of them for every mode where there are 4 (TP over 4 splits ViT-S's 8 heads and 196 tokens evenly), else 2,
    and no 2-D mesh, which needs 4."""
    options = {**COMPARISON[size.name], "size": size.name, "device": shape.device, "log_every": 1,
               "workers": size.workers if shape.on_gpus else 0, "augment": False, "progress": False}
    launched = {name: facts for name, facts in MODES.items() if facts.one_process_per_device}
    if not shape.on_gpus:
        return ParallelismPlan(_runs({name: 4 if facts.two_dimensional else 2 for name, facts in launched.items()}),
                               options, "CPU processes: memory by kind and communication volume as on GPUs, not GPU "
                               "speed")
    ranks = 4 if shape.ranks >= 4 else 2
    meshes = [name for name, facts in launched.items() if facts.two_dimensional]
    runs = {name: ranks for name, facts in launched.items() if ranks == 4 or not facts.two_dimensional}
    missing = "" if ranks == 4 else f"{', '.join(meshes)}: FSDP x TP needs 4 GPUs (2 groups of 2): ask for 4"
    return ParallelismPlan(_runs(runs), options, missing)


SET_FOR_EVERY_RUN = {  # what compare_parallelisms sets alike for each run, so that the modes do the same work
    "out": "each run's folder is out / the run's name; pass out= to compare_parallelisms",
    "trace": "rank 0 of each run is traced into its run folder, where the comparison reads what its collectives "
             "moved",
    "batch_size": "every run trains the same global batch, split over its ranks; pass batch_size= to "
                  "compare_parallelisms",
    "max_steps": "every run trains the same number of steps; pass max_steps= to compare_parallelisms",
}


def compare_parallelisms(runs: Sequence[Variant], out: Path, **options: Any) -> pd.DataFrame:
    """Each run of ``runs`` (its ``distributed`` mode, its ``ranks`` and any option of its own but those of
    :data:`SET_FOR_EVERY_RUN`) at the same global batch (``options['batch_size']`` images in all), rank 0 traced: per
    rank, memory by kind, the bytes its collectives moved per step, and the step's speed. Each run's folder is
    ``out`` / its name."""
    refuse_options(runs, SET_FOR_EVERY_RUN)

    def run(variant: Variant) -> dict[str, Any]:
        own = {name: value for name, value in variant.options.items() if name != "ranks"}
        mode, ranks = own.pop("distributed"), variant.options["ranks"]
        data_ranks = Layout(mode, None, ranks).data_ranks  # groups that read images of their own
        per_rank = {**options, **own, "batch_size": options["batch_size"] // data_ranks}
        folder = Path(out) / variant.folder_name
        result = run_ranks(ranks, folder, distributed=mode, trace=str(folder / "trace"), timeout_seconds=600,
                           **per_rank)
        summary = result.summary
        memory = summary["per_rank"][0]["step_memory_bytes"]
        return {"ranks": ranks, "batch per rank": per_rank["batch_size"],
                "global batch": summary["global_batch_size"],
                **{f"{kind} MiB": (memory[kind] or 0) / 2**20 for kind in
                   ("parameters", "gradients", "optimizer_state", "activations")},
                # the GPU allocator's high-water mark of a step; CPU processes keep no such count
                "peak MiB": memory["peak_allocated"] / 2**20 if memory.get("peak_allocated") else math.nan,
                "collectives MiB/step": pd.Series(collective_bytes(folder / "trace" / TRACE_FILE)).median() / 2**20,
                "images/s": summary["images_per_second"],
                # rank 0's steps, as the answer compares them: its "fastest median step" is this figure
                "step s (median)": Measurement.of(step_seconds(folder)).median,
                "final loss": summary["final_train_loss"]}

    return run_variants(runs, run, desc="modes", column="mode")


def step_seconds(out: Path) -> list[float]:
    """Rank 0's seconds of every step of the run in ``out``, as its metrics recorded them."""
    return [seconds for record in read_records(RunFolder(out).metrics) if record["kind"] == "step"
            for seconds in record["iteration_seconds"]]


def bubble_answer(table: pd.DataFrame) -> str:
    """Where the learner's formula falls inside the measured range of each micro-batch count, and which
    measurements a busy machine disturbed (a stage idle less than never: another process had its core)."""
    lines = []
    for row in table.itertuples():
        count = row[1]
        if row.low < 0:
            lines.append(f"- {count} micro-batch(es): disturbed measurement (a step shorter than the stage's own "
                         "work, so the busy time was measured while another process slowed it); not a finding")
        elif math.isnan(row.low):
            lines.append(f"- {count} micro-batch(es): measured {row[2]:.0%} from fewer than {MIN_SAMPLES} steps: the "
                         f"spread is unknown, so the formula's {row.formula:.0%} cannot be judged against it")
        elif row.low <= row.formula <= row.high:
            lines.append(f"- {count} micro-batch(es): the formula's {row.formula:.0%} is inside the measured "
                         f"{row.low:.0%}-{row.high:.0%}: no measurable difference")
        elif row.low > row.formula:
            lines.append(f"- {count} micro-batch(es): stages waited more than the formula's {row.formula:.0%} "
                         f"(measured {row.low:.0%}-{row.high:.0%}): smaller micro-batches compute less "
                         "efficiently, the stages are not equal (the embedding, the head), and sending activations "
                         "costs time, none of which the formula counts")
        else:
            lines.append(f"- {count} micro-batch(es): stages waited less than the formula's {row.formula:.0%} "
                         f"(measured {row.low:.0%}-{row.high:.0%}), which equal stages cannot: the stages "
                         "are not equal, or the busy time was measured while another process slowed it")
    judged = table[(table["low"] >= 0) & table["low"].notna()]
    if len(judged) >= 2 and judged["high"].iloc[0] < judged["low"].iloc[-1]:
        first, last = judged.iloc[0], judged.iloc[-1]
        lines.append(
            f"- The trend runs against the formula: from {first.iloc[0]:.0f} to {last.iloc[0]:.0f} micro-batches "
            f"the measured bubble rose ({first.iloc[1]:.0%} to {last.iloc[1]:.0%}, beyond both spreads) where the "
            f"formula falls ({first.formula:.0%} to {last.formula:.0%}). Every micro-batch adds fixed costs the "
            "formula does not count (a send and a receive per stage, a launch of each stage's work, and here "
            "processes sharing cores); they outgrow what more micro-batches save when each micro-batch is this "
            "small. On GPUs, with micro-batches large enough to fill one, the formula's trend is what to expect.")
    return "\n".join(lines)


def modes_answer(table: pd.DataFrame, steps: dict[str, list[float]], on_gpus: bool) -> str:
    """Which parallelism for which limit, from the measured memory by kind (counted bytes: exact) and step times
    (compared by :func:`course_utils.observe.noise.compare`; ``on_gpus``: the ranks were GPUs, not CPU processes)."""
    by_mode = table.set_index("mode")
    state = by_mode[["parameters MiB", "gradients MiB", "optimizer_state MiB"]].sum(axis=1)
    activations = by_mode["activations MiB"]

    def listed(values: pd.Series) -> str:
        return ", ".join(f"{mode} {value:.2f} MiB" for mode, value in values.items())

    lines = [f"- **Weights, gradients and optimizer state** per rank: {listed(state)}; least under "
             f"{state.idxmin()}. FSDP shards all of it; tensor parallelism splits only the blocks' layers (the "
             "embedding, the head and the norms stay whole on every rank). When the model's state does not fit, "
             "shard it (FSDP), and add tensor parallelism when even the shards and one layer's work do not.",
             f"- **Activations** per rank: {listed(activations)}; per image of the rank's batch: "
             f"{listed(activations / by_mode['batch per rank'])}. FSDP keeps "
             "every activation of its own images (each rank runs them through the whole model); tensor "
             "parallelism keeps 1/N of the heads and hidden units of the same images, and, with sequence "
             "parallelism, 1/N of the tokens between the layers. When the activations of the smallest batch that "
             "keeps a GPU busy do not fit, or the global batch is too small to give every GPU its own images, "
             "tensor parallelism is the tool."]
    peaks = by_mode["peak MiB"].dropna() if "peak MiB" in by_mode else pd.Series(dtype=float)
    if len(peaks):
        lines.append(f"- **Peak** per rank (the allocator's high-water mark in a step: state, activations and "
                     f"the gathered or communicated buffers together): {listed(peaks)}; least under "
                     f"{peaks.idxmin()}. This is what must fit in the GPU's memory.")
    if "collectives MiB/step" in by_mode:
        talk = by_mode["collectives MiB/step"]
        lines.append(f"- **Communication** per step (rank 0, from its trace): {listed(talk)}; most under "
                     f"{talk.idxmax()}. Data parallelism moves gradients, once per step whatever the batch; "
                     "tensor parallelism moves activations in every block, forward and backward, in proportion "
                     "to the images and tokens: it belongs where bandwidth is highest, inside a node.")
    rates = {mode: Measurement.of(values).inverse() for mode, values in steps.items() if values}
    fastest = max(rates, key=lambda mode: rates[mode].median)
    verdicts = {mode: compare(rates[mode], rates[fastest]).verdict for mode in rates if mode != fastest}
    speed = f"- **Speed**: the fastest median step was {fastest}'s ({1 / rates[fastest].median:.3f} s)"
    for verdict, heading in ((SLOWER, "measurably slower:"), (ALIKE, "no measurable difference from"),
                             (UNKNOWN, "spread unknown (too few steps) for")):
        named = [mode for mode, said in verdicts.items() if said == verdict]
        speed += f"; {heading} {', '.join(named)}" if named else ""
    where = "one GPU per rank" if on_gpus else "CPU processes on a shared machine: not GPU speed"
    lines.append(f"{speed} ({where}).")
    return "\n".join(lines)


def _own_share_gradients(saved: dict[str, Any], world: int) -> list[torch.Tensor]:
    """Each rank's input gradient with no all-reduce in the backward pass: the part of the whole block's input
    gradient that flows through the rank's own hidden units (the hidden units split as the script splits them)."""
    whole = MLP(saved["up.weight"].shape[1], saved["up.weight"].shape[0])
    whole.load_state_dict({name: saved[name] for name in whole.state_dict()})
    out = whole(saved["tokens"]).detach()
    out_grad = 2 * out / out.numel()  # the gradient of the scripts' loss, out.square().mean()
    hidden = whole.up.weight.shape[0]
    shares = []
    for rank in range(world):
        own = torch.zeros(hidden)
        own[rank * hidden // world:(rank + 1) * hidden // world] = 1
        tokens = saved["tokens"].clone().requires_grad_()
        (whole.down(whole.act(whole.up(tokens)) * own) * out_grad).sum().backward()
        shares.append(tokens.grad)
    return shares


def judge_backward_collective(folder: Path) -> Check:
    """Exercise 1's judgement: with the all-reduce taken out of ``CopyToRanks.backward``, the outputs and the
    weights' gradients stay the whole block's, and each rank's input gradient is exactly its own hidden units'
    share of the whole one. Anything else names what the script that ran did instead."""
    table, ranks = check_mlp_split(folder), _rank_files(folder)
    wrong = list(table.loc[~table["same"], "tensor"])
    outputs = [name for name in wrong if name.endswith("output")]
    weights = [name for name in wrong if "input gradient" not in name and name not in outputs]
    shares = _own_share_gradients(ranks[0], len(ranks))
    own = [torch.allclose(rank["tokens_grad"], share, **TOLERANCE) for rank, share in zip(ranks, shares)]
    if not wrong:
        return Check(False, "every tensor still matches the whole block: the script that ran still all-reduces in "
                            "`CopyToRanks.backward`. If you took that all-reduce out, write the script again (run its "
                            "`%%writefile` cell) before this cell.")
    if outputs:
        return Check(False, f"the outputs differ from the whole block's ({', '.join(outputs)}): your change reached "
                            "the forward pass (the all-reduce in `SumOverRanks.forward`?). Change only "
                            "`CopyToRanks.backward`.")
    if weights:
        return Check(False, f"the weights' gradients differ too ({', '.join(weights)}): something besides "
                            "`CopyToRanks.backward` changed. Start again from the script as it was and take out only "
                            "that all-reduce.")
    if not all(own):
        return Check(False, "the input gradients are wrong, but not each rank's own share of the whole one: "
                            "`CopyToRanks.backward` should return `grad` as it came, neither zeroed nor scaled, with "
                            "only the all-reduce gone.")
    return Check(True, "only the input gradients are wrong, and each rank's is exactly the share that flows through "
                       "its own hidden units. The weights' gradients need only the whole input, which every rank has; "
                       "the input's gradient is a sum over all hidden units, which is what the all-reduce adds up.")


def check_backward_collective(script: Path, folder: Path, device: str, ranks: int = 2,
                              timeout_seconds: float = 120) -> Check:
    """Exercise 1's check: launch the learner's hand-split ``script`` into ``folder`` and judge what its ranks
    computed; the files an earlier attempt left in ``folder`` are removed first, and a failed launch is never
    judged."""
    return judge_launch(Path(folder), lambda: start_script(ranks, script, str(folder), device,
                                                           timeout_seconds=timeout_seconds),
                        judge_backward_collective)


def _apart(ours: float, theirs: float) -> bool:
    return not math.isclose(ours, theirs, rel_tol=1e-6, abs_tol=1e-9)


def check_bubble(bubble: Callable[[int, int], float]) -> Check:
    """The bubble exercise's check: the learner's formula against GPipe's exact share of idle slots, for 2 to 8
    stages and 1 to 32 micro-batches; a wrong formula is named by what it matches (the busy share, a
    percentage) or by its first figure that differs."""
    cases = [(stages, micro) for stages in range(2, 9) for micro in (1, 2, 3, 4, 8, 13, 32)]
    mine = {case: bubble(*case) for case in cases}
    exact = {case: gpipe_bubble(*case) for case in cases}
    if not all(isinstance(value, numbers.Real) for value in mine.values()):
        return Check(False, f"your function returns {mine[cases[0]]!r} for {cases[0][0]} stages and {cases[0][1]} "
                            "micro-batch: return the share as a number (a float between 0 and 1).")
    if any(math.isnan(value) for value in mine.values()):
        return Check(False, "your function returns nan: write your formula in place of `float(\"nan\")`.")
    if not any(_apart(mine[case], exact[case]) for case in cases):
        return Check(True, f"your formula gives GPipe's bubble for every count tried ({len(cases)}: 2 to 8 stages, 1 "
                           "to 32 micro-batches): of the M + S - 1 slots of a step, each stage works M and waits "
                           "S - 1.")
    stages, micro = next(case for case in cases if _apart(mine[case], exact[case]))
    said = (f"for {stages} stages and {micro} micro-batch(es) yours gives {mine[stages, micro]:.4g}, the schedule "
            f"{exact[stages, micro]:.4g}")
    if all(not _apart(mine[case], 1 - exact[case]) for case in cases):
        return Check(False, f"{said}: yours is the share a stage works, not the share it waits.")
    if all(not _apart(mine[case], 100 * exact[case]) for case in cases):
        return Check(False, f"{said}: a percentage; return the share (between 0 and 1).")
    return Check(False, f"{said}. Count the slots of the forward half: when does the last micro-batch reach the "
                        "last stage, and in how many slots does one stage work?")
