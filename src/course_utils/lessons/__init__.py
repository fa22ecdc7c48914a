"""The notebooks' own material, one module per lesson: the studies it measures, its figures and the prose of
its answer cells, built on the training command and the floors below it; each module's first line names the
notebooks that import it."""
