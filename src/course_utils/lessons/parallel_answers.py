"""Answer cells of notebooks 06-09 (data parallelism, scaling, sharding), written from the tables just measured."""

from __future__ import annotations

import pandas as pd


def dataparallel_answer(modes: pd.DataFrame, gpus: int) -> str:
    """Markdown: what DataParallel bought over one device, and where its memory went."""
    one, dp = modes.iloc[0], modes[modes["mode"].str.startswith("DataParallel")].iloc[0]
    if gpus < 2:
        return (f"- This machine has **{gpus} GPU(s)**, so DataParallel had nothing to split: the run measures its "
                f"wrapper alone, **{dp['images_per_second']:.0f}** images/s against **{one['images_per_second']:.0f}** "
                f"without it ({dp['speedup']:.2f}x; short runs vary by several percent). On 2 or more GPUs the "
                "notebook measures the real thing (on LUMI: a Jupyter session or job with 2 or more GCDs); the "
                "recorded table below shows it.")
    memory = dp["peak_memory_per_device_mib"]
    others = sum(memory[1:]) / len(memory[1:])
    return "\n".join([
        f"- DataParallel over **{dp['devices']} GPUs** ran at **{dp['images_per_second']:.0f}** images/s, "
        f"{dp['speedup']:.2f}x one GPU where {dp['devices']}x would be ideal "
        f"({dp['speedup'] / dp['devices']:.0%} efficiency).",
        f"- GPU 0 peaked at **{memory[0]:.0f} MiB** against **{others:.0f} MiB** on average on the others "
        f"({memory[0] / others:.2f}x): it holds the master copy of the model, gathers every output, computes the "
        "loss and reduces the gradients, while the others only hold a replica and their slice.",
        "- Every step, one Python process scatters the batch, copies the weights to every GPU, runs the replicas in "
        "threads (which take turns on the GIL) and gathers the results: that serial work grows with the GPU count.",
    ])


def dataparallel_phases_answer(phases: pd.DataFrame | None, gpus: int) -> str:
    """Markdown: where a DataParallel step goes, from :func:`data_parallel.dataparallel_profile`'s table, or what
    that profile would show where there are fewer than two GPUs."""
    if phases is None:
        return (f"- With **{gpus} GPU(s)** here DataParallel calls the model directly: there is no scatter, "
                "replicate or gather to profile. On 2 or more GPUs this cell traces a few DataParallel steps and "
                "tabulates the host's time in each phase of a step: *scatter* (the batch cut and copied to each GPU), "
                "*replicate* (the weights copied from GPU 0 to every GPU, in every step), *parallel_apply* (the "
                "replicas' forward passes in threads that take turns on the GIL), *gather* (the outputs back to "
                "GPU 0), and in the backward pass the gradients summed into GPU 0 and the output gradients "
                "scattered; and the GPUs' time copying between devices. Replicate and the reductions grow with the "
                "model and the GPU count and are driven by one process: that is what DDP removes. To see it, ask "
                "for 2 or more GPUs (on LUMI, a Jupyter session or job with 2 or more GCDs).")
    ms = dict(zip(phases["phase"], phases["ms"]))
    moving = sum(ms[name] for name in ("scatter", "replicate", "gather", "reduce_gradients", "scatter_gradients"))
    return "\n".join([
        f"- A DataParallel step over **{gpus} GPUs** took **{ms['whole step']:.1f} ms**. Moving data, all driven by "
        f"one process: scatter {ms['scatter']:.1f} ms, replicate {ms['replicate']:.1f} ms, gather "
        f"{ms['gather']:.1f} ms, gradients reduced into GPU 0 {ms['reduce_gradients']:.1f} ms, output gradients "
        f"scattered {ms['scatter_gradients']:.1f} ms: **{moving:.1f} ms, {100 * moving / ms['whole step']:.0f} %** of "
        f"the step (host time; the GPUs spent {ms['gpu_copies']:.1f} ms copying).",
        f"- The replicas' forward passes (parallel_apply, threads that share the GIL) took {ms['parallel_apply']:.1f} "
        "ms of the host's time.",
        "- DDP copies the model once at start-up, each rank loads its own batch and computes its own loss, and only "
        "gradients travel, all-reduced while the backward pass goes on: none of the phases above is in its step "
        "(notebook 07 measures what it pays instead).",
    ])


def equivalence_answer(table: pd.DataFrame) -> str:
    """Markdown: is DDP on N ranks the same training as one process with an N-times batch?"""
    lines = []
    for row in table.itertuples():
        verdict = "the same within float rounding" if row.agree else "different"
        lines.append(f"- **{row.model}**, {row.ddp} vs {row.compared_with}: largest difference "
                     f"**{row.max_abs_difference:.2e}** "
                     f"({row.relative_to_largest_weight:.1e} of the largest weight): {verdict}.")
    lines.append("- Without BatchNorm, DDP averages the gradients of N equal shares, which is the gradient of their "
                 "union: the large-batch gradient. With BatchNorm, each rank normalises with the statistics of its own "
                 "share, so the forward pass itself differs; SyncBatchNorm (`--sync-bn`, GPUs only) computes them over "
                 "the global batch and restores the equivalence, at the cost of one more all-reduce per layer.")
    return "\n".join(lines)


