"""No notebook imports this room as a lesson: the course's own tooling beside its lessons. The machinery of the
exercises' checks (:mod:`.exercises`: the verdict a check cell prints, the judging of a launched script's record),
the diagrams drawn by code into img/ (:mod:`.diagrams`), and how long each notebook takes, measured
(:mod:`.notebook_times`) and written into the README, the guide and every notebook's Time line
(:mod:`.time_lines`)."""
