"""Tensor parallelism for real: a vision transformer split over two (and 2 x 2) gloo ranks on the CPU under
torchrun, trained to the same losses as one process at the same global batch (and so do DDP and FSDP); its
sharded checkpoint resumed on another layout; the combinations that cannot work refused by name. Every launch
runs to its end as from a terminal and must exit within seconds of its last line (the rule
``test_every_process_ends.py`` sets for every command: these launches are its tensor-parallel cases)."""

import pytest
import sharded_runs

from course_utils.observe import communication
from course_utils.observe.metrics import read_records
from course_utils.observe.profiling import TRACE_FILE
from course_utils.parallel.launch import torchrun_command
from course_utils.parallel.layout import Layout
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training import models
from course_utils.training.options import to_flags

pytestmark = [pytest.mark.slow, pytest.mark.distributed]
GLOBAL_BATCH = 16


def _vit_run(tiny_root, out, **extra) -> dict:
    """A short deterministic run of the tiny vision transformer (LayerNorm only: no sample depends on another)."""
    return {"size": "ci", "data_dir": tiny_root, "model": "vit_tiny", "train_samples": 128, "test_samples": 64,
            "max_steps": 4, "log_every": 1, "workers": 0, "device": "cpu", "seed": 3, "augment": False,
            "progress": False, "out": out, "batch_size": GLOBAL_BATCH, **extra}


def _ranks(count, tiny_root, out, run_to_end, code=0, **extra):
    """The run on ``count`` torchrun ranks, ended with ``code`` within seconds of its last line (its output
    shown otherwise)."""
    flags = to_flags(**_vit_run(tiny_root, out, **extra))
    ended = run_to_end(torchrun_command(count, "course_utils.train", tuple(flags), out.with_name(f"{out.name}-logs")),
                       timeout=300)
    ended.assert_ended(code)
    return ended


def _losses(out) -> list[float]:
    return [record["loss"] for record in read_records(RunFolder(out).metrics) if record["kind"] == "step"]


