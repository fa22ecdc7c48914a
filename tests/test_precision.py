"""Each precision and compilation option trains, and its loss falls; what cannot run says why."""

import pytest
import torch

from course_utils import checkpoint
from course_utils.metrics import load_run
from course_utils.progression import STAGES, unavailable
from course_utils.train import train

CPU = torch.device("cpu")


def _loss_falls(out) -> bool:
    losses = load_run(out).steps["loss"]
    return losses.iloc[-2:].mean() < losses.iloc[:2].mean() - 0.05


@pytest.mark.parametrize("options", [
    {"amp": "bf16"},
    {"channels_last": True},
    {"fused_optimizer": True},
    {"amp": "bf16", "channels_last": True, "fused_optimizer": True},
], ids=lambda o: ",".join(o))
def test_option_trains_and_loss_falls(quick, tmp_path, options):
    summary = train(**{**quick, "out": str(tmp_path), "epochs": 3, **options})
    assert summary["config"] | options == summary["config"]
    assert _loss_falls(tmp_path)


def test_fp16_on_cpu_runs_with_a_grad_scaler(quick, tmp_path):
    train(**{**quick, "out": str(tmp_path), "amp": "fp16", "batch_size": 8, "train_samples": 48, "epochs": 1})
    state = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert state["scaler"]["scale"] > 0  # the scaler was enabled and saved with the run


def test_fp16_stage_on_cpu_runs_or_says_why(quick):
    reason = unavailable(STAGES[1], CPU, "small_cnn")
    assert reason is None or ("slower than fp32" in reason and "images/s" in reason)


def test_cuda_graphs_stage_says_why_on_cpu():
    assert "no GPU" in unavailable(STAGES[-1], CPU, "small_cnn")


def test_compile_trains_and_loss_falls(tiny_root, tmp_path):
    # The same model, shapes and options as notebook 05's compile stage, so the two share inductor's cache.
    summary = train(size="ci", data_dir=str(tiny_root), test_samples=64, epochs=2, log_every=2, out=str(tmp_path),
                    amp="bf16", channels_last=True, fused_optimizer=True, compile="default", progress=False, device="cpu")
    assert _loss_falls(tmp_path)
    assert summary["first_iteration_seconds"][0] > 2 * summary["steady_iteration_seconds"]  # compiling is paid once
