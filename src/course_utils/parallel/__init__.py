"""Notebooks 06-11, and every run: spreading a run over processes and starting them: the layout of a run
(:mod:`.layout`), the process group, the wrappers (DataParallel, DDP, FSDP, tensor parallelism), values reduced
over the ranks, and launching: torchrun from a notebook cell, its processes, Slurm jobs. What went wrong with a
launched run is read by :mod:`course_utils.doctor`."""