@pytest.fixture(scope="module")
def single(tiny_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    train(**_vit_run(tiny_root, str(out)))
    return out


def test_the_vision_transformer_has_its_sizes():
    vit = models.build("vit_small", image_size=224)
    assert vit.tokens == 196 and len(models.blocks(vit)) == 12
    assert 20e6 < models.count_parameters(vit) < 23e6  # ViT-S/16's size
    assert models.build("vit_tiny").tokens == 64  # 4 px patches of a 32 px image
    assert not models.has_batch_norm(vit)


@pytest.fixture(scope="module")
def tensor_parallel(tiny_root, tmp_path_factory, run_to_end):
    """The run on 2 tensor-parallel ranks, sharded checkpoints at steps 2 and 4: its test reads it, the test of
    resuming it under FSDP copies it."""
    out = tmp_path_factory.mktemp("tp") / "run"
    _ranks(2, tiny_root, out, run_to_end, distributed="tp", checkpoint_every=2)
    return out


@pytest.mark.oldest
def test_tensor_parallel_trains_like_one_process(single, tensor_parallel, run_summary):
    out = tensor_parallel
    assert _losses(out) == pytest.approx(_losses(single), rel=1e-5)
    summary = run_summary(out)
    assert summary["tensor_parallel_size"] == 2 and summary["global_batch_size"] == GLOBAL_BATCH
    assert summary["test_loss"] == pytest.approx(run_summary(single)["test_loss"], rel=1e-5)
    whole = summary["parameters"] * 4
    for rank in summary["per_rank"]:
        # The blocks' weights are split in two; the embedding, the head and the norms stay whole.
        assert whole / 2 < rank["step_memory_bytes"]["parameters"] < whole


def test_fsdp_over_tensor_parallel_pairs_trains_like_one_process(single, tiny_root, tmp_path, run_summary,
                                                                 run_to_end):
    out = tmp_path / "fsdp-tp"
    _ranks(4, tiny_root, out, run_to_end, distributed="fsdp-tp", tp_size=2, batch_size=GLOBAL_BATCH // 2)
    assert run_summary(out)["global_batch_size"] == GLOBAL_BATCH
    assert _losses(out) == pytest.approx(_losses(single), rel=1e-5)


@pytest.mark.oldest
def test_a_tensor_parallel_checkpoint_resumes_under_fsdp(single, tensor_parallel, tiny_root, tmp_path, run_to_end):
    """The tensor-parallel run as if stopped at its step-2 checkpoint (its step-4 one and its summary taken away)."""
    written = RunFolder(tensor_parallel).checkpoints
    assert sorted((path.name, path.is_dir()) for path in written.iterdir()) == [("step-00000002.dcp", True),
                                                                              ("step-00000004.dcp", True)]
    out = sharded_runs.unfinished_copy(tensor_parallel, tmp_path / "stopped", stopped_at=2).path
    # FSDP on two ranks of 8 images continues tensor parallelism on two ranks of 16: the same global batch.
    resumed = _ranks(2, tiny_root, out, run_to_end, distributed="fsdp", batch_size=GLOBAL_BATCH // 2, resume="auto")
    assert "resuming from" in resumed.output and "step-00000002.dcp: step 2" in resumed.output
    assert _losses(out) == pytest.approx(_losses(single), rel=1e-5)


def test_what_tensor_parallelism_cannot_split_is_refused_by_name(tiny_root, tmp_path, run_to_end):
    """Each refusal of a layout reaches the learner from every rank of a launch; their words are
    :class:`Layout`'s, every one of which the table below checks."""
    with pytest.raises(ValueError, match="--model small_cnn_gn has none: choose --model from vit_tiny"):
        train(**_vit_run(tiny_root, str(tmp_path / "cnn"), model="small_cnn_gn", distributed="tp"))
    with pytest.raises(ValueError, match="--distributed tp with 1 rank.*2 or more ranks"):
        train(**_vit_run(tiny_root, str(tmp_path / "alone"), distributed="tp"))
    with pytest.raises(ValueError, match="--tp-size splits each layer over ranks; --distributed is ddp"):
        train(**_vit_run(tiny_root, str(tmp_path / "ddp"), distributed="ddp", tp_size=2))
    # Refused from the sizes alone, before any data is read: here there is none to read.
    refused = _ranks(3, tmp_path / "no-data", tmp_path / "three", run_to_end, code=1, distributed="tp")
    assert "3 tensor-parallel ranks cannot split 4 attention heads evenly" in refused.output


@pytest.mark.parametrize("mode", ["ddp", pytest.param("fsdp", marks=pytest.mark.oldest)])
def test_the_data_parallel_modes_train_the_vision_transformer_like_one_process(mode, single, tiny_root, tmp_path,
                                                                              run_summary, run_to_end):
    """Notebook 11's comparison at the same global batch: the losses every mode reaches are the one process's
    (FSDP's with activation checkpointing too: the blocks' forward computed again gives the same numbers, and the
    launch ends within seconds as every FSDP option must). Its communication column, on a real gloo trace of the
    DDP run: DDP all-reduces each gradient once a step, so the bytes a step's collectives took are the model's
    parameters in float32, plus the few bytes the command itself exchanges (the logged loss, the agreement on a
    stop signal)."""
    out = tmp_path / mode
    extra = {"trace": tmp_path / "trace"} if mode == "ddp" else {"activation_checkpointing": True}
    _ranks(2, tiny_root, out, run_to_end, distributed=mode, batch_size=GLOBAL_BATCH // 2, **extra)
    assert _losses(out) == pytest.approx(_losses(single), rel=1e-5)
    if mode == "ddp":
        per_step = communication.collective_bytes(tmp_path / "trace" / TRACE_FILE)
        gradients = 4 * run_summary(out)["parameters"]
        assert per_step and all(0 <= step - gradients < 1024 for step in per_step), (per_step, gradients)


@pytest.mark.parametrize(("distributed", "tp_size", "ranks", "told"), [
    ("tp", 4, 2, "--distributed tp splits each layer over all 2 ranks, not --tp-size 4: drop --tp-size, or start 4 "
                 "ranks (torchrun --nproc-per-node 4, or srun with 4 tasks)"),
    ("tp", 1, 2, "--distributed tp splits each layer over all 2 ranks, not --tp-size 1: drop --tp-size"),
    ("tp", 2, 4, "not --tp-size 2: drop --tp-size, or start 2 ranks (torchrun --nproc-per-node 2, or srun with 2 "
                 "tasks), or use --distributed fsdp-tp --tp-size 2 (FSDP over the groups)"),
    ("tp", None, 1, "--distributed tp with 1 rank: it splits each layer over 2 or more ranks; start 2 ranks"),
    ("fsdp-tp", 4, 2, "--distributed fsdp-tp with 2 rank(s) and --tp-size 4: it needs 2 or more groups of 4 ranks "
                      "(8, 12, ... ranks); start 8 ranks (torchrun --nproc-per-node 8, or srun with 8 tasks), or use "
                      "--distributed none"),
    ("fsdp-tp", 4, 6, "it needs 2 or more groups of 4 ranks (8, 12, ... ranks); start 8 ranks (torchrun "
                      "--nproc-per-node 8, or srun with 8 tasks), or --tp-size 3 for these 6 ranks"),
    ("fsdp-tp", None, 2, "--distributed fsdp-tp with 2 rank(s) and --tp-size 2: it needs 2 or more groups of 2"),
    ("fsdp-tp", 1, 4, "--distributed fsdp-tp with --tp-size 1: a layer is split over 2 or more ranks"),
])
def test_a_layout_the_ranks_cannot_form_is_refused_with_the_numbers_that_fit(distributed, tp_size, ranks, told):
    with pytest.raises(ValueError) as refused:
        Layout(distributed, tp_size, ranks)
    assert told in str(refused.value)
