"""Prose that reads a run's own measurements, for the answer cells of notebooks 01-05."""

from __future__ import annotations

import statistics

import pandas as pd

from course_utils.observe.clocks import steady_median
from course_utils.observe.metrics import Run
from course_utils.observe.monitor import this_process_rows


def warmup(run: Run) -> str:
    """Markdown answering "why is the first epoch slower?" with this run's numbers."""
    epochs = run.epochs["seconds"].tolist()
    its = run.iterations["seconds"].tolist()
    skip = run.summary["warmup_steps"]
    first_its = its[:5]
    steady = steady_median(its, skip)
    first_mean = statistics.mean(first_its)
    lines = [f"- The very first iteration took **{its[0] * 1000:.0f} ms**; the first five averaged "
             f"**{first_mean * 1000:.0f} ms**, against a steady-state median of **{steady * 1000:.1f} ms** "
             f"({first_mean / steady:.1f}x)."]
    if len(epochs) >= 2:
        later = statistics.mean(epochs[1:])
        ratio = epochs[0] / later
        verdict = "slower than" if ratio > 1.05 else ("about as fast as" if ratio > 0.95 else "faster than")
        lines.append(f"- The first epoch took **{epochs[0]:.1f} s**, the later ones **{later:.1f} s** on "
                     f"average: the first was **{verdict}** the rest ({ratio:.2f}x).")
        extra = epochs[0] - later
        if extra > 0.05 * later:
            lines.append(f"- Warm-up therefore cost about **{extra:.1f} s** once, while one epoch costs {later:.1f} s "
                         f"every time: measure speed after warm-up, never from the first epoch.")
        else:
            lines.append("- Here the one-time costs are too small to show at the scale of an epoch (it is "
                         "noisier than they are); they show in the first iterations instead.")
        predicted = run.summary["steps_per_epoch"] * steady
        starts = run.iterations.groupby("epoch")["seconds"].first().iloc[1:]
        cfg = run.summary.get("config", {})
        restarting = cfg.get("workers", 0) > 0 and not cfg.get("persistent_workers", False)
        cause = " (its data-loader workers start anew)" if restarting else ""
        lines.append(f"- An epoch is the sum of its iterations, but not iterations x typical iteration: "
                     f"{run.summary['steps_per_epoch']} x {steady * 1000:.1f} ms = **{predicted:.1f} s**, against "
                     f"{later:.1f} s measured. The difference is the slow iterations; the first of each later "
                     f"epoch alone took **{starts.mean() * 1000:.0f} ms** on average{cause}, against "
                     f"{steady * 1000:.1f} ms typical.")
    lines.append(f"- Steady-state throughput, counted after the first {skip} iterations: "
                 f"**{run.summary['images_per_second']:.0f} images/s** on {run.summary['device']}.")
    return "\n".join(lines)


def _fits(sweep: pd.DataFrame) -> pd.DataFrame:
    return sweep[sweep["status"] == "ok"]


def model_size(sweep: pd.DataFrame) -> str:
    """Markdown: does a model with k times the parameters train k times slower? From a sweep."""
    fits = _fits(sweep)
    shared = [b for b in sorted(fits["batch_size"].unique())
              if fits[fits["batch_size"] == b]["model"].nunique() == sweep["model"].nunique()]
    if not shared:
        return "- No batch size fitted every model, so the models cannot be compared at the same batch."
    batch = shared[-1]
    rows = fits[fits["batch_size"] == batch].sort_values("parameters").to_dict("records")
    lines = [f"At batch {batch}, the largest that fitted every model:"]
    for small, large in zip(rows, rows[1:]):
        params = large["parameters"] / small["parameters"]
        work = large["training_gflops_per_image"] / small["training_gflops_per_image"]
        slower = small["images_per_second"] / large["images_per_second"]
        lines.append(f"- **{large['model']}** has **{params:.1f}x** the parameters of {small['model']} and "
                     f"**{work:.1f}x** its FLOPs per image ({large['training_gflops_per_image']:.2f} vs "
                     f"{small['training_gflops_per_image']:.2f} GFLOP per training image), and trains "
                     f"**{slower:.1f}x** slower ({large['images_per_second']:.0f} vs "
                     f"{small['images_per_second']:.0f} images/s).")
    lines.append("Parameters count weights, not work: the work per image (FLOPs, counted by PyTorch's "
                 "`FlopCounterMode`) is set by the layers times the spatial resolution they run at. Speed follows "
                 "FLOPs once the device is full; a small model may not fill it at all.")
    return "\n".join(lines)


