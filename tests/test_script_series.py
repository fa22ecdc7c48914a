"""The learner's scripts as one series (notebooks 01, 07, 09 and 11): each keeps most of the script before it, the
shared pieces and the record the checks read come from the package, and the diff a notebook shows is the learner's
file against the course's previous script, with nothing but the lesson in it. The scripts themselves run in the
notebooks (nbval) and in test_launched_checks."""

from __future__ import annotations

import ast
import difflib
import json
import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_utils import config
from course_utils.lessons.script_record import MIB, ScriptRecord, read_record, steps_losses
from course_utils.lessons.script_series import SERIES, changes, script_flags, shipped_script
from course_utils.training import models

MODEL_PARALLEL = "11_tensor_and_pipeline_parallel.ipynb"
TORCHRUN_SCRIPTS = [*SERIES[1:], *((MODEL_PARALLEL, name) for name in ("tp_by_hand.py", "tp_dtensor.py",
                                                                       "pipeline.py"))]


@pytest.mark.parametrize("before, after", list(zip(SERIES, SERIES[1:])), ids=[name for _, name in SERIES[1:]])
def test_each_script_keeps_at_least_seven_tenths_of_the_one_before_it(before, after):
    previous, script = shipped_script(*before).splitlines(), shipped_script(*after).splitlines()
    matcher = difflib.SequenceMatcher(None, previous, script, autojunk=False)
    kept = sum(block.size for block in matcher.get_matching_blocks())
    assert kept >= 0.7 * len(previous), f"{after[1]} keeps {kept} of the {len(previous)} lines of {before[1]}"


def _code(script: str) -> list[str]:
    """The script's lines after its docstring."""
    return script.splitlines()[ast.parse(script).body[0].end_lineno:]


@pytest.mark.parametrize("before, after", list(zip(SERIES, SERIES[1:])), ids=[name for _, name in SERIES[1:]])
def test_each_diff_is_the_lesson_and_not_the_record_the_checks_read(before, after):
    diff = difflib.unified_diff(_code(shipped_script(*before)), _code(shipped_script(*after)), lineterm="", n=0)
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed and not [line for line in changed if re.search(r"record|json|\.append\(", line)]


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


# The record every script of the series keeps, on one process without a group (as notebook 01 runs its script):
# what it keeps of each epoch, what it says the process held, and that it writes nothing without --out. On several
# ranks the scripts' record is read by the launched checks (test_launched_checks).

def _trained(record: ScriptRecord, loader: DataLoader) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = models.build("small_cnn")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for epoch in range(2):
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        losses = []
        for images, labels in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        record.epoch(loader, [0.1] * len(losses), losses)
    return model, optimizer


def _data(samples: int = 32) -> TensorDataset:
    return TensorDataset(torch.randn(samples, 3, 32, 32), torch.randint(0, 10, (samples,)))


def test_one_process_writes_each_epoch_and_what_it_held(tmp_path):
    out = tmp_path / "record.json"
    record = ScriptRecord(str(out))
    data = _data()
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0, drop_last=True)
    model, optimizer = _trained(record, DataLoader(data, batch_size=8, sampler=sampler))
    record.write(model, optimizer)
    saved = read_record(out)

    assert saved["world_size"] == 1 and saved["samples"] == 32 and saved["sampler"] == "DistributedSampler"
    orders = [epoch["first_samples"] for epoch in saved["epochs"]]
    for epoch, order in enumerate(orders):
        sampler.set_epoch(epoch)
        assert order == list(sampler)[:6]
    assert orders[0] != orders[1] and len(steps_losses(saved)) == 4  # two epochs of 16 samples in batches of 8
    parameters = sum(p.numel() * 4 for p in model.parameters()) / MIB
    held = saved["ranks"]
    assert len(held) == 1 and held[0]["parameters_mib"] == pytest.approx(parameters)
    assert held[0]["optimizer_state_mib"] == pytest.approx(parameters)  # one momentum buffer per parameter
    assert saved["model_mib"] == pytest.approx(parameters) and len(saved["blocks_mib"]) >= 2
    assert saved["groups_mib"] == [] and saved["weights_sums"] == [
        pytest.approx(sum(p.detach().double().sum().item() for p in model.parameters()))]


def test_a_loader_that_shuffles_itself_keeps_no_order_and_no_out_writes_nothing(tmp_path):
    record = ScriptRecord(None)
    model, optimizer = _trained(record, DataLoader(_data(), batch_size=8, shuffle=True))
    record.write(model, optimizer)
    assert list(tmp_path.iterdir()) == []
    assert [epoch["first_samples"] for epoch in record.epochs] == [None, None] and record.sampler == "RandomSampler"
    out = tmp_path / "record.json"
    ScriptRecord(str(out)).write(model, optimizer)
    assert json.loads(out.read_text())["epochs"] == []
