"""Job scripts must be valid bash and call the course's entry point with flags it knows."""

import re
import subprocess
from pathlib import Path

import pytest

from course_utils.config import checkout_root
from course_utils.train import build_parser

SCRIPTS = sorted((checkout_root() / "jobs").rglob("*.sbatch"))
KNOWN_FLAGS = {flag for action in build_parser()._actions for flag in action.option_strings}


def _train_flags(script: Path) -> list[str]:
    """The --flags given to `python -m course_utils.train`, following line continuations."""
    text = script.read_text().replace("\\\n", " ")
    commands = [line.split("course_utils.train", 1)[1] for line in text.splitlines() if "course_utils.train" in line]
    return [flag for command in commands for flag in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", command)]


def test_there_are_job_scripts():
    assert SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(checkout_root())))
def test_job_script(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    flags = _train_flags(script)
    assert flags, "the script must call python -m course_utils.train"
    assert set(flags) <= KNOWN_FLAGS, f"unknown flags: {set(flags) - KNOWN_FLAGS}"
