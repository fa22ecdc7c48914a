"""FSDP shards on the devices the run trains on (notebook 09's one-GPU shape: CPU ranks on a GPU machine)."""

import torch
import torch.distributed as dist
from torch import nn

from course_utils.parallel import sharding


def test_cpu_ranks_shard_on_the_cpu_where_the_machine_reports_a_gpu(monkeypatch, tmp_path):
    # What a one-GPU machine looks like to the second of two CPU ranks: an accelerator there, LOCAL_RANK 1.
    # fully_shard's own mesh would follow the accelerator and claim GPU 1 ("invalid device ordinal" on an H100).
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        sharding.shard(model, list(model), None, False, torch.device("cpu"))
        assert {parameter.device_mesh.device_type for parameter in model.parameters()} == {"cpu"}
        model(torch.ones(3, 4)).sum().backward()
        assert all(parameter.grad is not None for parameter in model.parameters())
    finally:
        dist.destroy_process_group()
