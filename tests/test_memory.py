"""The memory of a step by kind, counted from real tensors: exact on a model small enough to count by hand;
the memory ladder and its rule of thumb on real runs."""

import copy

import pytest
import torch
from torch import nn

from course_utils.experiments.ladder import climb, notebook_rungs
from course_utils.lessons import memory_ladder
from course_utils.observe.memory import measure_step
from course_utils.training.activation_checkpointing import checkpoint_blocks


def _step(model, recomputed=(), micro_batches=1):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with measure_step(model, optimizer, torch.device("cpu"), list(recomputed)) as measured:
        for _ in range(micro_batches):
            model(torch.ones(8, 10)).sum().backward()
        optimizer.step()
    return measured[0]


@pytest.mark.oldest
def test_a_linear_layer_saves_its_input_and_holds_three_copies_of_its_parameters():
    memory = _step(nn.Sequential(nn.Linear(10, 5)))
    parameter_bytes = (10 * 5 + 5) * 4
    assert memory.parameters == memory.gradients == memory.optimizer_state == parameter_bytes
    assert memory.activations == 8 * 10 * 4  # the input, for the weight's gradient; the weight is a parameter
    assert memory.peak_allocated is None  # no allocator to ask on the CPU


def test_micro_batches_count_once_and_a_recomputed_block_keeps_only_its_input():
    assert _step(nn.Sequential(nn.Linear(10, 5)), micro_batches=4).activations == 8 * 10 * 4
    deep = nn.Sequential(nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()), nn.Linear(64, 1))
    saved = _step(deep).activations
    recomputed = _step(deep, checkpoint_blocks([deep[0]])).activations
    # The input, and each ReLU's output (which the next layer saves too: one storage); no weights.
    assert saved == (8 * 10 + 8 * 64 * 2) * 4
    assert recomputed == (8 * 10 + 8 * 64) * 4  # the block's input, and its output (the last layer's input)


def _batchnorm_block_against_plain(momentum, compiled=False):
    """A BatchNorm block trained two steps plain and with checkpointing: the two BatchNorms and first layers."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16, momentum=momentum), nn.ReLU()),
                          nn.Linear(16, 1))
    recomputed = copy.deepcopy(plain)
    checkpoint_blocks([recomputed[0]])
    batch = torch.randn(8, 10)
    for model in (plain, torch.compile(recomputed) if compiled else recomputed):
        for _ in range(2):
            model(batch).sum().backward()
    return plain[0], recomputed[0]


def _same_statistics(plain, recomputed):
    plain_norm, recomputed_norm = plain[1], recomputed[1]
    assert recomputed_norm.num_batches_tracked.item() == plain_norm.num_batches_tracked.item() == 2
    assert torch.allclose(recomputed_norm.running_mean, plain_norm.running_mean)
    assert torch.allclose(recomputed_norm.running_var, plain_norm.running_var)
    assert recomputed_norm.momentum == plain_norm.momentum


@pytest.mark.parametrize("momentum", [0.1, None])
def test_a_recomputed_batchnorm_counts_each_batch_once(momentum):
    """The recomputation in the backward pass must leave the running statistics as one forward left them."""
    plain, recomputed = _batchnorm_block_against_plain(momentum)
    _same_statistics(plain, recomputed)
    assert torch.equal(recomputed[1].running_mean, plain[1].running_mean)
    assert torch.allclose(recomputed[0].weight.grad, plain[0].weight.grad)


@pytest.mark.slow
def test_a_compiled_recomputed_batchnorm_counts_each_batch_once_too():
    _same_statistics(*_batchnorm_block_against_plain(0.1, compiled=True))


def test_the_rule_of_thumb_and_what_fits():
    assert memory_ladder.bytes_per_parameter("fp32, SGD with momentum") == 12
    assert memory_ladder.bytes_per_parameter("fp32, AdamW", ranks=8, sharded=True) == 2
    fits = memory_ladder.largest_models({"H100 (80 GB)": 80, "MI250X GCD (64 GB)": 64}, ranks=8)
    ddp = fits[(fits["recipe"] == "fp32, AdamW") & (fits["strategy"] == "DDP")].iloc[0]
    fsdp = fits[(fits["recipe"] == "fp32, AdamW") & (fits["strategy"] == "FSDP over 8")].iloc[0]
    assert ddp["H100 (80 GB)"] == pytest.approx(80 * 2**30 * 0.8 / 16 / 1e9)
    assert fsdp["MI250X GCD (64 GB)"] == pytest.approx(8 * ddp["MI250X GCD (64 GB)"])


@pytest.mark.slow
@pytest.mark.distributed
def test_the_ladder_measures_every_rung_that_runs_here(tiny_root, tmp_path):
    ladder = climb(steps=2, out=tmp_path, size="ci", data_dir=tiny_root, model="resnet18",
                                 train_samples=128, test_samples=64, batch_size=8, workers=0, log_every=1)
    assert list(ladder["rung"]) == [rung.name for rung in notebook_rungs()]
    assert ladder["skipped"].iloc[-1].startswith("it needs GPUs")  # this machine has none
    rows = ladder.set_index("rung")
    assert rows.loc["FSDP", "parameters_mib"] < 0.52 * rows.loc["DDP", "parameters_mib"]
    assert rows.loc["FSDP + activation checkpointing", "activations_mib"] < rows.loc["FSDP", "activations_mib"] / 2
    rule = memory_ladder.rule_against_measurement(ladder)
    assert rule["measured_over_rule"].between(0.99, 1.05).all()  # FSDP pads its shards to divide evenly
