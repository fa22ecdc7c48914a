"""Notebooks 08, 10 and 12: what went wrong with a run, read from outside it, and the doctor that says it.

``python -m course_utils.doctor`` (:mod:`.examination`) beside a stuck or slow job looks, reads, decides and says;
its parts, in that order, are the notebooks' tools too:

- look: where each rank stands (:mod:`.hangs`: py-spy's stacks, the Flight Recorder, the process group's
  timeout); how each rank spends its steps (:mod:`.timed_ranks`) and which one the others wait for
  (:mod:`.stragglers`);
- read: the communication library's log, for a known failure (:mod:`.comm_failures`) and for the transport it
  chose (:mod:`.transport`); the interconnect's benchmarks (:mod:`.allreduce`) against a site's minimums
  (:mod:`.interconnect_health`);
- decide and say: :mod:`.examination`, which puts the looks and the readings together and says what to try next.

Nothing here changes a run: it only reads. Starting the doctor imports no PyTorch (this package imports nothing),
so that it answers in a moment on a node whose job is stuck.
"""
