"""What a DataLoader worker does with the signals that stop a run (every run with loader workers, notebooks 01-12):
it leaves them to its training process. Apart from the loaders, and without PyTorch, so that a script that only
needs this (a rank of the suite's hanging ranks) does not import torchvision's models with the loaders."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading


def leave_stop_signals_to_the_trainer(worker_id: int) -> None:
    """Ctrl-C reaches every process of the terminal, and Slurm's scancel, time limit and preemption signal
    (SIGTERM, or SIGUSR1 with ``--signal``) every process of the job. A worker that died of one would take the
    batches the training process needs to reach its checkpoint (PyTorch then ends the trainer with "DataLoader
    worker is killed by signal"), so the workers leave them to the trainer. A SIGTERM from the trainer itself
    (the loader ending its workers) still ends a worker at once, as PyTorch's own handler does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):  # macOS, Windows: who sent a SIGTERM cannot be read, PyTorch's rule stays
        return
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    # Blocked here, before the worker starts any thread, so that every thread inherits the block and SIGTERM
    # waits for the one thread below, which reads who sent it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_end_when_the_trainer_asks, args=(multiprocessing.parent_process().pid,), daemon=True,
                     name="sigterm-from-trainer").start()


def _end_when_the_trainer_asks(trainer: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == trainer:
            os._exit(0)
