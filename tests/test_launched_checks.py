"""The checks of the exercises whose script is launched with torchrun (notebooks 07, 09 and 11), fed what
learners do, on real gloo ranks: the notebook's own script changed as the solution changes it, a right
answer written another way, the script left as it was, typical wrong edits, a typo that crashes the ranks
right after a successful attempt, and a stale record. The scripts are the ones the notebooks' ``%%writefile``
cells write; the checks are called as the exercise cells call them. 07's and 09's scripts as shipped are judged
on the launch of test_every_process_ends, which runs them to their end."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.lessons import ddp, memory_ladder, model_parallel
from course_utils.lessons.script_series import shipped_script
from course_utils.tooling.exercises import Check

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # every test here starts torchrun and its ranks

CRASHED = "your script failed on rank"
NO_RECORD = ("record.write(model, optimizer)", "pass")  # the script runs to its end and writes nothing


def _data_flags(tiny_root: Path) -> list[str]:
    """The arguments of the series' scripts (07, 09) at a small size, on CPU ranks."""
    return ["--data-dir", str(tiny_root), "--samples", "256", "--model", "small_cnn", "--batch-size", "32",
            "--lr", "0.05", "--workers", "0", "--device", "cpu"]


def _edited(script: str, *replacements: tuple[str, str]) -> str:
    for old, new in replacements:
        assert old in script, f"the notebook's script no longer holds {old!r}"
        script = script.replace(old, new)
    return script


def _not_yet(check: Check, *said: str) -> None:
    assert isinstance(check, Check) and not check.done and str(check).startswith("Not yet: "), str(check)
    for words in said:
        assert words in check.text, str(check)


def _done(check: Check) -> None:
    assert isinstance(check, Check) and check.done and str(check).startswith("Done: "), str(check)


# --- 07: set_epoch ---------------------------------------------------------------------------------------

DDP_SCRIPT = shipped_script("07_ddp.ipynb", "ddp_minimal.py")
SET_EPOCH = "    sampler.set_epoch(epoch)\n"


@pytest.fixture
def ddp_check(tmp_path, tiny_root):
    """The check as the exercise cell calls it, on the learner's script (written to ``script``) at ci."""
    script = tmp_path / "ddp_minimal.py"
    flags = [*_data_flags(tiny_root), "--epochs", "3", "--max-steps", "2"]

    def check(text: str) -> Check:
        script.write_text(text)
        return ddp.check_set_epoch_removed(script, 2, flags)

    check.record = script.with_name("ddp_minimal-check.json")
    return check


def test_set_epoch_removed_is_done_and_reruns_after_it_are_never_judged_on_its_record(ddp_check):
    """After the right answer: a rerun that writes no record, then one with a typo that crashes the ranks."""
    _done(ddp_check(_edited(DDP_SCRIPT, (SET_EPOCH, ""))))
    stale = ddp_check.record.read_text()
    silent = _edited(DDP_SCRIPT, (SET_EPOCH, ""), NO_RECORD)
    _not_yet(ddp_check(silent), "wrote nothing")
    assert not ddp_check.record.exists() and stale
    ddp_check.record.write_text(stale)  # the right attempt's record, there again for the next rerun
    crashed = ddp_check(_edited(DDP_SCRIPT, ("sampler.set_epoch(epoch)", "sampler.set_epock(epoch)")))
    _not_yet(crashed, CRASHED, "Nothing was judged")
    assert not ddp_check.record.exists(), "the earlier attempt's record must be gone before the launch"


def test_set_epoch_to_zero_is_a_right_answer_written_another_way(ddp_check):
    _done(ddp_check(_edited(DDP_SCRIPT, ("sampler.set_epoch(epoch)", "sampler.set_epoch(0)"))))


def test_no_shuffle_with_set_epoch_kept_repeats_the_order_but_is_not_yet(ddp_check):
    _not_yet(ddp_check(_edited(DDP_SCRIPT, ("shuffle=True", "shuffle=False"))), "does not shuffle at all")


def test_another_seed_without_set_epoch_is_not_yet(ddp_check):
    _not_yet(ddp_check(_edited(DDP_SCRIPT, (SET_EPOCH, ""), ("seed=0", "seed=1"))), "not with the order seed 0")


@pytest.mark.parametrize("edit, said", [
    (("sampler=sampler, drop_last=True", "shuffle=True, drop_last=True"), "the loader draws from another sampler"),
    (("model = DDP(models.build(args.model).to(device), device_ids=[device.index] if device.type == \"cuda\" else "
      "None)", "model = models.build(args.model).to(device)"), "each trained a model of its own"),
], ids=["sampler left out of the loader", "DDP wrap left out"])
def test_set_epoch_removed_with_another_part_of_ddp_undone_is_not_yet(ddp_check, edit, said):
    """The order the sampler would give is not the result: the loader's draws and the ranks' weights are."""
    _not_yet(ddp_check(_edited(DDP_SCRIPT, (SET_EPOCH, ""), edit)), said)


# --- 09: fewer, larger groups ----------------------------------------------------------------------------

FSDP_SCRIPT = shipped_script("09_sharding_and_memory.ipynb", "fsdp_minimal.py")
BLOCKS = "blocks_to_shard = models.blocks(model)\n"
FIRST_ALONE = (BLOCKS, "blocks_to_shard = models.blocks(model)[:1]\n")
OPTIMIZER = "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # two moments per parameter, sharded too\n"