def work_and_peak(summary: dict) -> str:
    """Markdown: the run's arithmetic per image, and how much of the device's peak it achieved (MFU)."""
    gflops = summary["training_flops_per_image"] / 1e9
    line = f"- **{gflops:.2f} GFLOP** per training image (forward and backward, PyTorch's FLOP counter)"
    if summary["mfu"] is None:
        return (f"{line}; no MFU here: the peak of {summary['device']} is not in the course's table of "
                "vendors' peaks (`course_utils.observe.flops.PEAKS`), and is not guessed.")
    achieved = summary["images_per_second"] * gflops / 1e3
    return (f"{line}: **{achieved:.1f} TFLOP/s** achieved, **{summary['mfu']:.0%}** of the "
            f"{summary['peak_tflops']:.0f} TFLOP/s dense peak ({summary['peak_source']}).")


def batch_size(sweep: pd.DataFrame) -> str:
    """Markdown: does a larger batch speed up as its memory use suggests? From a sweep."""
    lines = []
    for model, rows in sweep.groupby("model", sort=False):
        fits = _fits(rows).sort_values("batch_size")
        if len(fits) < 2:
            lines.append(f"- **{model}**: fewer than two batch sizes fitted; nothing to compare.")
            continue
        low, high = fits.iloc[0], fits.iloc[-1]
        text = (f"- **{model}**: from batch {low['batch_size']} to {high['batch_size']} "
                f"({high['batch_size'] / low['batch_size']:.0f}x), peak memory grew "
                f"**{high['peak_memory_mib'] / low['peak_memory_mib']:.1f}x** and throughput "
                f"**{high['images_per_second'] / low['images_per_second']:.2f}x**")
        failed = rows[rows["status"] != "ok"]["batch_size"]
        text += f"; batch {failed.min()} did not fit." if len(failed) else "."
        lines.append(text)
    lines.append("Memory grows with the batch because activations are stored for the backward pass; "
                 "throughput grows only until the device is busy, then stays flat.")
    return "\n".join(lines)


def timeline_reading(samples: pd.DataFrame) -> str:
    """Markdown: what a monitored run's timeline showed, training against evaluation and memory over time,
    read from its samples rather than asserted."""
    mine = this_process_rows(samples)
    training = mine[mine["phase"].str.startswith("epoch")]
    evaluation = mine[mine["phase"].str.startswith("eval")]
    busy, checking = training["utilization_percent"].mean(), evaluation["utilization_percent"].mean()
    if pd.isna(busy) or pd.isna(checking):
        lines = ["- Too few samples fell in training and in evaluation to compare them: sample more often "
                 "(`monitor_interval`) or train longer."]
    elif checking < busy - 5:
        lines = [f"- Utilization averaged **{busy:.0f} %** while training and **{checking:.0f} %** in evaluation: "
                 "evaluation is smaller work (no backward pass, no optimizer step), too little to keep the device "
                 "as busy."]
    else:
        lines = [f"- Utilization averaged **{busy:.0f} %** while training and **{checking:.0f} %** in evaluation: "
                 "here evaluation kept the device about as busy. On a CPU, PyTorch spreads even a forward pass "
                 "over every core; on a GPU, evaluation's smaller work usually shows as a drop."]
    memory = training["memory_used_mib"].dropna()
    if len(memory) >= 2:
        lines.append(f"- Memory went from **{memory.iloc[0]:.0f} MiB** at the first training sample to a peak of "
                     f"**{memory.max():.0f} MiB** and ended at {memory.iloc[-1]:.0f} MiB: on a GPU it climbs in the "
                     "first iterations and then stays flat, because PyTorch's caching allocator keeps what it once "
                     "needed instead of returning it to the device.")
    return "\n".join(lines)


