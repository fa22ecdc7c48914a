"""DistributedDataParallel for real: torchrun, two gloo ranks on the CPU, compared with one process."""

import json
import threading

import pytest
import sharded_runs
import torch
from torch.nn.parallel import DistributedDataParallel

from course_utils.data.loaders import shard_sampler
from course_utils.parallel.launch import launch
from course_utils.parallel.wrappers import InAutocast
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training import models
from course_utils.training.options import TrainOptions, to_flags
from course_utils.training.setup import prepare


def _options(tiny_root, out, **extra) -> dict:
    """A short deterministic run: a BatchNorm-free model, no augmentation, no workers."""
    return {"size": "ci", "data_dir": tiny_root, "model": "small_cnn_gn", "train_samples": 512,
            "test_samples": 100, "max_steps": 6, "log_every": 2, "workers": 0, "device": "cpu", "seed": 3,
            "augment": False, "progress": False, "out": out, **extra}


def _single(tiny_root, out, **extra):
    return train(**_options(tiny_root, out, **extra))


def _ddp(tiny_root, out, **extra):
    result = launch(2, "course_utils.train", *to_flags(**_options(tiny_root, out, distributed="ddp", **extra)),
                    log_dir=out.parent / f"{out.name}-logs", echo=False, timeout_seconds=300)
    assert result.ok, "\n".join(result.lines[-30:])
    return result


@pytest.mark.oldest
@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_on_two_ranks_equals_one_process_with_the_doubled_batch(ddp_run, tiny_root, tmp_path, run_weights):
    """The session's DDP run (conftest.py: batch 16 on each rank) against one process at batch 32."""
    _, out = ddp_run
    single = train(**sharded_runs.options(tiny_root, tmp_path / "single", batch_size=32))
    ddp, one = run_weights(out), run_weights(tmp_path / "single")
    assert single["steps"] == 4
    for name in one:
        torch.testing.assert_close(ddp[name], one[name], rtol=1e-5, atol=1e-6)
    torch.manual_seed(5)
    start = models.build("small_cnn_gn").state_dict()  # the weights before training: they did move
    assert any(not torch.allclose(ddp[name], start[name]) for name in ddp)


@pytest.mark.slow
@pytest.mark.distributed
def test_each_rank_runs_its_share_and_rank_zero_writes(ddp_run, run_summary):
    result, out = ddp_run
    run = RunFolder(out)
    summary = run_summary(out)
    assert summary["world_size"] == 2 and summary["global_batch_size"] == 32
    ranks = result.per_rank
    assert list(ranks["rank"]) == [0, 1] and list(ranks["steps"]) == [4, 4]
    assert list(ranks["images"]) == [64, 64]
    # 256 samples over 2 ranks at batch 16: 8 iterations per epoch each, half of one process's 16 at that batch.
    assert summary["steps_per_epoch"] == 8
    assert len(list(run.tensorboard.glob("events.*"))) == 1  # rank 0's alone
    epoch = [json.loads(line) for line in run.metrics.read_text().splitlines()][-1]
    assert [r["rank"] for r in epoch["ranks"]] == [0, 1]


@pytest.mark.slow
@pytest.mark.distributed
def test_gradient_accumulation_with_no_sync_equals_the_full_batch(tiny_root, tmp_path, run_weights):
    out = tmp_path / "accum"
    _ddp(tiny_root, out, batch_size=8, grad_accum=2)
    _single(tiny_root, tmp_path / "single", batch_size=32)
    accumulated, one = run_weights(out), run_weights(tmp_path / "single")
    for name in one:
        torch.testing.assert_close(accumulated[name], one[name], rtol=1e-5, atol=1e-6)


def test_ddp_knobs_train(quick):
    summary = train(**{**quick, "max_steps": 4}, distributed="ddp", bucket_cap_mb=1, gradient_as_bucket_view=True,
                    static_graph=True)
    assert summary["distributed"] == "ddp" and summary["world_size"] == 1 and summary["steps"] == 4


@pytest.mark.parametrize("knobs,expected", [
    ({}, (25 * 2**20, False, False)),  # PyTorch's defaults
    ({"bucket_cap_mb": 1, "gradient_as_bucket_view": True, "static_graph": True}, (2**20, True, True)),
], ids=["defaults", "set"])
def test_ddp_knobs_reach_the_ddp_wrapper(quick, knobs, expected):
    """A group of one, set up as a run sets it up: the options must arrive in torch's DistributedDataParallel.
    A dropped option fails nothing; it would only show as slower training."""
    with prepare(TrainOptions.from_keywords(**quick, distributed="ddp", **knobs)) as setup:
        ddp = setup.wrapped
        assert isinstance(ddp, DistributedDataParallel) and ddp.module is setup.model
        assert (ddp.bucket_bytes_cap, ddp.gradient_as_bucket_view, ddp.static_graph) == expected


def test_dataparallel_without_gpus_runs_on_one_device(quick):
    summary = train(**{**quick, "max_steps": 2}, distributed="dp")
    assert summary["data_parallel_devices"] == 1


def _as_a_dataparallel_worker(module, images):
    """What parallel_apply does with each replica on 2+ GPUs: a new thread, autocast switched on again there."""
    outputs = []

    def worker():
        with torch.amp.autocast("cpu", enabled=True):
            outputs.append(module(images))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    return outputs[0]


def test_dataparallel_replicas_keep_the_callers_autocast_dtype():
    """Autocast's dtype belongs to a thread: a replica's thread starts from the default (bf16 on the CPU, fp16 on
    CUDA, where --amp bf16 then trained in fp16); each replica runs in the caller's dtype."""
    layer, images = torch.nn.Linear(4, 4), torch.ones(2, 4)
    with torch.autocast("cpu", dtype=torch.float16):
        assert _as_a_dataparallel_worker(layer, images).dtype == torch.bfloat16  # what the replicas got
        assert _as_a_dataparallel_worker(InAutocast(layer, "cpu", torch.float16), images).dtype == torch.float16


@pytest.mark.parametrize("count,ranks,batch", [(512, 2, 16), (100, 4, 3), (37, 2, 5)])
def test_shards_are_disjoint_and_make_the_single_process_batches(count, ranks, batch):
    data = list(range(count))
    shards = []
    for rank in range(ranks):
        sampler = shard_sampler(data, rank, ranks, seed=7)
        sampler.set_epoch(2)
        shards.append(list(sampler))
    flat = [i for shard in shards for i in shard]
    assert len(set(flat)) == len(flat) == (count // ranks) * ranks  # disjoint; only the uneven tail is left out
    single = shard_sampler(data, 0, 1, seed=7)
    single.set_epoch(2)
    order = list(single)
    for k in range(len(shards[0]) // batch):
        union = sorted(i for shard in shards for i in shard[k * batch:(k + 1) * batch])
        assert union == sorted(order[k * batch * ranks:(k + 1) * batch * ranks])


def test_a_rank_without_ddp_is_refused(quick, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="--distributed ddp"):
        train(**quick)


def test_sync_bn_on_cpu_says_it_needs_gpus(quick):
    with pytest.raises(ValueError, match="needs GPUs"):
        train(**quick, distributed="ddp", sync_bn=True)
