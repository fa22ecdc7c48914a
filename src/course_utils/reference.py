"""Numbers measured on real machines, recorded under ``benchmarks/results/``, for comparison.

Each result file is JSON with at least ``benchmark``, ``device``, ``date``, ``versions`` and
``rows`` (a list of flat records). A learner on a laptop sees what a GPU did with the same code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from course_utils.config import checkout_root


def results_dir() -> Path:
    return checkout_root() / "benchmarks" / "results"


def table(benchmark: str) -> pd.DataFrame:
    """All recorded rows of ``benchmark``, one per row, with device, size and date columns."""
    rows = []
    for path in sorted(results_dir().glob("*.json")):
        result = json.loads(path.read_text())
        if result.get("benchmark") != benchmark:
            continue
        for row in result["rows"]:
            rows.append({"device": result["device"], "date": result["date"],
                         "torch": result["versions"].get("torch", ""), **row})
    return pd.DataFrame(rows)
