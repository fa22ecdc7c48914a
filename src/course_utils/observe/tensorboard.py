"""Write a run's TensorBoard event files, read them back, and show TensorBoard where a person is watching
(notebook 01).

A run writes its events itself (:class:`EventFile`), in the training process's own thread, to a file it
created: TensorBoard's writer reopens its file by name at each flush (following a link planted in a shared run
folder meanwhile) and writes from a thread of its own, where a full disk becomes a thread's traceback that names
no file. Reading the events with TensorBoard's own ``EventAccumulator`` proves they are real and lets a
notebook show the same numbers in CI, where no TensorBoard server should be started.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from course_utils.notebook import interactive
from course_utils.shared_folders import make_folder, naming_the_file, open_file

# pandas only where a table is made: the training command's ranks import this module, and pandas would cost
# each of them 0.7 s of CPU at start-up for tables a run never makes.
if TYPE_CHECKING:
    import pandas as pd

EVENTS_PREFIX = "events.out.tfevents."


class EventFile:
    """A new TensorBoard event file in ``folder`` for scalars; ``purge_step``: a resumed run's first step, from
    which TensorBoard hides the events an earlier process wrote (the steps after its checkpoint, done again)."""

    def __init__(self, folder: Path, purge_step: int | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import SessionLog
        from tensorboard.summary.writer.record_writer import RecordWriter

        # TensorBoard reads a folder's event files in the order of their names: a later file sorts later.
        name = f"{EVENTS_PREFIX}{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{time.time_ns()}"
        self.path = make_folder(folder) / name
        self._stream = open_file(self.path, "wb")
        self._records = RecordWriter(self._stream)
        events = [{"file_version": "brain.Event:2"}]
        if purge_step is not None:  # as TensorBoard's own writer marks its purge_step
            events.append({"step": purge_step, "session_log": SessionLog(status=SessionLog.START)})
        self._write(events)

    def scalars(self, values: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._write([{"step": step, "summary": Summary(value=[Summary.Value(tag=tag, simple_value=value)])}
                     for tag, value in values.items()])

    def _write(self, events: list[dict]) -> None:
        """Write and flush ``events`` (an Event's fields each)."""
        from tensorboard.compat.proto.event_pb2 import Event

        with naming_the_file(self.path):
            for fields in events:
                self._records.write(Event(wall_time=time.time(), **fields).SerializeToString())
            self._stream.flush()

    def close(self) -> None:
        with naming_the_file(self.path):  # what a failed write left in the buffer is tried again here
            self._stream.close()


def read_scalars(logdir: Path) -> pd.DataFrame:
    """All scalars under ``logdir`` as a table: tag, step, value, wall_time."""
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    accumulator.Reload()
    rows = [
        {"tag": tag, "step": event.step, "value": event.value, "wall_time": event.wall_time}
        for tag in accumulator.Tags()["scalars"]
        for event in accumulator.Scalars(tag)
    ]
    return pd.DataFrame(rows, columns=["tag", "step", "value", "wall_time"])


PORT_VARIABLE = "COURSE_TENSORBOARD_PORT"  # another port where 6006 is taken (a shared node, the browser test)


def default_port() -> int:
    """TensorBoard's port: ``$COURSE_TENSORBOARD_PORT``, else TensorBoard's own 6006."""
    return int(os.environ.get(PORT_VARIABLE) or 6006)


def command(logdir: Path, port: int | None = None) -> str:
    """The shell command that serves ``logdir`` on localhost only."""
    return f"tensorboard --logdir {logdir} --host 127.0.0.1 --port {port or default_port()}"


BEHIND_PROXY_VARIABLE = "COURSE_TENSORBOARD_APP"  # set by jobs/lumi/jupyter_init.sh in LUMI's Jupyter app


def show(logdir: Path, port: int | None = None) -> None:
    """Start TensorBoard inside the notebook when someone is watching, else print how to start it.

    Behind a web portal's proxy (LUMI's web interface) the inline view's frame points at the
    browser's own host, where nothing answers: there the portal's TensorBoard app is the way.
    """
    if os.environ.get(BEHIND_PROXY_VARIABLE):
        print(f"Inside this web interface the inline TensorBoard stays blank (its frame points at the browser's "
              f"host). Start {os.environ[BEHIND_PROXY_VARIABLE]} with the log directory\n  {Path(logdir).resolve()}")
        return
    if not interactive():
        print(f"TensorBoard is not started here (no live notebook). To browse these runs:\n  {command(logdir, port)}")
        return
    from IPython import get_ipython

    put_this_python_on_path()
    shell = get_ipython()
    shell.extension_manager.load_extension("tensorboard")  # silent when a second run finds it loaded
    shell.run_line_magic("tensorboard", command(logdir, port).removeprefix("tensorboard "))


def put_this_python_on_path() -> str | None:
    """Put the folder of this Python, where pip put the ``tensorboard`` program, first on PATH, and
    return the program that PATH now finds. A kernel started from an environment that was never
    activated (``make lab``) lacks it, and the ``%tensorboard`` magic starts the program by name."""
    folder = str(Path(sys.executable).parent)
    if folder not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PATH")]))
    return shutil.which("tensorboard")
