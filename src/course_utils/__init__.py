"""Shared code of the Deep Learning at Scale course.

Notebooks, job scripts and benchmarks all call this package, so that what a learner reads in a
notebook is exactly what runs on a cluster.
"""

__version__ = "0.1.0"
