"""FSDP2 for real: two (and four) gloo ranks on the CPU under torchrun, each holding a shard of the model;
the same training as DDP; sharded checkpoints that resume on another number of ranks; memory by kind."""

import shutil

import pytest
import sharded_runs
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from course_utils.observe.metrics import read_records
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _launch(ranks, tiny_root, out, expect_ok=True, **extra):
    result = sharded_runs.launched(ranks, tiny_root, out, **extra)
    assert result.ok == expect_ok, "\n".join(result.lines[-30:])
    return result


def _step_losses(out) -> list[float]:
    return [record["loss"] for record in read_records(RunFolder(out).metrics) if record["kind"] == "step"]


def _sharded_weights(folder, tmp_path) -> dict[str, torch.Tensor]:
    """The whole model from a sharded checkpoint, gathered into one file as a learner would."""
    target = tmp_path / f"{folder.name}.pt"
    dcp_to_torch_save(folder, target)
    return torch.load(target, weights_only=True)["model"]


@pytest.mark.oldest
def test_fsdp_trains_like_ddp_and_each_rank_holds_half_the_model(fsdp_run, ddp_run, tmp_path, run_weights):
    result, out = fsdp_run
    ddp = ddp_run[1]
    assert len(_step_losses(out)) == 4
    assert _step_losses(out) == pytest.approx(_step_losses(ddp), rel=1e-5)
    sharded = checkpoint.candidates(RunFolder(out).checkpoints)[0]
    assert sharded.name == "step-00000004.dcp" and sharded.is_dir()
    fsdp_weights, ddp_weights = _sharded_weights(sharded, tmp_path), run_weights(ddp)
    assert fsdp_weights.keys() == ddp_weights.keys()
    for name, value in ddp_weights.items():
        torch.testing.assert_close(fsdp_weights[name], value, rtol=1e-5, atol=1e-6)
    whole = result.summary["parameters"] * 4  # fp32
    for rank in result.per_rank["step_memory_bytes"]:
        assert whole / 2 <= rank["parameters"] <= 0.52 * whole  # its half, padded to divide evenly
        assert rank["gradients"] == rank["parameters"] and rank["optimizer_state"] == rank["parameters"]
    assert result.summary["distributed"] == "fsdp" and result.summary["test_top1"] >= 0  # 101 images: uneven shares


@pytest.mark.oldest
def test_a_sharded_checkpoint_resumes_on_another_number_of_ranks(fsdp_run, tiny_root, tmp_path):
    """The session's run as if stopped at its step-2 checkpoint (its step-4 one and its summary taken away)."""
    _, out = fsdp_run
    assert {path.name for path in RunFolder(out).checkpoints.iterdir()} == {"step-00000002.dcp", "step-00000004.dcp"}
    stopped = sharded_runs.unfinished_copy(out, tmp_path / "stopped", stopped_at=2).path
    # Four ranks of 8 images continue two ranks of 16: the same global batch, the same images in each step.
    resumed = _launch(4, tiny_root, stopped, distributed="fsdp", batch_size=8, resume="auto")
    assert "resharded: written by 2 ranks, continued by 4" in "\n".join(resumed.lines)
    assert "step-00000002.dcp: step 2" in "\n".join(resumed.lines)
    assert resumed.summary["world_size"] == 4 and resumed.summary["steps"] == 4
    assert _step_losses(stopped) == pytest.approx(_step_losses(out), rel=1e-4)
    # Two ranks of 8 are half the global batch the four ranks' checkpoint trained: refused, whatever the rank count.
    refused = _launch(2, tiny_root, stopped, expect_ok=False, distributed="fsdp", batch_size=8, resume="auto",
                      max_steps=6)
    assert ("global batch: 4 rank(s) x 8 images x 1 micro-batch(es) = 32 in the checkpoint, 2 rank(s) x 8 images x 1 "
            "micro-batch(es) = 16 now") in "\n".join(refused.lines)


def test_a_damaged_sharded_checkpoint_is_passed_over_and_a_half_written_one_cleared(fsdp_resumed_past_damage):
    """The session's damaged copy (``sharded_runs``) holds one checkpoint without its metadata and a half-written
    one newer than all."""
    result, run, _ = fsdp_resumed_past_damage
    lines = "\n".join(result.lines)
    assert result.ok, lines[-3000:]
    bare = checkpoint.step_path(RunFolder(run).checkpoints, sharded_runs.NO_METADATA_STEP, sharded=True)
    assert f"skipped a checkpoint: {bare} is not a whole sharded checkpoint: its .metadata is missing" in lines
    assert "resuming from" in lines and "step-00000002.dcp: step 2" in lines
    assert not list(RunFolder(run).checkpoints.glob(".*.tmp"))


def test_a_checkpoint_of_another_strategy_is_refused_by_name(fsdp_run, tiny_root, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(fsdp_run[1], out)  # the session's run stays as it was
    with pytest.raises(ValueError, match="is a folder of shards, written by a --distributed fsdp run; this run is "
                                         "--distributed none.*resume with --distributed fsdp"):
        train(**sharded_runs.options(tiny_root, str(out), max_steps=6, resume="auto"))
    named = checkpoint.step_path(RunFolder(out).checkpoints, 4, sharded=True)  # --resume PATH takes a folder too
    with pytest.raises(ValueError, match="is a folder of shards, written by a --distributed fsdp run"):
        train(**sharded_runs.options(tiny_root, str(out), max_steps=6, resume=str(named)))
    single = tmp_path / "single"
    train(**sharded_runs.options(tiny_root, str(single), max_steps=2, batch_size=32))
    refused = _launch(2, tiny_root, single, expect_ok=False, distributed="fsdp", resume="auto")
    assert "is one file with the whole model, written by a --distributed none run" in "\n".join(refused.lines)


def test_fsdp_refuses_what_does_not_fit_it(tiny_root, tmp_path):
    with pytest.raises(ValueError, match="shards the model over 2 or more ranks.*torchrun --nproc-per-node 2"):
        train(**sharded_runs.options(tiny_root, str(tmp_path / "alone"), distributed="fsdp"))
    with pytest.raises(ValueError, match="--bucket-cap-mb, --static-graph tune DistributedDataParallel"):
        train(**sharded_runs.options(tiny_root, str(tmp_path / "knobs"), distributed="fsdp", bucket_cap_mb=5,
                                     static_graph=True))
    with pytest.raises(ValueError, match="--offload keeps FSDP's shards .* use it with --distributed fsdp"):
        train(**sharded_runs.options(tiny_root, str(tmp_path / "offload"), offload=True))
    refused = _launch(2, tiny_root, tmp_path / "cpu-offload", expect_ok=False, distributed="fsdp", offload=True)
    assert "it needs GPUs" in "\n".join(refused.lines)


def test_activation_checkpointing_trades_saved_activations_for_the_same_numbers(tiny_root, tmp_path):
    plain = train(**sharded_runs.options(tiny_root, str(tmp_path / "plain"), model="resnet18", max_steps=2))
    recomputed = train(**sharded_runs.options(tiny_root, str(tmp_path / "recomputed"), model="resnet18", max_steps=2,
                                  activation_checkpointing=True))
    before, after = (run["per_rank"][0]["step_memory_bytes"] for run in (plain, recomputed))
    assert after["activations"] < before["activations"] / 2
    assert after["parameters"] == before["parameters"]
    assert _step_losses(tmp_path / "recomputed") == pytest.approx(_step_losses(tmp_path / "plain"), rel=1e-5)