def utilization_vs_power(sweep: pd.DataFrame) -> str:
    """Markdown: is high utilization full use? Compares utilization with drawn power."""
    fits = _fits(sweep).dropna(subset=["utilization_percent"])
    if fits["power_watts"].isna().all():
        notes = [note for note in fits.get("power_note", pd.Series(dtype=str)).dropna() if note]
        if notes and notes[0].startswith("secondary GCD"):
            return ("- This process runs on the **second GCD of its MI250X module**, which has no power sensor of "
                    "its own (`rocm-smi` prints `N/A (Secondary die)`): the module's power, both GCDs together, is "
                    "reported on its partner GCD. On LUMI one busy GCD brings the module to about 300 W and two "
                    "to about 500 W, against the module's 560 W limit. To read it here, ask for the module's first "
                    "GCD, or watch `rocm-smi --showpower` beside the run; the reference numbers below were recorded "
                    "on GPUs.")
        return ("- This device reports no power (on a machine without a GPU the monitor reads the CPU, which has "
                "none), so this machine cannot answer the question. On a GPU, compare the rows below, or the "
                "reference numbers recorded on GPUs.")
    busy = fits[fits["utilization_percent"] >= 0.8 * fits["utilization_percent"].max()].sort_values("power_watts")
    low, high = busy.iloc[0], busy.iloc[-1]
    limit = high["power_limit_watts"]
    return (f"- **{low['model']}** at batch {low['batch_size']} showed **{low['utilization_percent']:.0f} %** "
            f"utilization while drawing **{low['power_watts']:.0f} W**; **{high['model']}** at batch "
            f"{high['batch_size']} showed **{high['utilization_percent']:.0f} %** and drew "
            f"**{high['power_watts']:.0f} W** (limit {limit:.0f} W).\n"
            "- Utilization counts the share of time in which *some* kernel runs, however few of the compute "
            "units it keeps busy; power follows the work actually done. Near the limit, the device is full.")


def phase_answer(phases: pd.DataFrame, device_type: str) -> str:
    """Markdown: where the profiled iterations spent their time on the host clock and, with a GPU, on the
    device clock; the verdict reads the host clock for waiting on data, which the device clock cannot see."""

    def shares(column: str) -> str:
        ordered = phases.sort_values(column, ascending=False)
        return ", ".join(f"**{row.phase}** {getattr(row, column):.0f} %" for row in ordered.itertuples())

    def largest(column: str) -> str:
        return phases.sort_values(column, ascending=False).iloc[0]["phase"]

    lines = [f"- Host clock (the training process's wall time in each range): {shares('host_share_percent')}."]
    on_device = device_type == "cuda" and phases["device_share_percent"].notna().any()
    if on_device:
        lines.append(f"- Device clock (kernel time in each range): {shares('device_share_percent')}. Waiting for "
                     "a batch launches no kernel, so this clock cannot show an input-bound run; the host clock can.")
    advice = {"data": "the input pipeline is the bottleneck: the training process waits for batches (notebook 04).",
              "forward": "compute dominates, as it should; notebook 05 makes it cheaper.",
              "backward": "compute dominates, as it should (backward costs about twice forward); notebook 05 makes it "
                          "cheaper.",
              "optimizer_step": "the optimizer is unusually expensive: a fused optimizer (notebook 05) helps."}
    if largest("host_share_percent") == "data" or not on_device:
        clock, top = "host", largest("host_share_percent")
    else:
        clock, top = "device", largest("device_share_percent")
    lines.append(f"- The largest phase on the {clock} clock is `{top}`: {advice.get(top, '')}")
    return "\n".join(lines)


