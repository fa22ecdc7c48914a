"""Shared fixtures: a small generated CIFAR-100 and COCO-format set, quick training options, readers of a run
folder, a free port, a small or read-only file system, the cloud recipe run as two 'VMs' on this machine, the
one torchrun self-check and the one DDP and one FSDP run of the whole run (shared by pytest-xdist's workers), and
a command run to its end with the seconds it outlived its last line."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pickle
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

# PyTorch and the course's modules are imported in the fixtures that use them: pytest-xdist's controller loads this
# file too and runs no test, and their imports (7 s of CPU) would delay the start of every worker.
if TYPE_CHECKING:
    import torch

    from course_utils.parallel.launch import LaunchResult

Made = TypeVar("Made")


def _once_per_run(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Made]) -> Made:
    """``make(folder)`` run once for the whole test run: on pytest-xdist's workers the first to ask makes it in a
    folder they all see, under a lock, and the others wait and read what it made (pickled); without workers, a
    session fixture alone does that."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return make(factory.mktemp(name))
    folder = factory.getbasetemp().parent / name  # the run's temporary folder: every worker's own lies in it
    made = folder.with_suffix(".pickle")
    with open(folder.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            folder.mkdir(exist_ok=True)  # a worker before this one may have failed in it: its error comes again here
            result = make(folder)
            made.with_suffix(".partial").write_bytes(pickle.dumps(result))
            made.with_suffix(".partial").rename(made)
        return pickle.loads(made.read_bytes())


def _tiny_cifar100(folder: Path) -> Path:
    from course_utils.data.generated_cifar100 import generate

    generate(folder, train=600, test=200, seed=0)
    return folder


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CIFAR-100 (600 train / 200 test images) shared by the whole run; do not modify."""
    return _once_per_run(tmp_path_factory, "tiny", _tiny_cifar100)


@pytest.fixture(scope="session")
def tiny_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ci size's tiny COCO-format set (its default size and seed) shared by the whole run; do not modify."""
    from course_utils.data import generated_coco

    return _once_per_run(tmp_path_factory, "tiny-coco", lambda folder: generated_coco.generate(folder / "coco"))


@pytest.fixture
def quick(tiny_root: Path, tmp_path: Path) -> dict:
    """Options for a training run of a few seconds on the CPU."""
    return dict(size="ci", data_dir=str(tiny_root), train_samples=256, test_samples=128, epochs=2,
                batch_size=32, workers=0, log_every=2, out=str(tmp_path / "run"), progress=False, device="cpu")


@pytest.fixture
def free_port() -> int:
    """A TCP port nobody listens on right now, for a rendezvous the test sets up itself."""
    from course_utils.parallel import process_group

    return process_group.free_port()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """A real file system of a chosen size (tmpfs), read-only on request, with room for at most ``inodes`` files and
    folders on request (a quota of files, as on LUMI's Lustre, ends in the same ENOSPC); calling it again remounts it
    with the new size and mode, its files kept. Needs the right to mount, as CI has."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()

    def mount(size_bytes: int, read_only: bool = False, inodes: int | None = None) -> Path:
        options = f"size={size_bytes // 1024 + 1}k,{'ro' if read_only else 'rw'}"
        if inodes is not None:
            options += f",nr_inodes={inodes}"
        if mount_point.is_mount():
            options = f"remount,{options}"
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        return mount_point

    yield mount
    subprocess.run(["umount", str(mount_point)], capture_output=True)


@pytest.fixture
def two_cloud_nodes(tmp_path: Path, free_port: int) -> Callable[[list[str]], dict[str, Any]]:
    """``two_cloud_nodes(args)``: ``jobs/cloud/run_node.sh ARGS --out OUT`` started twice, as two VMs with one process
    each that meet through c10d on this machine; returns the run's summary after both ended well."""
    from course_utils.lessons import cloud_vms

    return lambda args: cloud_vms.local_vms(2, tmp_path / "run", "--size", "ci", *args, port=free_port, timeout=300)


def _weights(out: Path | str) -> dict[str, torch.Tensor]:
    from course_utils.run_folder import RunFolder
    from course_utils.training import checkpoint

    return checkpoint.load(RunFolder(out).last_checkpoint)["model"]


def _summary(out: Path | str) -> dict[str, Any]:
    from course_utils.run_folder import RunFolder

    return RunFolder(out).read_summary()


@pytest.fixture(scope="session")
def run_weights() -> Callable[[Path | str], dict[str, torch.Tensor]]:
    """``run_weights(out)``: the model weights in the last checkpoint of the run whose ``--out`` is ``out``."""
    return _weights


@pytest.fixture(scope="session")
def run_summary() -> Callable[[Path | str], dict[str, Any]]:
    """``run_summary(out)``: the ``summary.json`` of the finished run whose ``--out`` is ``out``."""
    return _summary


def _launched_fsdp_run(tiny_root: Path, folder: Path) -> tuple[LaunchResult, Path]:
    import sharded_runs

    out = folder / "run"
    return sharded_runs.launched(2, tiny_root, out, distributed="fsdp", checkpoint_every=2), out


@pytest.fixture(scope="session")
def fsdp_run(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[LaunchResult, Path]:
    """The sharding tests' run (``tests/sharded_runs.py``) with FSDP on 2 gloo ranks, 4 steps, sharded checkpoints
    at steps 2 and 4: launched once for the run; read it, or copy it before changing it."""
    result, out = _once_per_run(tmp_path_factory, "fsdp", lambda folder: _launched_fsdp_run(tiny_root, folder))
    assert result.ok, "\n".join(result.lines[-30:])
    return result, out


@pytest.fixture(scope="session")
def ddp_run(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[LaunchResult, Path]:
    """The same run as ``fsdp_run`` with DDP on 2 gloo ranks, 4 steps: what FSDP must train like, what one process
    with the doubled batch must equal, and whose ranks' memory the forecast must predict; launched once for the run."""
    import sharded_runs

    def launched(folder: Path) -> tuple[LaunchResult, Path]:
        return sharded_runs.launched(2, tiny_root, folder / "run", distributed="ddp"), folder / "run"

    result, out = _once_per_run(tmp_path_factory, "ddp", launched)
    assert result.ok, "\n".join(result.lines[-30:])
    return result, out


@pytest.fixture(scope="session")
def fsdp_resumed_past_damage(fsdp_run, tiny_root: Path,
                             tmp_path_factory: pytest.TempPathFactory) -> tuple[LaunchResult, Path, Path]:
    """A copy of ``fsdp_run`` whose checkpoints after step 2 are each damaged in a way of its own, resumed once
    for the run (``sharded_runs.resumed_past_damage``): each test of a damage reads its own line of the one
    launch. What the launch gave, its run folder, and the file the forged metadata would write if it ran."""
    import sharded_runs

    return _once_per_run(tmp_path_factory, "fsdp-damaged",
                         lambda folder: sharded_runs.resumed_past_damage(tiny_root, fsdp_run[1], folder))


@dataclass(frozen=True)
class SelfCheck:
    """What one torchrun of the process group's self-check gave: its result and what it streamed."""

    result: LaunchResult
    streamed: str  # what launch printed while the ranks ran, as a notebook cell shows it
    left_behind: list[str]  # torchrun's log folders the launch left in the temporary folder


def _self_check(folder: Path) -> SelfCheck:
    from course_utils.parallel.launch import launch

    streamed = io.StringIO()
    temporary = Path(tempfile.gettempdir())  # this worker's own: no other launch runs in it meanwhile
    before = set(temporary.glob("torchrun-*"))
    with contextlib.redirect_stdout(streamed):  # launch prints from a thread, to whatever sys.stdout is then
        # No log folder, as a notebook cell launches: the launch's own, which it removes.
        result = launch(2, "course_utils.parallel.process_group", timeout_seconds=180)
    return SelfCheck(result, streamed.getvalue(), sorted(map(str, set(temporary.glob("torchrun-*")) - before)))


@pytest.fixture(scope="session")
def torchrun_self_check(tmp_path_factory: pytest.TempPathFactory) -> SelfCheck:
    """``torchrun --standalone --nproc-per-node 2 -m course_utils.parallel.process_group`` (two gloo ranks),
    run once for the run: the tests of the process group and of ``launch`` both read it, and starting
    torchrun costs seconds."""
    return _once_per_run(tmp_path_factory, "self-check", _self_check)


# Python's exit handlers and torchrun's agent take a second or two after the last line, on a busy machine a few
# more; a process held open by a thread nobody stops never exits.
LAST_LINE_TO_EXIT_SECONDS = 20.0


@dataclass(frozen=True)
class Ended:
    """A process run to its end: its code, its output, and how long it lived after its last line."""

    code: int
    output: str
    seconds_after_last_line: float

    def assert_ended(self, code: int) -> None:
        """It exited with ``code``, within :data:`LAST_LINE_TO_EXIT_SECONDS` of its last line."""
        assert self.code == code, f"exit {self.code}, not {code}:\n{self.output[-3000:]}"
        assert self.seconds_after_last_line < LAST_LINE_TO_EXIT_SECONDS, \
            f"alive {self.seconds_after_last_line:.1f} s after its last line:\n{self.output[-3000:]}"


def _run_to_end(command: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> Ended:
    """Run ``command`` in a session of its own, reading its output as it comes; a process still alive after
    ``timeout`` is ended with its whole session and reported as such."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    lines: list[bytes] = []
    last_line = [time.monotonic()]

    def read() -> None:
        for line in iter(process.stdout.readline, b""):
            lines.append(line)
            last_line[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        output = b"".join(lines).decode(errors="replace")
        pytest.fail(f"still alive {time.monotonic() - last_line[0]:.0f} s after its last line, ended after "
                    f"{timeout:g} s: {' '.join(command)}\n{output[-3000:]}")
    ended = time.monotonic()
    reader.join(timeout=10)
    return Ended(code, b"".join(lines).decode(errors="replace"), ended - last_line[0])


@pytest.fixture(scope="session")
def run_to_end() -> Callable[..., Ended]:
    """``run_to_end(command, env=None, timeout=600)``: the command run as a real process to its end, its output read
    as it comes; an :class:`Ended` with its code, output and the seconds it lived after its last line."""
    return _run_to_end
