"""One training run, from its options to its summary: set-up, models, the step, the loop over epochs,
evaluation, checkpoints, preemption and resume (notebooks 01-08, and every job script)."""