def holistic_trace_analysis(trace_dir, device_type: str) -> str:
    """HTA's temporal breakdown of a GPU trace, or why it was not run."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return "HolisticTraceAnalysis is not installed: pip install HolisticTraceAnalysis"
    if device_type != "cuda":
        return "This trace has no GPU kernels (it was recorded on the CPU): HTA has nothing to analyse."
    try:
        analyzer = TraceAnalysis(trace_dir=str(trace_dir))
        return analyzer.get_temporal_breakdown(visualize=False).to_string()
    except Exception as error:  # HTA's own failure modes vary by release; report them, do not stop the notebook
        return f"HTA could not analyse {trace_dir}: {error}"


def progression_answer(table: pd.DataFrame) -> str:
    """Markdown: what each precision/compilation stage bought, and whether training stayed the same."""
    ran = table[table["status"] == "ok"].reset_index(drop=True)
    lines = []
    for previous, current in zip(ran.to_dict("records"), ran.iloc[1:].to_dict("records")):
        gain = current["images_per_second"] / previous["images_per_second"]
        lines.append(f"- **{current['stage']}**: {gain:.2f}x the stage before "
                     f"({current['images_per_second']:.0f} vs {previous['images_per_second']:.0f} images/s).")
    for row in table[table["status"] != "ok"].itertuples():
        lines.append(f"- **{row.stage}**: {row.status}.")
    best = ran.loc[ran["images_per_second"].idxmax()]
    lines.append(f"- Fastest: **{best['stage']}** at **{best['speedup']:.2f}x** the fp32 baseline.")
    lines.append(_energy(ran, best))
    lines += _compile_cost(ran)
    lines.append(_same_training(ran))
    return "\n".join(lines)


def _energy(ran: pd.DataFrame, best: pd.Series) -> str:
    """Joules per image of the baseline and of the fastest stage, or why there are none."""
    energy = ran["joules_per_image"] if "joules_per_image" in ran else pd.Series(dtype=float)
    if energy.isna().all():
        return ("- **Energy**: not measured here: this device reports no power (a CPU, or an MI250X's second GCD). "
                "With NVML or AMD SMI the table gives each stage's joules per image.")
    base = ran.iloc[0]
    return (f"- **Energy**: **{best['joules_per_image']:.3f} J** per image at the fastest stage against "
            f"**{base['joules_per_image']:.3f} J** in fp32 ({base['joules_per_image'] / best['joules_per_image']:.2f}x "
            "less): a faster step at similar power costs less energy per image.")


SAME_LOSS = 0.05  # final training losses within 5 % of the baseline's: rounding, not another training
SAME_TOP1_POINTS = 3.0


def _compile_cost(ran: pd.DataFrame) -> list[str]:
    """The first iteration of the compile stage against the stage before it, which pays the same kernel
    search and lazy start-up: the difference is what compilation cost."""
    stages = ran["stage"].tolist()
    compiled = next((i for i, stage in enumerate(stages) if "torch.compile" in stage), None)
    if not compiled:
        return []
    before, after = ran.iloc[compiled - 1]["first_iteration_s"], ran.iloc[compiled]["first_iteration_s"]
    return [f"- **torch.compile**'s first iteration took **{after:.1f} s** against {before:.1f} s for the stage "
            f"before, which pays the same kernel search and start-up: about **{after - before:.1f} s** of it is "
            "compilation, paid once per process and input shape."]


def _same_training(ran: pd.DataFrame) -> str:
    """Whether the stages trained the same model, judged from the measured spread, not assumed."""
    base = ran.iloc[0]
    loss_gap = (ran["final_train_loss"] - base["final_train_loss"]).abs() / base["final_train_loss"]
    top1_gap = (ran["test_top1"] - base["test_top1"]).abs()
    worst = ran.loc[(loss_gap / SAME_LOSS).combine(top1_gap / SAME_TOP1_POINTS, max).idxmax()]
    spread = (f"final training losses within **{loss_gap.max():.1%}** of the baseline's "
              f"{base['final_train_loss']:.3f}, test top-1 within **{top1_gap.max():.1f}** points")
    if loss_gap.max() <= SAME_LOSS and top1_gap.max() <= SAME_TOP1_POINTS:
        return (f"- Same training? Yes: {spread} (the bar: {SAME_LOSS:.0%} and {SAME_TOP1_POINTS:.0f} points). "
                "Lower precision changed the rounding, not what was learned.")
    return (f"- Same training? Not shown: {spread}, past the bar of {SAME_LOSS:.0%} and {SAME_TOP1_POINTS:.0f} "
            f"points; furthest is **{worst['stage']}** (loss {worst['final_train_loss']:.3f}, top-1 "
            f"{worst['test_top1']:.1f} %). Short runs spread more than long ones; with fp16, check that the "
            "GradScaler ran (an underflowing gradient stalls learning).")


def loaders_answer(comparison: pd.DataFrame, best_setting: dict) -> str:
    """Markdown: is the run input-bound or compute-bound, per loader, and what fixes it."""
    lines = []
    for row in comparison.itertuples():
        if str(row.verdict).startswith("not available"):
            lines.append(f"- **{row.loader}**: {row.verdict}")
            continue
        line = (f"- **{row.loader}**: {row.verdict}; the loader alone delivers {row.io:.0f} images/s against "
                f"the model's {row.synthetic:.0f}, and training reaches **{row.full_over_synthetic:.0%}** of "
                f"what the model alone could do.")
        if row.verdict == "not overlapped":
            line += (f" Fast enough on its own, its work still adds **{row.loading_us_per_image:.0f} us** to each "
                     f"image's {1e6 / row.synthetic:.0f} us of training, because it is not hidden behind the step.")
        lines.append(line)
    setting = ", ".join(f"{k}={v}" for k, v in best_setting.items())
    lines.append(f"- Recommended DataLoader setting here (the fewest workers whose training throughput is within "
                 f"5 % of the best): {setting}.")
    return "\n".join(lines)
