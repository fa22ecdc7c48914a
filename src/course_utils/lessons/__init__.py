"""The notebooks' own material: the studies each lesson measures, its figures and the prose of its answer
cells, built on the training command and the floors below it (notebooks 00-08)."""
