"""Prose that reads a run's own measurements, for the notebooks' answer cells."""

from __future__ import annotations

import statistics

from course_utils.metrics import Run


def warmup(run: Run) -> str:
    """Markdown answering "why is the first epoch slower?" with this run's numbers."""
    epochs = run.epochs["seconds"].tolist()
    its = run.iterations["seconds"].tolist()
    skip = run.summary["warmup_steps"]
    first_its = its[:5]
    steady = statistics.median(its[skip:] or its)
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
                     f"epoch alone took **{starts.mean() * 1000:.0f} ms** on average{cause}, against {steady * 1000:.1f} ms typical.")
    lines.append(f"- Steady-state throughput, counted after the first {skip} iterations: "
                 f"**{run.summary['images_per_second']:.0f} images/s** on {run.summary['device']}.")
    return "\n".join(lines)
