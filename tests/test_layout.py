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
