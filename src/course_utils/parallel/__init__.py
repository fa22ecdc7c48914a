"""More than one process: the process group, DataParallel and DDP, values reduced over the ranks, torchrun
from a notebook cell, Slurm jobs and all-reduce bandwidth (notebooks 06-08, and every run)."""