@pytest.fixture
def fsdp_check(tmp_path, tiny_root):
    script = tmp_path / "fsdp_minimal.py"

    def check(text: str) -> Check:
        script.write_text(text)
        return memory_ladder.check_fewer_groups(script, 2, [*_data_flags(tiny_root), "--epochs", "1",
                                                            "--max-steps", "2"])

    check.record = script.with_name("fsdp_minimal-check.json")
    return check


def test_only_the_first_block_alone_is_done_and_reruns_after_it_are_never_judged_on_its_record(fsdp_check):
    """After the right answer: a rerun that writes no record, then one with a typo that crashes the ranks."""
    _done(fsdp_check(_edited(FSDP_SCRIPT, FIRST_ALONE)))
    stale = fsdp_check.record.read_text()
    _not_yet(fsdp_check(_edited(FSDP_SCRIPT, FIRST_ALONE, NO_RECORD)),
             "wrote nothing")
    fsdp_check.record.write_text(stale)  # the right attempt's record, there again for the next rerun
    # A bracket left open: Python refuses the script on every rank before it imports anything (07's typo fails
    # later, once the ranks have joined their group).
    _not_yet(fsdp_check(_edited(FSDP_SCRIPT, FIRST_ALONE,
                                ("fully_shard(block)", "fully_shard(block"))), CRASHED, "Nothing was judged")
    assert not fsdp_check.record.exists()


def test_the_first_block_named_another_way_is_done(fsdp_check):
    _done(fsdp_check(_edited(FSDP_SCRIPT, (BLOCKS, "blocks_to_shard = [model[0]]\n"))))


@pytest.mark.parametrize("edits, said", [
    ([(BLOCKS, "blocks_to_shard = []\n")], "one group holds the whole model"),
    ([(BLOCKS, "blocks_to_shard = models.blocks(model)[:2]\n")], "the exercise asks for two"),
    ([FIRST_ALONE, ("fully_shard(model)\n", "")], "some layers are in no group"),
    ([FIRST_ALONE, (OPTIMIZER, ""), (FIRST_ALONE[1], OPTIMIZER + FIRST_ALONE[1])], "Built before `fully_shard`"),
], ids=["no block alone", "two blocks alone", "root not sharded", "optimizer before sharding"])
def test_other_groupings_are_not_yet_and_say_what_the_script_did(fsdp_check, edits, said):
    _not_yet(fsdp_check(_edited(FSDP_SCRIPT, *edits)), said)


# --- 11: the collective the backward pass needs ------------------------------------------------------------

TP_SCRIPT = shipped_script("11_tensor_and_pipeline_parallel.ipynb", "tp_by_hand.py")
BACKWARD_ALL_REDUCE = "        grad = grad.clone()\n        dist.all_reduce(grad)\n        return grad\n"
FORWARD_ALL_REDUCE = "        partial = partial.clone()\n        dist.all_reduce(partial)\n        return partial\n"


@pytest.fixture
def tp_check(tmp_path):
    script, results = tmp_path / "tp_by_hand.py", tmp_path / "exercise"
    results.mkdir()

    def check(text: str) -> Check:
        script.write_text(text)
        return model_parallel.check_backward_collective(script, results, "cpu")

    check.results = results
    return check


def test_the_backward_all_reduce_taken_out_is_done_and_reruns_after_it_are_never_judged_on_its_files(tp_check):
    """After the right answer: a rerun that writes no rank files, then one with a typo that crashes the ranks."""
    _done(tp_check(_edited(TP_SCRIPT, (BACKWARD_ALL_REDUCE, "        return grad\n"))))
    stale = {path.name: path.read_bytes() for path in tp_check.results.iterdir()}
    assert sorted(stale) == ["rank0.pt", "rank1.pt"]
    silent = _edited(TP_SCRIPT, (BACKWARD_ALL_REDUCE, "        return grad\n"), ("torch.save(", "(lambda *_: None)("))
    _not_yet(tp_check(silent), "wrote nothing")
    for name, content in stale.items():  # the right attempt's files, there again for the next rerun
        (tp_check.results / name).write_bytes(content)
    _not_yet(tp_check(_edited(TP_SCRIPT, ("dist.all_reduce(grad)", "dist.all_reduce(grad"))), CRASHED)  # as 09's
    assert not any(tp_check.results.iterdir()), "the earlier attempt's files must be gone before the launch"


def test_only_the_all_reduce_line_deleted_is_done(tp_check):
    _done(tp_check(_edited(TP_SCRIPT, ("        dist.all_reduce(grad)\n", ""))))


def test_the_script_as_it_was_is_not_yet_and_its_split_matches_the_whole_block(tp_check):
    """The same launch holds the lesson's own reading (its cell after the script's): the shipped split matches."""
    _not_yet(tp_check(TP_SCRIPT), "every tensor still matches the whole block", "If you took that all-reduce out")
    split = model_parallel.check_mlp_split(tp_check.results)
    assert split["same"].all(), split
    assert len(split) == 8  # two ranks' outputs and input gradients, four weights' gradients


@pytest.mark.parametrize("edit, said", [
    ((FORWARD_ALL_REDUCE, "        return partial\n"), "your change reached the forward pass"),
    ((BACKWARD_ALL_REDUCE, "        return torch.zeros_like(grad)\n"), "not each rank's own share"),
    ((BACKWARD_ALL_REDUCE, "        return 2 * grad\n"), "not each rank's own share"),
], ids=["forward all-reduce instead", "zeros", "scaled"])
def test_other_collective_edits_are_not_yet(tp_check, edit, said):
    _not_yet(tp_check(_edited(TP_SCRIPT, edit)), said)
