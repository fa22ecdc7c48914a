"""How a run is spread over its processes, decided once from ``--distributed``, ``--tp-size`` and the number
of ranks (notebooks 06-11).

Every value of ``--distributed`` is a row of :data:`MODES`, which says in a few facts what it does (one
process per device or not, parameters sharded by FSDP, layers split by tensor parallelism). A run's
:class:`Layout` adds its ranks: it is checked once, when it is made, and then the set-up, resume, the
summary, checkpoints and the lessons read its answers (data-parallel ranks, tensor-parallel degree, sharded
or not, the device mesh) instead of decoding the string again. torchtitan's ``ParallelDims`` is the model.

A new mode is a row here and the lines that distribute the model that way (``_distribute`` in
:mod:`course_utils.training.setup`): every other list of modes (the command's choices, the wrappers, the modes
notebooks 06, 07 and 11 compare, the memory forecast) is derived from the rows' facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MESH_DIMS = ("data", "tensor")


@dataclass(frozen=True)
class Mode:
    """One value of ``--distributed``: its help text and the facts every part of a run reads."""

    help: str
    one_process_per_device: bool = False  # started by torchrun or srun, one rank per device
    all_gpus_in_one_process: bool = False  # nn.DataParallel: one process drives every visible GPU
    fsdp: bool = False  # FSDP shards parameters, gradients and optimizer state over the data-parallel ranks
    splits_layers: bool = False  # tensor parallel: a group of ranks splits each layer and reads the same images

    @property
    def sharded(self) -> bool:
        """Each rank holds part of the model (DTensors): its checkpoints are folders of shards."""
        return self.fsdp or self.splits_layers

    @property
    def ddp(self) -> bool:
        """Each rank holds the whole model and DistributedDataParallel averages the gradients."""
        return self.one_process_per_device and not self.sharded

    @property
    def two_dimensional(self) -> bool:
        """FSDP over groups of ranks that each split the layers: a 2-D mesh, 2 or more groups of 2 or more."""
        return self.fsdp and self.splits_layers

    @property
    def fsdp_over_all_ranks(self) -> bool:
        """FSDP alone, sharding over every rank (with tensor parallelism it shards over the mesh's rows)."""
        return self.fsdp and not self.splits_layers


MODES = {
    "none": Mode("one device"),
    "dp": Mode("nn.DataParallel over the visible GPUs in this process", all_gpus_in_one_process=True),
    "ddp": Mode("DistributedDataParallel, one process per device (start it with torchrun or srun; alone it makes "
                "a group of one)", one_process_per_device=True),
    "fsdp": Mode("FSDP2, one process per device, each holding a shard of the model (2+ processes)",
                 one_process_per_device=True, fsdp=True),
    "tp": Mode("tensor parallel, each layer of a vision transformer split over all processes",
               one_process_per_device=True, splits_layers=True),
    "fsdp-tp": Mode("FSDP over groups of --tp-size processes that split each layer (a 2-D mesh)",
                    one_process_per_device=True, fsdp=True, splits_layers=True),
}
MODES_HELP = "; ".join(f"{name}: {mode.help}" for name, mode in MODES.items())  # --distributed's help text


def mode_of(distributed: str) -> Mode:
    """The facts of ``--distributed distributed``; an unknown name is refused with the choices."""
    if distributed not in MODES:
        raise ValueError(f"unknown --distributed mode {distributed!r}; choose one of: {', '.join(MODES)}")
    return MODES[distributed]


@dataclass(frozen=True)
class Layout:
    """How a run's ``world_size`` ranks are spread: checked when made, read by every part of the run."""

    distributed: str
    tp_size: int | None  # --tp-size as given: None takes the mode's default
    world_size: int

    def __post_init__(self) -> None:
        """Refuse a layout the ranks at hand cannot form, naming the numbers that fit."""
        facts = mode_of(self.distributed)
        if facts.fsdp_over_all_ranks and self.world_size < 2:
            raise ValueError("--distributed fsdp shards the model over 2 or more ranks and this process is alone: "
                             "start it with torchrun --nproc-per-node 2 (or srun with 2+ tasks), or use "
                             "--distributed none")
        if self.tp_size is not None and not facts.splits_layers:
            raise ValueError(f"--tp-size splits each layer over ranks; --distributed is {self.distributed}: drop "
                             "--tp-size, or use --distributed tp or fsdp-tp")
        if facts.two_dimensional:
            _check_fsdp_tp(self.tensor_parallel, self.world_size)
        elif facts.splits_layers:
            _check_tp(self.tp_size, self.world_size)

    @property
    def mode(self) -> Mode:
        return MODES[self.distributed]

    @property
    def tensor_parallel(self) -> int:
        """Ranks that split each layer and read the same images: all of them for ``tp``, ``--tp-size``
        (default 2) for ``fsdp-tp``, none (1) in the other modes."""
        if not self.mode.splits_layers:
            return 1
        return self.tp_size or (2 if self.mode.fsdp else self.world_size)

    @property
    def data_ranks(self) -> int:
        """Ranks that each train on their own share of the batch (tensor-parallel ranks share theirs)."""
        return self.world_size // self.tensor_parallel

    @property
    def sharded(self) -> bool:
        """Each rank holds part of the model: every rank writes its shards of a checkpoint."""
        return self.mode.sharded

    def mesh(self, device_type: str) -> DeviceMesh:
        """The process group's ranks as a ``data`` x ``tensor`` grid: rank r is row r // tensor_parallel,
        column r % tensor_parallel."""
        return init_device_mesh(device_type, (self.data_ranks, self.tensor_parallel), mesh_dim_names=MESH_DIMS)


def _start(ranks: int) -> str:
    return f"start {ranks} ranks (torchrun --nproc-per-node {ranks}, or srun with {ranks} tasks)"


def _check_tp(tp_size: int | None, world_size: int) -> None:
    """``--distributed tp`` splits each layer over every rank: 2 or more, and no other --tp-size."""
    if world_size < 2:
        raise ValueError(f"--distributed tp with 1 rank: it splits each layer over 2 or more ranks; {_start(2)}, or "
                         "use --distributed none")
    if tp_size in (None, world_size):
        return
    # tp has no data dimension: smaller groups would each train a model of their own, never averaged
    fixes = ["drop --tp-size"]
    if tp_size >= 2:
        fixes.append(_start(tp_size))
        if world_size % tp_size == 0:
            fixes.append(f"use --distributed fsdp-tp --tp-size {tp_size} (FSDP over the groups)")
    raise ValueError(f"--distributed tp splits each layer over all {world_size} ranks, not --tp-size {tp_size}: "
                     f"{', or '.join(fixes)}")


def _check_fsdp_tp(tp: int, world_size: int) -> None:
    """``--distributed fsdp-tp`` needs groups of 2 or more ranks (--tp-size), and 2 or more such groups."""
    if tp < 2:
        raise ValueError(f"--distributed fsdp-tp with --tp-size {tp}: a layer is split over 2 or more ranks; use "
                         "--tp-size 2 or more, or --distributed fsdp")
    if world_size % tp == 0 and world_size // tp >= 2:
        return
    fitting = [size for size in range(2, world_size // 2 + 1) if world_size % size == 0]
    other = f", or --tp-size {fitting[-1]} for these {world_size} ranks" if fitting else ""
    raise ValueError(f"--distributed fsdp-tp with {world_size} rank(s) and --tp-size {tp}: it needs 2 or more groups "
                     f"of {tp} ranks ({2 * tp}, {3 * tp}, ... ranks); {_start(2 * tp)}{other}, or use "
                     "--distributed none")
