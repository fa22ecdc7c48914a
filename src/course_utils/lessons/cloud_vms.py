"""Notebook 08: one cloud VM against two at the same batch per GPU, set beside a class that did the same
(and jobs/cloud/README.md's experiment).

That class trained a ResNet on ImageNet with DDP and AMP on AWS ``g4dn.2xlarge`` VMs (one NVIDIA T4 each) in
NVIDIA's NGC PyTorch container: 57 min 32 s on one VM, 31 min 18 s on two, both GPUs above 95 % utilization.
Its numbers are reported, not measured by this course; the learner's row comes from two runs' ``summary.json``.

    python -m course_utils.lessons.cloud_vms runs/cloud-1vm runs/cloud-2vm
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from course_utils import config
from course_utils.parallel import launched_processes, process_group
from course_utils.run_folder import RunFolder

CLASS_RESULT = {"who": "the class (2 x g4dn.2xlarge)", "device": "NVIDIA T4", "vms": (1, 2),
                "seconds": (57 * 60 + 32, 31 * 60 + 18), "utilization": "GPUs above 95 % on both"}


def utilization_per_node(summary: dict[str, Any]) -> str:
    """Each node's mean utilization while training, as its own monitor sampled it (``--monitor``): the devices
    this run used there, GPUs on GPU machines, the processor on a CPU."""
    nodes = summary.get("node_utilization") or []
    if not nodes:
        return "not sampled (--monitor)"
    return ", ".join(f"node {node['node_rank']}: " + (f"{node['utilization_percent']:.0f} %"
                                                      if node["utilization_percent"] is not None else "not readable")
                     for node in nodes)


def _row(who: str, device: str, vms: tuple[int, int], seconds: tuple[float, float], utilization: str
         ) -> dict[str, Any]:
    speedup = seconds[0] / seconds[1]
    return {"who": who, "device": device, "seconds_fewer_vms": seconds[0], "seconds_more_vms": seconds[1],
            "speedup": speedup, "ideal": vms[1] / vms[0], "efficiency": speedup / (vms[1] / vms[0]),
            "utilization": utilization}


def side_by_side(small: dict[str, Any], large: dict[str, Any]) -> pd.DataFrame:
    """The class's row and this run's: wall time of the training epochs on fewer and more VMs, speed-up and
    efficiency; ``small`` and ``large`` are the two runs' summaries (same batch per GPU)."""
    if small["config"]["batch_size"] != large["config"]["batch_size"]:
        raise ValueError(f"the runs differ in batch per GPU ({small['config']['batch_size']} and "
                         f"{large['config']['batch_size']}): rerun one with the other's --batch-size")
    ranks = (small["world_size"], large["world_size"])
    seconds = (sum(small["epoch_seconds"]), sum(large["epoch_seconds"]))
    ours = f"this run ({ranks[0]} and {ranks[1]} ranks)"
    return pd.DataFrame([_row(CLASS_RESULT["who"], CLASS_RESULT["device"], CLASS_RESULT["vms"], CLASS_RESULT["seconds"],
                              CLASS_RESULT["utilization"]),
                         _row(ours, large["device"], ranks, seconds, utilization_per_node(large))])


def answer(table: pd.DataFrame) -> str:
    """Markdown: the class's speed-up beside this run's, read from :func:`side_by_side`'s table."""
    theirs, ours = table.iloc[0], table.iloc[1]
    lines = [
        f"- The class: **{theirs['speedup']:.2f}x** from one VM to two ({theirs['efficiency']:.0%} efficiency), "
        f"{theirs['seconds_fewer_vms'] / 60:.1f} min against {theirs['seconds_more_vms'] / 60:.1f} min.",
        f"- This run: **{ours['speedup']:.2f}x** ({ours['efficiency']:.0%}), {ours['seconds_fewer_vms']:.1f} s against "
        f"{ours['seconds_more_vms']:.1f} s of training epochs; utilization while training, on more VMs: "
        f"{ours['utilization']}.",
    ]
    if ours["device"] == "CPU":
        lines.append("- Here both \"VMs\" are CPU processes of one machine sharing its cores, so the second one adds "
                     "no hardware: the run shows that the recipe's rendezvous, data and DDP work, not what a "
                     "second GPU buys, and each node's monitor reads the same shared processor. On two real VMs "
                     "the same commands give the class's kind of numbers, and each VM's monitor its own GPU.")
    return "\n".join(lines)


def local_vms(vms: int, out: str | Path, *flags: str, port: int | None = None, timeout: float = 600) -> dict[str, Any]:
    """``jobs/cloud/run_node.sh FLAGS --out OUT`` started ``vms`` times on this machine, as that many VMs with one
    process each that meet through c10d, the way the recipe runs on real VMs; the run's summary. Past ``timeout``
    seconds, or on an interrupt, every process of the VMs is ended (:mod:`course_utils.parallel.launched_processes`)."""
    launched = launched_processes.Launch()
    env = {**os.environ, "HEAD": "127.0.0.1", "PORT": str(port or process_group.free_port()), "NNODES": str(vms),
           "NPROC_PER_NODE": "1", "COURSE_VENV": sys.prefix, "RUN_ID": f"{Path(out).name}-{os.getpid()}",
           **launched.marker}
    script = config.checkout_root() / "jobs" / "cloud" / "run_node.sh"
    nodes = launched.started
    nodes += [subprocess.Popen([str(script), *flags, "--out", str(out)], cwd=config.checkout_root(), env=env,
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
              for _ in range(vms)]
    deadline = time.monotonic() + timeout
    try:
        outputs = [node.communicate(timeout=max(0.0, deadline - time.monotonic()))[0] for node in nodes]
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the {vms} VMs ran past {timeout:g} s, and were ended: {launched.end()}") from None
    except KeyboardInterrupt:
        print(f"interrupted: {launched.end()}", file=sys.stderr)
        raise
    finally:
        launched.end_leftovers()
        for node in nodes:
            node.stdout.close()
    failed = [(number, output) for number, (node, output) in enumerate(zip(nodes, outputs)) if node.returncode]
    if failed:
        number, output = failed[0]
        lines = output.splitlines()
        said = [line for line in lines if line.startswith("error:")]  # the training command's own one line
        raise RuntimeError(f"VM {number + 1} of {vms} failed:\n" + "\n".join(said[:1] or lines[-15:]))
    return RunFolder(out).read_summary()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.lessons.cloud_vms", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("small", type=Path, help="run folder of the run on fewer VMs")
    parser.add_argument("large", type=Path, help="run folder of the run on more VMs")
    args = parser.parse_args(argv)
    try:
        table = side_by_side(RunFolder(args.small).read_summary(), RunFolder(args.large).read_summary())
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(table.to_string(index=False, float_format=lambda value: f"{value:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
