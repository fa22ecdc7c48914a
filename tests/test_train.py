import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from course_utils import config
from course_utils.observe.metrics import load_run
from course_utils.run_folder import RunFolder
from course_utils.train import main, train
from course_utils.training import checkpoint, models
from course_utils.training.options import TrainOptions, build_parser, check_parallel_options

SUMMARY_KEYS = {"images_per_second", "first_epoch_seconds", "epoch_seconds", "final_train_loss", "test_top1",
                "test_top5", "world_size", "device", "config", "steps", "first_iteration_seconds"}


@pytest.fixture(scope="module")
def quick_run(tiny_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("quick") / "run"
    summary = train(size="ci", data_dir=str(tiny_root), train_samples=256, test_samples=128, epochs=2,
                    batch_size=32, workers=0, log_every=3, out=str(out), progress=False, device="cpu")
    return summary, out


@pytest.mark.slow
def test_summary_follows_the_contract(quick_run, run_summary):
    summary, out = quick_run
    assert SUMMARY_KEYS <= set(summary)
    assert run_summary(out)["steps"] == summary["steps"] == 16
    assert summary["world_size"] == 1 and summary["device"] == "CPU"
    assert len(summary["epoch_seconds"]) == 2 and summary["images_per_second"] > 0
    assert summary["config"]["batch_size"] == 32 and summary["config"]["model"] == "small_cnn"
    # FLOPs counted for the model that trained; no MFU on a CPU, whose peak the table does not guess
    assert summary["training_flops_per_image"] > 1e6 and summary["mfu"] is None and summary["peak_source"] is None
    assert summary["joules_per_image"] is None  # no monitor, no power: nothing is made up


@pytest.mark.slow
def test_metrics_jsonl_schema(quick_run):
    _, out = quick_run
    records = [json.loads(line) for line in RunFolder(out).metrics.read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert {"step", "epoch", "loss", "lr", "images_per_second", "iteration_seconds", "data_seconds"} <= set(steps[0])
    assert {"epoch", "seconds", "train_loss", "test_loss", "test_top1", "test_top5", "steps"} <= set(epochs[0])
    assert sum(len(r["iteration_seconds"]) for r in steps) == 16 and len(epochs) == 2
    run = load_run(out)
    assert list(run.iterations["step"]) == list(range(1, 17))


@pytest.mark.slow
def test_tensorboard_events_are_readable(quick_run):
    _, out = quick_run
    events = EventAccumulator(str(RunFolder(out).tensorboard))
    events.Reload()
    assert {"train/loss", "test/top1", "epoch/seconds"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("test/top1")] == [1, 2]


@pytest.mark.slow
def test_checkpoint_holds_the_model(quick_run):
    summary, out = quick_run
    state = checkpoint.load(RunFolder(out).last_checkpoint)
    model = models.build("small_cnn")
    model.load_state_dict(state["model"])
    assert state["step"] == summary["steps"] and state["epoch"] == 2


@pytest.mark.slow
def test_loss_falls_and_accuracy_beats_chance_at_the_ci_size(tiny_root, tmp_path):
    size = config.SIZES["ci"]
    summary = train(size="ci", data_dir=str(tiny_root), train_samples=600, test_samples=200, out=str(tmp_path),
                    progress=False, device="cpu")
    run = load_run(tmp_path)
    assert run.steps["loss"].iloc[-3:].mean() < run.steps["loss"].iloc[:3].mean() - 0.3
    # Chance is 5 % top-5: 10 of 200 images, give or take 3. Three times that is far outside luck.
    assert summary["test_top5"] > 3 * 5.0
    assert summary["config"]["epochs"] == size.epochs


@pytest.mark.slow
def test_same_seed_repeats_exactly_on_cpu(quick, tmp_path, run_weights):
    first = train(**{**quick, "out": str(tmp_path / "a"), "workers": 1})
    second = train(**{**quick, "out": str(tmp_path / "b"), "workers": 1})
    a, b = run_weights(tmp_path / "a"), run_weights(tmp_path / "b")
    assert first["final_train_loss"] == second["final_train_loss"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    third = train(**{**quick, "out": str(tmp_path / "c"), "seed": 1})
    assert third["final_train_loss"] != first["final_train_loss"]


def test_max_steps_stops_mid_epoch(quick):
    summary = train(**{**quick, "max_steps": 5})
    assert summary["steps"] == 5 and len(summary["epoch_seconds"]) == 1


def test_unknown_option_is_named(quick):
    with pytest.raises(TypeError, match="batchsize"):
        train(**quick, batchsize=3)


def test_help_documents_every_flag():
    text = build_parser().format_help()
    for flag in ("--size", "--model", "--epochs", "--max-steps", "--batch-size", "--lr", "--workers", "--seed",
                 "--data", "--data-dir", "--no-augment", "--image-size", "--out", "--log-every",
                 "--pin-memory", "--no-persistent-workers", "--prefetch-factor", "--loader", "--warmup-steps"):
        assert flag in text
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help text"


@pytest.mark.slow
def test_the_end_line_sets_the_first_step_against_the_steady_one(tiny_root, tmp_path, capsys, run_summary):
    """What the command prints last reads the run's summary: the first step apart from the steady state, and
    the summary records whether convolutions were autotuned (on the CPU there is nothing to tune)."""
    assert main(["--size", "ci", "--data-dir", str(tiny_root), "--max-steps", "6", "--batch-size", "16",
                 "--train-samples", "96", "--test-samples", "32", "--workers", "0", "--device", "cpu",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    summary = run_summary(tmp_path / "run")
    first, steady = summary["first_iteration_seconds"][0], summary["steady_iteration_seconds"]
    end = capsys.readouterr().out.splitlines()[-1]
    assert f"; first step {first:.3g} s, steady step {steady:.3g} s; results in " in end
    assert summary["conv_autotune"] == "off (CPU: no cuDNN or MIOpen)"


def test_command_line_help_shows_the_sizes(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "Size defaults: ci: " in capsys.readouterr().out


def test_command_line_missing_data_names_the_fix(tmp_path, capsys):
    assert main(["--size", "ci", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")]) == 1
    assert f"python -m data_prep.tiny_cifar100 --root {tmp_path / 'nowhere'}" in capsys.readouterr().err


def test_command_line_rejects_an_unknown_model(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "vgg16"])
    assert exit_.value.code == 2 and "resnet18" in capsys.readouterr().err


def test_to_flags_round_trips_through_the_parser():
    from course_utils.training.options import to_flags

    options = {"batch_size": 32, "augment": False, "pin_memory": False, "channels_last": True, "distributed": "ddp",
               "grad_accum": 2, "monitor": "cpu", "progress": False}
    parsed = vars(build_parser().parse_args(to_flags(**options)))
    assert {name: parsed[name] for name in options} == options
    with pytest.raises(TypeError, match="batchsize"):
        to_flags(batchsize=3)


def test_an_unknown_loader_or_size_is_named_with_the_choices(quick):
    from course_utils.config import UnknownSizeError

    with pytest.raises(ValueError, match="unknown loader 'fast'; choose one of: torch, dali, gpu-aug"):
        train(**quick, loader="fast")
    with pytest.raises(UnknownSizeError, match="valid values: ci, workshop"):
        train(**{**quick, "size": "huge"})


def test_behind_lumis_web_proxy_tensorboard_names_the_app_instead_of_a_blank_frame(monkeypatch, tmp_path, capsys):
    from course_utils.observe import tensorboard

    monkeypatch.setenv(tensorboard.BEHIND_PROXY_VARIABLE, "the web interface's Apps > TensorBoard")
    tensorboard.show(tmp_path)
    said = capsys.readouterr().out
    assert "Apps > TensorBoard" in said and str(tmp_path.resolve()) in said


@pytest.mark.parametrize(("options", "named"), [
    ({"distributed": "fsdp", "channels_last": True}, "--channels-last with --distributed fsdp"),  # NotImplementedError
    ({"distributed": "fsdp", "fused_optimizer": True}, "--fused-optimizer with --distributed fsdp"),  # no DTensor rule
    ({"distributed": "dp", "activation_checkpointing": True}, "--activation-checkpointing with --distributed dp"),
])
def test_combinations_pytorch_cannot_train_are_refused_by_name(options, named):
    """Each fails deep inside PyTorch (the FSDP two on the CPU too, the DataParallel one on 2+ GPUs)."""
    with pytest.raises(ValueError, match=named):
        check_parallel_options(TrainOptions(**options), device=torch.device("cpu"))
