"""The learner's scripts as one series (notebooks 01, 07, 09 and 11): each keeps most of the script before it, the
shared pieces come from the package, and the diff a notebook shows is the learner's file against the course's
previous script. The scripts themselves run in the notebooks (nbval) and in test_launched_checks."""

from __future__ import annotations

import difflib
import re

import pytest

from course_utils import config
from course_utils.lessons.script_series import SERIES, changes, script_flags, shipped_script

MODEL_PARALLEL = "11_tensor_and_pipeline_parallel.ipynb"
TORCHRUN_SCRIPTS = [*SERIES[1:], *((MODEL_PARALLEL, name) for name in ("tp_by_hand.py", "tp_dtensor.py",
                                                                       "pipeline.py"))]


@pytest.mark.parametrize("before, after", list(zip(SERIES, SERIES[1:])), ids=[name for _, name in SERIES[1:]])
def test_each_script_keeps_at_least_seven_tenths_of_the_one_before_it(before, after):
    previous, script = shipped_script(*before).splitlines(), shipped_script(*after).splitlines()
    matcher = difflib.SequenceMatcher(None, previous, script, autojunk=False)
    kept = sum(block.size for block in matcher.get_matching_blocks())
    assert kept >= 0.7 * len(previous), f"{after[1]} keeps {kept} of the {len(previous)} lines of {before[1]}"


@pytest.mark.parametrize("notebook, name", TORCHRUN_SCRIPTS, ids=[name for _, name in TORCHRUN_SCRIPTS])
def test_the_torchrun_scripts_join_and_leave_the_group_through_the_package(notebook, name):
    script = shipped_script(notebook, name)
    assert "join_with_device(" in script and "leave(together=True)" in script and "end_process()" in script
    assert not re.search(r"init_process_group|destroy_process_group|LOCAL_RANK", script), name


def test_the_diff_is_the_learners_file_against_the_previous_script_as_shipped(tmp_path):
    script = tmp_path / "ddp_minimal.py"
    text = shipped_script("07_ddp.ipynb", "ddp_minimal.py")
    script.write_text(text)
    shipped = changes(script)
    assert shipped.previous == "train_single.py" and shipped.added > 0 and shipped.removed > 0
    assert "+    sampler.set_epoch(epoch)" in str(shipped) and "-device = torch.device(args.device)" in str(shipped)

    script.write_text(text.replace("    sampler.set_epoch(epoch)\n", "    print('my own line')\n"))
    edited = changes(script)
    assert "+    print('my own line')" in str(edited) and "sampler.set_epoch(epoch)" not in str(edited)
    assert edited.added == shipped.added and "my own line" in edited._repr_html_()


def test_a_script_not_written_yet_or_outside_the_series_gets_a_message_that_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="run its %%writefile cell first"):
        changes(tmp_path / "fsdp_minimal.py")
    for name in ("train_single.py", "my_script.py"):
        with pytest.raises(ValueError, match="follows no script of the series"):
            changes(tmp_path / name)


def test_a_missing_script_cell_names_the_notebook():
    with pytest.raises(LookupError, match="07_ddp.ipynb writes train_single.py"):
        shipped_script("07_ddp.ipynb", "train_single.py")


def test_the_flags_follow_the_size_and_leave_out_what_is_not_set():
    ci, workshop = config.get_size("ci"), config.get_size("workshop")
    flags = script_flags(ci, "cpu", max_steps=2, out=None)
    assert flags[flags.index("--batch-size") + 1] == str(ci.batch_size) and flags[-2:] == ["--max-steps", "2"]
    assert "--out" not in flags and flags[flags.index("--device") + 1] == "cpu"
    assert workshop.train_samples is not None or "--samples" not in script_flags(workshop, "cuda")
