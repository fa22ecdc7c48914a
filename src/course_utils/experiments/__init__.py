"""The course's experiments, shared by the notebooks and the benchmarks. How every experiment runs: where its
ranks run on this machine (:mod:`.machine_shape`), a run's named variants and the one runner (:mod:`.runs`), each
design read from the notebook cell the learner edits (:mod:`.designs`). The experiments, in the notebooks' order:
one setting timed on a fixed batch (:mod:`.fixed_batch`), 02's sweep (:mod:`.sweep`) and the monitor's cost
(:mod:`.monitor_cost`), 04's triage (:mod:`.triage`) and loaders (:mod:`.loaders`), 05's progression
(:mod:`.progression`), 06-07's one device against DataParallel and DDP (:mod:`.modes`), 08's scaling studies
(:mod:`.scaling_studies`), 09's memory ladder (:mod:`.ladder`), 10's detector runs (:mod:`.detection_runs`); and
the numbers the benchmarks recorded on real machines (:mod:`.reference`)."""
