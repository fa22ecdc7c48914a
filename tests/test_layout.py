"""How a run is spread, decided once: each mode's data-parallel ranks, tensor-parallel degree and sharding, the
--distributed choices and help made from the same table, a mistyped mode named with the choices."""

import pytest

from course_utils.parallel.layout import MODES, Layout
from course_utils.train import train
from course_utils.training.options import build_parser


@pytest.mark.parametrize(("distributed", "tp_size", "ranks", "tensor_parallel", "data_ranks", "sharded"), [
    ("none", None, 1, 1, 1, False),
    ("dp", None, 1, 1, 1, False),
    ("ddp", None, 3, 1, 3, False),
    ("fsdp", None, 4, 1, 4, True),
    ("tp", None, 4, 4, 1, True),  # every rank splits each layer: no data dimension
    ("fsdp-tp", None, 4, 2, 2, True),  # groups of 2 by default
    ("fsdp-tp", 3, 6, 3, 2, True),
])
def test_the_layout_answers_what_every_part_of_a_run_reads(distributed, tp_size, ranks, tensor_parallel, data_ranks,
                                                            sharded):
    layout = Layout(distributed, tp_size, ranks)
    assert (layout.tensor_parallel, layout.data_ranks, layout.sharded) == (tensor_parallel, data_ranks, sharded)


def test_the_command_line_offers_every_mode_with_its_help():
    flag = next(action for action in build_parser()._actions if action.dest == "distributed")
    assert tuple(flag.choices) == tuple(MODES)
    assert all(f"{name}: {mode.help}" in flag.help for name, mode in MODES.items())


def test_a_mistyped_mode_is_named_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match="unknown --distributed mode 'DDP'; choose one of: none, dp, ddp, fsdp, tp"):
        train(size="ci", model="resnet18", distributed="DDP", out=tmp_path)


def test_a_new_mode_is_a_row_of_the_table_and_every_list_of_modes_knows_it(monkeypatch, tmp_path, tiny_root):
    """A contributor adds a mode as a row of MODES (and, if it distributes the model a new way, its lines in
    training.setup._distribute): the wrappers, the modes notebooks 06 and 07 compare, the parallelisms notebook 11
    compares and the memory forecast all read the row's facts, so none misses it (the command's choices are the
    table's names, read when the options are first imported: the test above)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from course_utils import config
    from course_utils.experiments.machine_shape import parallel_shape
    from course_utils.experiments.modes import whole_model_modes
    from course_utils.lessons import memory_forecast, model_parallel
    from course_utils.parallel import wrappers
    from course_utils.parallel.layout import Mode

    monkeypatch.setitem(MODES, "ddp-new", Mode("a new data-parallel mode", one_process_per_device=True))
    monkeypatch.setitem(MODES, "dp-new", Mode("a new one-process mode", all_gpus_in_one_process=True))
    monkeypatch.setitem(MODES, "fsdp-new", Mode("a new sharded mode", one_process_per_device=True, fsdp=True))
    assert {"ddp-new", "dp-new"} <= set(whole_model_modes()) and "fsdp-new" not in whole_model_modes()

    assert isinstance(wrappers.wrap(nn.Linear(2, 2), "dp-new", torch.device("cpu")), wrappers.NamedDataParallel)
    with pytest.raises(ValueError, match="--distributed fsdp-new splits it"):
        wrappers.wrap(nn.Linear(2, 2), "fsdp-new", torch.device("cpu"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        wrapped = wrappers.wrap(nn.Linear(2, 2), "ddp-new", torch.device("cpu"))
        assert isinstance(wrapped, nn.parallel.DistributedDataParallel)
    finally:
        dist.destroy_process_group()

    plan = model_parallel.parallelism_plan(parallel_shape(0), config.get_size("ci"))
    ranks = {run.name: run.options["ranks"] for run in plan.runs}
    assert ranks["ddp-new"] == 2 and ranks["fsdp-new"] == 2 and "dp-new" not in ranks

    from course_utils.experiments.modes import compare_modes
    from course_utils.experiments.runs import Variant

    # The comparison of 06 and 07 trains the new one-process mode as itself (a process-per-device mode would start
    # torchrun, whose ranks import the table without the test's rows: that path is the launch tests').
    trained = compare_modes([Variant("the new one", distributed="dp-new")], steps=2, out=tmp_path, size="ci",
                            data_dir=str(tiny_root), batch_size=8, device="cpu")
    assert list(trained["distributed"]) == ["dp-new"] and trained["images_per_second"].iloc[0] > 0

    run = dict(model="small_cnn", batch_size=8, image_size=32)
    assert (memory_forecast.predict_step(ranks=2, distributed="ddp-new", **run)
            == memory_forecast.predict_step(ranks=2, distributed="ddp", **run))
    assert (memory_forecast.predict_step(ranks=2, distributed="fsdp-new", **run)
            == memory_forecast.predict_step(ranks=2, distributed="fsdp", **run))
