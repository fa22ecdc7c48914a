"""The course's experiments, shared by the notebooks and the benchmarks: where their ranks run on this machine
(:mod:`.machine_shape`), a run's named variants and how they are run and measured (:mod:`.runs`), one device
against DataParallel and DDP (:mod:`.modes`), and the numbers the benchmarks recorded on real machines
(:mod:`.reference`)."""