def knobs_answer(knobs: pd.DataFrame) -> str:
    """Markdown: what each DDP setting did to throughput here."""
    lines = [f"- **{row.setting}**: {row.images_per_second:.0f} images/s ({row.relative:.2f}x the defaults)."
             for row in knobs.itertuples()]
    lines.append("- Differences of a few percent are within the run-to-run spread of short runs. The knobs matter "
                 "when communication is expensive: many small buckets cost latency, huge ones start the all-reduce "
                 "late; bucket views save a copy of every gradient; accumulation all-reduces once per N batches.")
    return "\n".join(lines)


def scaling_answer(tables: dict[str, pd.DataFrame]) -> str:
    """Markdown: how well each study scaled, at its largest rank count."""
    lines = []
    for name, table in tables.items():
        last = table.iloc[-1]
        lines.append(f"- **{name}**: {int(last['ranks'])} ranks gave **{last['speedup']:.2f}x** the throughput of "
                     f"{int(table.iloc[0]['ranks'])} ({last['efficiency']:.0%} efficiency), global batch "
                     f"{int(last['global_batch'])}.")
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


def memory_ladder_answer(ladder: pd.DataFrame, where: str) -> str:
    """Markdown: what sharding saved per rank and what activation checkpointing traded, from the ladder."""
    rows = ladder.set_index("rung")
    ddp, fsdp, recomputed = (rows.loc[name] for name in ("DDP", "FSDP", "FSDP + activation checkpointing"))
    state = ["parameters_mib", "gradients_mib", "optimizer_state_mib"]
    ddp_state, fsdp_state = ddp[state].sum(), fsdp[state].sum()
    recompute_change = recomputed["images_per_second"] / fsdp["images_per_second"] - 1
    fsdp_change = fsdp["images_per_second"] / ddp["images_per_second"] - 1
    noise = " (faster here: short runs vary by several percent, and this difference is within that)"
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
        f"**{recomputed['images_per_second']:.0f}** images/s against **{fsdp['images_per_second']:.0f}** "
        f"({recompute_change:+.0%}){noise if recompute_change > 0 else ''}.",
        f"- FSDP ran at **{fsdp['images_per_second']:.0f}** images/s against DDP's **{ddp['images_per_second']:.0f}** "
        f"({fsdp_change:+.0%}). Per step it all-gathers every block's parameters twice (forward and backward) and "
        "reduce-scatters the gradients, about 1.5 times the bytes of DDP's all-reduce; what that costs depends on "
        "how much of it hides behind the computation, which is what the recorded GPU rows below show.",
    ]
    if "skipped" in rows and rows["skipped"].notna().any():
        skipped = rows[rows["skipped"].notna()]
        lines.append("- Not measured here: " + "; ".join(f"{name} ({why})" for name, why in skipped["skipped"].items()))
    return "\n".join(lines)


def communication_answer(table: pd.DataFrame, where: str, on_gpus: bool) -> str:
    """Markdown: how much of a DDP step is communication and how much of it hid, from the traced runs."""
    lines = [f"- Where the ranks ran: {where}. Each row is the median of rank 0's traced steps."]
    hidden = (table["hidden_ms"] / table["communication_ms"]).fillna(0.0)
    for row, share in zip(table.itertuples(), hidden):
        lines.append(
            f"- Buckets of **{row.bucket_cap_mb:g} MB** (about {row.buckets} for {row.gradient_mib:.1f} MiB of "
            f"gradients): a step of **{row.step_ms:.1f} ms** held **{row.communication_ms:.1f} ms** of all-reduce "
            f"({row.communication_percent:.1f} % of the step), of which **{share:.0%}** ran while computation went "
            f"on; **{row.exposed_ms:.1f} ms** ({row.exposed_percent:.1f} %) was exposed: DDP's overhead per step.")
    lines.append("- One bucket can be all-reduced only when the backward pass has produced the last gradient; "
                 "smaller buckets start as soon as their layers' gradients are ready, while the backward pass "
                 "goes on.")
    if hidden.iloc[-1] > hidden.iloc[0] + 0.1:
        lines.append(f"- Measured: the smaller buckets hid **{hidden.iloc[-1]:.0%}** of the communication against "
                     f"**{hidden.iloc[0]:.0%}** with one large bucket.")
    elif on_gpus:
        lines.append("- Measured: the smaller buckets did not hide more here; each all-reduce also has a fixed cost, "
                     "and many small ones can cost more than they hide (that is why the default is 25 MB).")
    else:
        lines.append("- Measured: the smaller buckets did not hide more here. CPU processes cannot show the overlap: "
                     "each rank's gloo thread needs the same cores that its training thread computes on, and waits "
                     "for the other rank, which shares them too. On GPUs NCCL/RCCL run on their own stream beside "
                     "the compute kernels: run this notebook on 2 or more GPUs to see the overlap.")
    return "\n".join(lines)
