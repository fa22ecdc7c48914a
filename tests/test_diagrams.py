"""The lessons' diagrams: `make figures` draws every one, the repository keeps them, the notebooks show them,
the ring all-reduce is the real algorithm, and the LUMI-G node is the binding the job scripts use."""

import re
import subprocess

import pytest

from course_utils.config import checkout_root
from course_utils.tooling import diagrams

IMG = checkout_root() / "img"
SHOWN_IN = {"dataparallel_vs_ddp": ["06_dataparallel", "07_ddp"], "ring_allreduce": ["07_ddp"],
            "lumi_g_node": ["08_multinode_scaling"], "fsdp_sharding": []}  # FSDP's is for notebook 09


def test_make_figures_draws_every_figure_into_img():
    dry_run = subprocess.run(["make", "-n", "figures"], cwd=checkout_root(), capture_output=True, text=True).stdout
    assert "-m course_utils.tooling.diagrams img" in dry_run


def test_every_figure_is_drawn_and_the_repository_keeps_it(tmp_path):
    written = diagrams.write_all(tmp_path)
    assert [path.name for path in written] == [f"{name}.png" for name in diagrams.FIGURES]
    for path in written:
        assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
        assert (IMG / path.name).is_file(), f"img/{path.name} is missing: make figures"
    assert set(SHOWN_IN) == set(diagrams.FIGURES)


@pytest.mark.parametrize("name", list(SHOWN_IN))
def test_the_notebooks_show_their_figures(name):
    for notebook in SHOWN_IN[name]:
        text = (checkout_root() / "notebooks" / f"{notebook}.ipynb").read_text()
        assert f"](../img/{name}.png)" in text, f"{notebook} does not show img/{name}.png"


@pytest.mark.parametrize("ranks", [2, 4, 5])
def test_the_ring_all_reduce_leaves_every_rank_with_every_contribution(ranks):
    states = diagrams.ring_allreduce_states(ranks)
    everyone = frozenset(range(ranks))
    assert len(states) == 1 + 2 * (ranks - 1)
    after_reduce_scatter = states[ranks - 1]
    for rank, chunks in enumerate(after_reduce_scatter):  # each rank holds one chunk summed over all ranks
        assert [chunk for chunk, part in enumerate(chunks) if part == everyone] == [(rank + 1) % ranks]
    assert all(part == everyone for chunks in states[-1] for part in chunks)


def _mask_cores(mask: str) -> list[int]:
    value = int(mask, 16)
    return [bit for bit in range(value.bit_length()) if value >> bit & 1]


def test_the_lumi_node_binds_each_gcd_to_the_cores_the_job_scripts_use():
    script = (checkout_root() / "jobs" / "lumi" / "lumi_env.sh").read_text()
    masks = re.search(r'CPU_BIND:-"mask_cpu:([0-9a-f,]+)"', script).group(1).split(",")
    assert [_mask_cores(mask) for mask in masks] == [diagrams.lumi_job_cores(gcd) for gcd in range(8)]
    assert sorted(diagrams.LUMI_GCD_CCD) == list(range(8))  # each CCD serves one GCD


def test_a_figure_is_the_same_file_every_time(tmp_path):
    import matplotlib.pyplot as plt

    files = []
    for name in ("a.png", "b.png"):
        fig = diagrams.ring_allreduce()
        files.append(diagrams.save_png(fig, tmp_path / name))
        plt.close(fig)
    assert files[0].read_bytes() == files[1].read_bytes()
