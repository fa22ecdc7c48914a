"""Shared code of the Deep Learning at Scale course, used by every notebook (00-08), job script and benchmark.

They all call this package, so that what a learner reads in a notebook is exactly what runs on a
cluster. Its parts, from the lowest floor up (a part imports only its own floor and those below):

- ``config``, ``devices``, ``notebook``, ``run_folder``: the course size, the accelerator, the front-end,
  and the names of a run's files;
- ``data``: where the images come from, and the loaders that feed them to the model;
- ``observe``: what a run measures and writes: clocks, metrics, TensorBoard, the profiler, the device monitor;
- ``parallel``: more than one process: the process group, DataParallel and DDP, torchrun, Slurm, all-reduce;
- ``training``: one training run: options, set-up, step, loop, checkpoints, preemption and resume;
- ``train``: the one training command, ``python -m course_utils.train``;
- ``lessons``: the notebooks' studies, figures and answer cells.
"""

__version__ = "0.1.0"
