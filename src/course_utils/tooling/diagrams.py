"""No notebook: the diagrams of the lessons, drawn by code into img/ (notebooks 06, 07, 08 and 09 show them):
DataParallel against DDP, the ring all-reduce, a LUMI-G node, FSDP's sharding.

``make figures`` (``python -m course_utils.tooling.diagrams img``) writes them as PNG files; the same code
always draws the same picture, so a change to a diagram is a change to this file. The ring all-reduce is
drawn from a simulation of the algorithm, and the LUMI-G node from the binding the job scripts use.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from course_utils.atomic_files import write_atomic

DPI = 110
RANK_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")

# LUMI-G: the CCD (8 cores, one L3 cache) wired to each GCD. From LUMI's documentation ("Distribution and
# binding options", GPU binding): `srun --cpu-bind=map_cpu:49,57,17,25,1,9,33,41` gives GCD i the i-th core,
# and core c lies on CCD c // 8. The first core of every CCD is kept for the system (56 cores for jobs).
LUMI_GCD_CCD = (6, 7, 2, 3, 0, 1, 4, 5)
LUMI_CORES_PER_CCD = 8


def lumi_job_cores(gcd: int) -> list[int]:
    """The 7 cores a job on LUMI-G binds to GCD ``gcd``: its CCD's cores less the system's first one."""
    first = LUMI_GCD_CCD[gcd] * LUMI_CORES_PER_CCD
    return list(range(first + 1, first + LUMI_CORES_PER_CCD))


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str = "", color: str = "white",
         edge: str = "0.3", fontsize: float = 9, **text_options) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.01,rounding_size=0.08", facecolor=color,
                                edgecolor=edge, lw=1))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, **text_options)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], color: str = "0.25",
           style: str = "-|>", curve: float = 0.0, lw: float = 1.2) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, lw=lw,
                                 connectionstyle=f"arc3,rad={curve}", shrinkA=2, shrinkB=2))


def _canvas(ax: Axes, width: float, height: float, title: str) -> None:
    ax.set(xlim=(0, width), ylim=(0, height), aspect="equal")
    ax.axis("off")
    ax.set_title(title, fontsize=11, loc="left")


def data_parallel_vs_ddp(devices: int = 4) -> Figure:
    """One step of DataParallel (one process, everything through GPU 0) beside one of DDP (a process per GPU,
    only gradients travel, in an all-reduce)."""
    fig, (dp, ddp) = plt.subplots(1, 2, figsize=(12, 5.6))
    width, height = 10.0, 8.4
    _canvas(dp, width, height, "nn.DataParallel: one process, threads")
    _canvas(ddp, width, height, "DistributedDataParallel: one process per GPU")
    column = width / devices
    xs = [column * i + 0.15 for i in range(devices)]
    box_w = column - 0.3

    _box(dp, 0.15, 7.3, width - 0.3, 0.8, "one Python process: loads the batch of B x GPUs images, holds the model",
         color="#eeeeee")
    dp.text(0.15, 6.75, "1 scatter the batch, 2 replicate the weights from GPU 0: every step", fontsize=8,
            color="0.25")
    for i, x in enumerate(xs):
        color, middle = RANK_COLORS[i], x + box_w / 2
        _box(dp, x, 5.0, box_w, 1.1, f"GPU {i}\nslice {i}", color="#f4f4f4", edge=color, fontsize=8)
        _box(dp, x, 3.3, box_w, 1.1, f"replica {i}\nforward\n(thread {i})", color="#f4f4f4", edge=color, fontsize=8)
        _arrow(dp, (width / 2, 7.3), (middle, 6.1), color=color)
        _arrow(dp, (middle, 5.0), (middle, 4.4), color=color)
        _arrow(dp, (middle, 3.3), (middle, 2.5), color=color)
    dp.text(0.15, 2.75, "3 gather", fontsize=8, color="0.25")
    _box(dp, 0.15, 1.3, width - 0.3, 1.2,
         "GPU 0: the outputs, the loss; backward in reverse;\n4 the gradients summed, the optimizer step on the "
         "one real model", color="#fbe3d6", edge=RANK_COLORS[0], fontsize=8.5)
    dp.text(width / 2, 0.55, "GPU 0 does more and holds more; every step passes through one process and its GIL",
            ha="center", fontsize=8.5, style="italic")

    for i, x in enumerate(xs):
        color, middle = RANK_COLORS[i], x + box_w / 2
        _box(ddp, x, 6.9, box_w, 1.1, f"process {i}\nits share of\nthe data", color="#f4f4f4", edge=color,
             fontsize=8)
        _box(ddp, x, 5.0, box_w, 1.1, f"GPU {i}: model\nforward, loss", color="#f4f4f4", edge=color, fontsize=8)
        _box(ddp, x, 3.3, box_w, 1.1, "backward\ngradients\nin buckets", color="#f4f4f4", edge=color, fontsize=8)
        _box(ddp, x, 0.9, box_w, 1.1, "optimizer\nstep", color="#f4f4f4", edge=color, fontsize=8)
        _arrow(ddp, (middle, 6.9), (middle, 6.1), color=color)
        _arrow(ddp, (middle, 5.0), (middle, 4.4), color=color)
        _arrow(ddp, (middle, 3.3), (middle, 2.0), color=color)
    _box(ddp, 0.15, 2.3, width - 0.3, 0.65, "all-reduce: every rank gets the average of all gradients,\n"
         "bucket by bucket while backward goes on", color="#e2f0d9", edge="#55a868", fontsize=8)
    ddp.text(width / 2, 0.3, "the model is copied once at the start; only gradients travel",
             ha="center", fontsize=8.5, style="italic")
    fig.tight_layout()
    return fig


def ring_allreduce_states(ranks: int) -> list[list[list[frozenset[int]]]]:
    """The ring all-reduce simulated: for every state (the start, then after each of its 2(N-1) steps), which
    ranks' contributions each rank holds in each chunk. In reduce-scatter step s, rank r sends chunk
    (r - s) mod N to rank r+1, which adds it to its own; in all-gather step s, rank r sends its complete chunk
    (r + 1 - s) mod N on, and the receiver keeps it."""
    held = [[frozenset({rank}) for _ in range(ranks)] for rank in range(ranks)]
    states = [[list(row) for row in held]]
    for step in range(ranks - 1):
        sent = [(rank, (rank - step) % ranks, held[rank][(rank - step) % ranks]) for rank in range(ranks)]
        for rank, chunk, part in sent:
            receiver = (rank + 1) % ranks
            held[receiver][chunk] = held[receiver][chunk] | part
        states.append([list(row) for row in held])
    for step in range(ranks - 1):
        sent = [(rank, (rank + 1 - step) % ranks, held[rank][(rank + 1 - step) % ranks]) for rank in range(ranks)]
        for rank, chunk, part in sent:
            held[(rank + 1) % ranks][chunk] = part
        states.append([list(row) for row in held])
    return states


def ring_allreduce(ranks: int = 4) -> Figure:
    """Every rank's chunks through the ring all-reduce's reduce-scatter and all-gather: the darker a chunk, the
    more ranks' gradients it sums. Each rank sends 2(N-1) chunks of 1/N: the bus bandwidth's 2(N-1)/N."""
    states = ring_allreduce_states(ranks)
    fig, axes = plt.subplots(2, ranks, figsize=(3.0 * ranks, 6.6))
    titles = (["start: each rank its own gradients"] +
              [f"reduce-scatter step {s}" for s in range(1, ranks)] +
              [f"all-gather step {s}" for s in range(1, ranks)] + ["every rank holds the sum"])
    panels = list(range(ranks)) + list(range(ranks, 2 * ranks - 1)) + [2 * ranks - 2]
    for ax, state_index, title in zip(axes.flat, panels, titles):
        state = states[state_index]
        ax.set(xlim=(-0.6, ranks + 0.2), ylim=(-0.4, ranks + 0.2), aspect="equal")
        ax.axis("off")
        ax.set_title(title, fontsize=9.5)
        for rank, chunks in enumerate(state):
            y = ranks - 1 - rank
            ax.text(-0.5, y + 0.45, f"rank {rank}", ha="left", va="center", fontsize=8, color=RANK_COLORS[rank])
            for chunk, part in enumerate(chunks):
                share = len(part) / ranks
                ax.add_patch(plt.Rectangle((chunk + 0.22, y + 0.05), 0.86, 0.8, facecolor=plt.cm.Blues(
                    0.15 + 0.75 * share), edgecolor="0.3", lw=0.8))
                label = "all" if len(part) == ranks else "+".join(map(str, sorted(part)))
                ax.text(chunk + 0.65, y + 0.45, label, ha="center", va="center", fontsize=6.5,
                        color="white" if share > 0.6 else "black")
        for chunk in range(ranks):
            ax.text(chunk + 0.65, -0.2, f"chunk {chunk}", ha="center", fontsize=7, color="0.4")
    fig.suptitle(f"Ring all-reduce over {ranks} ranks: each sends one chunk to the next rank per step "
                 f"(rank r to r+1, the last to rank 0)", fontsize=11)
    fig.tight_layout()
    return fig


def lumi_g_node() -> Figure:
    """A LUMI-G node: the CPU's 8 CCDs in 4 NUMA domains, 4 MI250X modules of 2 GCDs each, and the CCD each
    GCD is wired to, whose 7 job cores the job scripts bind its process to."""
    fig, ax = plt.subplots(figsize=(12, 6.4))
    width, height = 16.0, 8.4
    _canvas(ax, width, height, "A LUMI-G node: 1 AMD EPYC CPU (64 cores, 8 CCDs), 4 MI250X = 8 GCDs")
    _box(ax, 0.2, 4.9, width - 0.4, 3.0, color="#f6f6f6")
    ax.text(0.35, 7.6, "CPU: 4 NUMA domains, 2 CCDs each; a CCD is 8 cores sharing an L3 cache", fontsize=9,
            va="center")
    ccd_w, ccd_gap = 1.6, 0.22
    ccd_x = {}
    for numa in range(4):
        x0 = 0.45 + numa * 2 * (ccd_w + ccd_gap) + numa * 0.15
        _box(ax, x0 - 0.1, 5.05, 2 * ccd_w + ccd_gap + 0.2, 2.3, color="#ffffff", edge="0.6")
        ax.text(x0 + ccd_w + ccd_gap / 2, 7.1, f"NUMA {numa}", ha="center", fontsize=8.5, color="0.35")
        for k in range(2):
            ccd = 2 * numa + k
            x = x0 + k * (ccd_w + ccd_gap)
            ccd_x[ccd] = x + ccd_w / 2
            cores = lumi_job_cores(LUMI_GCD_CCD.index(ccd))  # what the job scripts bind the GCD on this CCD to
            _box(ax, x, 5.2, ccd_w, 1.6, f"CCD {ccd}\ncores {cores[0]}-{cores[-1]}\n(core {cores[0] - 1}: system)",
                 color="#e8eef7", edge="#4c72b0", fontsize=8)
    module_w, gcd_w = 3.5, 1.5
    for module in range(4):
        x0 = 0.5 + module * (module_w + 0.4)
        _box(ax, x0, 0.5, module_w, 2.4, color="#fdf1e8", edge="#dd8452")
        ax.text(x0 + module_w / 2, 0.75, f"MI250X {module}  (GCDs linked in the package)", ha="center",
                fontsize=7.5, color="0.3")
        for k in range(2):
            gcd = 2 * module + k
            x = x0 + 0.2 + k * (gcd_w + 0.1)
            _box(ax, x, 1.1, gcd_w, 1.5, f"GCD {gcd}\n64 GB HBM\nrank {gcd}", color="white", edge="#dd8452",
                 fontsize=8)
            ccd = LUMI_GCD_CCD[gcd]
            _arrow(ax, (x + gcd_w / 2, 2.6), (ccd_x[ccd], 5.2), color=RANK_COLORS[gcd], style="<|-|>", lw=1.4)
    ax.text(width / 2, 0.05, "GCD i is wired to CCD " + ", ".join(f"{gcd}→{ccd}" for gcd, ccd in
                                                                      enumerate(LUMI_GCD_CCD)) +
            ": task i binds to that CCD's 7 cores (jobs/lumi/lumi_env.sh) and sees only GCD i (select_gcd.sh)",
            ha="center", fontsize=8.5)
    fig.tight_layout()
    return fig


def fsdp_sharding(ranks: int = 4, units: int = 3) -> Figure:
    """What each rank holds under DDP and under FSDP, and one FSDP step: every unit's parameters are
    all-gathered just before its forward and its backward and freed after, its gradients reduce-scattered,
    and each rank updates only its shard."""
    fig, (held, step) = plt.subplots(1, 2, figsize=(15, 4.8), gridspec_kw={"width_ratios": [1, 1.75]})
    _canvas(held, 10, 8.2, "What each rank holds")
    kinds = ("parameters", "gradients", "optimizer state")
    for side, (title, sharded) in enumerate((("DDP", False), ("FSDP", True))):
        x0 = 0.3 + side * 5.0
        held.text(x0 + 2.1, 7.6, title, ha="center", fontsize=10, weight="bold")
        for rank in range(ranks):
            y = 6.4 - rank * 1.55
            held.text(x0 - 0.1, y + 0.55, f"rank {rank}", ha="right", fontsize=7.5, color=RANK_COLORS[rank],
                      rotation=90, va="center")
            for row in range(len(kinds)):
                for shard in range(ranks):
                    mine = not sharded or shard == rank
                    held.add_patch(plt.Rectangle((x0 + shard * 1.05, y + 0.75 - row * 0.38), 1.0, 0.32,
                                                 facecolor=RANK_COLORS[shard] if mine else "white",
                                                 alpha=0.85 if mine else 1.0, edgecolor="0.6", lw=0.6))
    held.text(5.0, 0.25, "rows per rank: parameters, gradients, optimizer state; columns: the 4 shards.\n"
              "FSDP keeps 1/N of each on every rank", ha="center", fontsize=8)

    _canvas(step, 19, 8.2, "One FSDP step on every rank (units: groups of layers)")
    rows = [("forward", [("all-gather", "#e2f0d9"), ("forward", "#e8eef7"), ("free", "#eeeeee")]),
            ("backward", [("all-gather", "#e2f0d9"), ("backward", "#fbe3d6"), ("reduce-scatter", "#fff2cc"),
                          ("free", "#eeeeee")])]
    y = 5.8
    for phase, stages in rows:
        order = range(units) if phase == "forward" else reversed(range(units))
        step.text(0.2, y + 0.45, phase, fontsize=9, weight="bold", va="center")
        x = 1.9
        for unit in order:
            for name, color in stages:
                w = 0.55 + 0.08 * len(name)
                _box(step, x, y, w, 0.9, f"{name}\nunit {unit}", color=color, fontsize=7)
                x += w + 0.05
            x += 0.25
        y -= 1.9
    _box(step, 1.9, y + 0.5, 15.0, 0.9, "optimizer step: each rank updates only its own shard of the parameters",
         color="#f4f4f4", fontsize=8.5)
    step.text(9.5, 0.9, "all-gather: every rank gets the whole unit from the others' shards;\n"
              "reduce-scatter: the gradients are summed and each rank keeps its shard", ha="center", fontsize=8)
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "dataparallel_vs_ddp": data_parallel_vs_ddp,
    "ring_allreduce": ring_allreduce,
    "lumi_g_node": lumi_g_node,
    "fsdp_sharding": fsdp_sharding,
}


def save_png(fig: Figure, path: Path) -> Path:
    """``fig`` as a PNG file written whole, without matplotlib's version stamp: the same drawing, the same bytes."""
    return write_atomic(path, lambda stream: fig.savefig(stream, format="png", dpi=DPI, metadata={"Software": None}))


def write_all(folder: Path) -> list[Path]:
    """Draw every figure into ``folder`` as ``NAME.png``."""
    written = []
    for name, draw in FIGURES.items():
        fig = draw()
        written.append(save_png(fig, Path(folder) / f"{name}.png"))
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw the lessons' diagrams (make figures).")
    parser.add_argument("folder", type=Path, help="where the PNG files go (the repository keeps them in img/)")
    for path in write_all(parser.parse_args(argv).folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
